"""Dataset bytes per step of a screenshot-resending GUI session, against the raw request bytes.

    .venv/bin/python bench/screenshots.py              # 30 steps, 1280x800 screenshots
    .venv/bin/python bench/screenshots.py --steps 10   # shorter

A GUI harness (Claude Code + Playwright MCP's shape: a fresh screenshot in every tool result) resends
every earlier screenshot in every call, so the request bytes grow with the square of the steps. The
session runs through the real `forge-record serve` (the tests' scripted upstream issues the browser
actions, the anthropic SDK sends), once per `--images` mode; the dataset's bytes are every file under
its root (Parquet tables and manifest). Target: the dataset grows with the screenshots, not with the
requests (each image stored once per session, raw requests referencing it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the GUI sessions the tests record
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))  # the scripted upstream


def record(root: Path, steps: int, size: tuple[int, int], mode: str) -> int:
    """Record one session; returns the request bytes the SDK sent."""
    from conftest import RecorderProcess, session_calls
    from gui_sessions import drive_anthropic, gui_script
    from scripted_upstream import ScriptedUpstream

    with ScriptedUpstream(gui_script(steps)) as up:
        rec = RecorderProcess(root, up.url, "--images", mode).start()
        try:
            sent = drive_anthropic(rec.base("gui"), steps, size, listing=True)
            session_calls(root, "gui", steps, timeout=60)
        finally:
            rec.stop()
    return sent


def dataset_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--size", default="1280x800", help="screenshot WIDTHxHEIGHT")
    args = p.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    from gui_sessions import screenshot

    from forgerl import printer
    from forgerl.schema.maintenance import compact

    png = sum(len(screenshot(step, size, listing=True)) for step in range(args.steps))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-screenshots-") as tmp:
        for mode in ("keep", "hash-only", "drop"):
            root = Path(tmp) / mode
            sent = record(root, args.steps, size, mode)
            compact(root)  # one file per table: what a dataset settles to, not how many flushes it took
            rows.append((mode, sent, dataset_bytes(root)))
    print()
    printer.show(printer.table(
        ["--images", "request KiB/step", "dataset KiB/step", "dataset / requests"],
        [(mode, f"{sent / args.steps / 1024:.1f}", f"{stored / args.steps / 1024:.1f}", f"{stored / sent:.3f}")
         for mode, sent, stored in rows],
        title=f"screenshot session: {args.steps} steps, {size[0]}x{size[1]} PNG screenshots "
              f"({png / args.steps / 1024:.0f} KiB each on average), every call resending all earlier ones",
        style=printer.MARKDOWN))
    print(f"\nscreenshots alone: {png / args.steps / 1024:.1f} KiB/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
