"""How bad input and bugs look to a user of any `forge-*` verb, checked the same way for every verb."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def verb(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The console script `name` (from PATH, else beside this Python) run as a user runs it."""
    script = shutil.which(name) or str(Path(sys.executable).with_name(name))
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_refused(result: subprocess.CompletedProcess, message: str) -> None:
    """Bad input: exit status 2 and one line on stderr that says what is wrong, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def assert_bug(code: int, stderr: str, error: str) -> None:
    """A bug: exit status 1, the traceback with the error, and a last line saying it is a bug."""
    assert code == 1, stderr
    assert "Traceback (most recent call last)" in stderr and error in stderr, stderr
    assert "this is a bug in forgerl" in stderr.strip().splitlines()[-1], stderr
