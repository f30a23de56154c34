"""Entry point for verbs whose implementation has not landed yet.

They exist so that `--help` works and scripts can probe for them; running
one says so plainly and exits non-zero rather than pretending to work.
"""

from __future__ import annotations

import argparse
import sys


def pending_main(prog: str, description: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=f"{description} (not yet available)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="reserved")
    parser.parse_args(argv)
    print(f"{prog}: not yet available in forgerl {__import__('forgerl').__version__}", file=sys.stderr)
    return 2
