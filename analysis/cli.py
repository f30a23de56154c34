"""`forge-analyze`: Measure harness behaviour over a recorded dataset with DuckDB."""

from __future__ import annotations

from forgerl.pending import pending_main


def main(argv: list[str] | None = None) -> int:
    return pending_main("forge-analyze", "Measure harness behaviour over a recorded dataset with DuckDB", argv)
