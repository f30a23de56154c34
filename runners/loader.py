"""Loading tasks from a path: each task kind (`kinds/`) is asked whether the path is of its kind.

`load_tasks(path)` takes a task file, a folder of task files, a benchmark
folder (QwenClawBench's `tasks/` + `assets/`, ClawEval, Harbor, web), or one
of its tasks; `find_task` is how a pod or a grading subprocess finds its task
again.
"""

from __future__ import annotations

from pathlib import Path

from .kinds import kind_of, kinds
from .tasks import Task, TaskError


def load_task(path: Path) -> Task:
    """The one task in a task file."""
    tasks = load_tasks(path)
    if not path.is_file() or len(tasks) != 1:
        raise TaskError(f"{path}: not a task file")
    return tasks[0]


def _folder_of_files(path: Path) -> list[Task]:
    """A folder no kind claims (or its `tasks/`): each file read by the kind that claims it."""
    folder = path / "tasks" if (path / "tasks").is_dir() else path
    claimed = [(p, kind_of(p)) for p in sorted(folder.iterdir()) if p.is_file()]
    tasks = [task for p, kind in claimed if kind is not None for task in kind.load(p)]
    if not tasks:
        raise TaskError(f"{path}: no task files ({'; '.join(kind.READS for kind in kinds())})")
    return tasks


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from a task file, a folder of task files, a benchmark folder, or a task kind's layout."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"no such task file or folder: {path}")
    kind = kind_of(path)
    if kind is not None:
        tasks = kind.load(path)
    elif path.is_dir():
        tasks = _folder_of_files(path)
    else:
        raise TaskError(f"{path}: not a task file ({'; '.join(kind.READS for kind in kinds())})")
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskError(f"{path}: task id {task.id!r} appears twice")
        seen.add(task.id)
    return tasks


def find_task(path: Path, task_id: str) -> Task:
    """The task `task_id` from `path` (how a pod or a grading subprocess finds its task again)."""
    for task in load_tasks(path):
        if task.id == task_id:
            return task
    raise TaskError(f"{path}: no task {task_id!r}")
