"""`forge-train`: Launch veRL SFT or online RL on recorded data."""

from __future__ import annotations

from forgerl.pending import pending_main


def main(argv: list[str] | None = None) -> int:
    return pending_main("forge-train", "Launch veRL SFT or online RL on recorded data", argv)
