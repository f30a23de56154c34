"""`forge-run`: Run tasks x attempts with a harness in local sandboxes or Kubernetes pods."""

from __future__ import annotations

from forgerl.pending import pending_main


def main(argv: list[str] | None = None) -> int:
    return pending_main("forge-run", "Run tasks x attempts with a harness in local sandboxes or Kubernetes pods", argv)
