"""Task kinds beyond the built-in formats: one module per benchmark layout.

Each kind module exports

* `matches(path: Path) -> bool`: is this file or folder of my kind;
* `load(path: Path) -> list[Task]`: its tasks (subclasses of `tasks.Task`
  that carry the kind's own data and override `Task.score`, where the
  benchmark passes at another score `Task.pass_threshold`, and, where a
  recorded answer cannot be re-graded from the recording and a fresh
  workspace, `Task.offline_ungradable`: why not, for `trainer/reward.py`).

`tasks.load_tasks` asks each kind in `KINDS` in turn before the built-in
QwenClawBench / TOML formats; the first that matches loads the path.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from . import claweval, harbor, web

KINDS: tuple[ModuleType, ...] = (claweval, harbor, web)


def kind_of(path: Path) -> ModuleType | None:
    """The kind module that claims `path`, or None for the built-in formats."""
    return next((kind for kind in KINDS if kind.matches(path)), None)
