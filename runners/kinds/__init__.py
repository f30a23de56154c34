"""Task kinds: one module per task file format or benchmark layout, registered in `KINDS`.

Each kind module exports

* `READS`: what it reads, in a few words (said when a folder holds no tasks);
* `matches(path: Path) -> bool`: is this file or folder of my kind;
* `load(path: Path) -> list[Task]`: its tasks, every key of its files checked
  against the format's schema (`spec.py`) and its grader code compiled, so a
  bad task file is one line before anything starts. A kind's tasks are
  `tasks.Task`, or a subclass that carries the kind's own data and overrides
  `Task.score`, where the benchmark passes at another score
  `Task.pass_threshold`, and, where a recorded answer cannot be re-graded
  from the recording and a fresh workspace, `Task.offline_ungradable`: why
  not, for `trainer/reward.py`.

`loader.load_tasks` asks each kind in `KINDS` in turn, the first that
matches loads the path; a folder no kind claims is a folder of task files,
each read by the kind that claims it. The kind modules are imported only
then: a grading child that imports one check module of this package
(`web_checks`) must not pay for every kind (ClawEval's alone imports its
package and pyarrow, ~0.2 s).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

# Benchmark layouts first (their folders hold files the file formats would claim), then the file formats.
KINDS: tuple[str, ...] = ("claweval", "harbor", "web", "qwenclawbench", "toml_task")


def kinds() -> Iterator[ModuleType]:
    """The kind modules, in the order they are asked."""
    return (importlib.import_module(f"{__name__}.{name}") for name in KINDS)


def kind_of(path: Path) -> ModuleType | None:
    """The kind module that claims `path`, or None."""
    return next((kind for kind in kinds() if kind.matches(path)), None)
