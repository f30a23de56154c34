"""What every `forge-*` verb does with errors, in one place.

Bad input is the user's to fix: one line on stderr naming the verb, exit
status 2, no traceback. Ctrl-C exits 130 quietly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_verb(prog: str, action: Callable[[], int], errors: tuple[type[BaseException], ...],
             describe: Callable[[BaseException], str] = str) -> int:
    """Run `action`; an exception in `errors` becomes `prog: <describe(e)>` and exit 2."""
    try:
        return action()
    except errors as e:
        print(f"{prog}: {describe(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
