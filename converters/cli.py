"""`forge-convert`: Turn a recorded dataset into veRL SFT, RL and token-level training shards."""

from __future__ import annotations

from forgerl.pending import pending_main


def main(argv: list[str] | None = None) -> int:
    return pending_main("forge-convert", "Turn a recorded dataset into veRL SFT, RL and token-level training shards", argv)
