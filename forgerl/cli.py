"""What every `forge-*` verb does with errors, in one place.

A `UserError` (bad input: a missing file, a wrong flag, not a dataset) is
the user's to fix: one line on stderr naming the verb, exit status 2, no
traceback. Anything else is a bug in forgerl: the traceback, a line saying
so, exit status 1. Ctrl-C exits 130 quietly.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from .errors import UserError


def run_verb(prog: str, action: Callable[[], int]) -> int:
    """Run `action` and turn what it raises into the exit statuses above."""
    try:
        return action()
    except UserError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        print(f"{prog}: this is a bug in forgerl, not in your input; please report it with the traceback above",
              file=sys.stderr)
        return 1
