"""`UserError`: the one type for input a user must fix, as opposed to a bug.

Every `forge-*` verb's wrapper (`forgerl.cli.run_verb`) shows a `UserError`
as one line and exits 2; anything else is a bug and gets a traceback. It
lives here, in the top package, importing nothing of forgerl, so every layer
can raise it, `schema` (the lowest, which imports nothing else of forgerl)
included. Bad input also leaves no output behind: `removed_on_user_error`.

Its subclasses derive from nothing else (not `ValueError`): an `except` for
what a library raises on bad text (`json.JSONDecodeError`, `int()`) must not
swallow them, and a bug's `ValueError` must never pass for bad input.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class UserError(Exception):
    """Bad input or setup the user must fix; the message says what, in one line."""


@contextmanager
def removed_on_user_error(folder: Path) -> Iterator[None]:
    """A folder that did not exist before the block is removed again if the block raises a `UserError`."""
    created = not folder.exists()
    try:
        yield
    except UserError:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise
