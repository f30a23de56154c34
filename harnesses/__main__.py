"""`python -m forgerl.harnesses pins [npm|pypi|cargo]`: the pinned installs, one a line; `... table`: the
README's harness table (markdown)."""

from __future__ import annotations

import sys

from . import pins, readme_table


def main(args: list[str]) -> int:
    if args[:1] == ["pins"] and len(args) <= 2:
        for pin in pins(args[1] if len(args) == 2 else None):
            print(pin)
        return 0
    if args == ["table"]:
        print(readme_table())
        return 0
    print("usage: python -m forgerl.harnesses pins [npm|pypi|cargo] | table", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
