"""Task kinds beyond the built-in formats: one module per benchmark layout.

Each kind module exports

* `matches(path: Path) -> bool`: is this file or folder of my kind;
* `load(path: Path) -> list[Task]`: its tasks (subclasses of `tasks.Task`
  that carry the kind's own data and override `Task.score`, where the
  benchmark passes at another score `Task.pass_threshold`, and, where a
  recorded answer cannot be re-graded from the recording and a fresh
  workspace, `Task.offline_ungradable`: why not, for `trainer/reward.py`).

`tasks.load_tasks` asks each kind in `KINDS` in turn before the built-in
QwenClawBench / TOML formats; the first that matches loads the path. The
kind modules are imported only then: a grading child that imports one
check module of this package (`web_checks`) must not pay for every kind
(ClawEval's alone imports its package and pyarrow, ~0.2 s).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

KINDS: tuple[str, ...] = ("claweval", "harbor", "web")


def kind_of(path: Path) -> ModuleType | None:
    """The kind module that claims `path`, or None for the built-in formats."""
    kinds = (importlib.import_module(f"{__name__}.{name}") for name in KINDS)
    return next((kind for kind in kinds if kind.matches(path)), None)
