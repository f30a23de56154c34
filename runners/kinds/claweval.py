"""ClawEval tasks (`tasks/<id>/task.yaml` + `grader.py` + `fixtures/`, with `mock_services/` beside `tasks/`).

A task is loaded with ClawEval's own `TaskDefinition` (the `claw_eval`
package, installed from the benchmark folder). Its `sandbox_files` are
copied into the workspace at the same relative paths (where ClawEval's
sandbox puts them, under `/workspace`).

Accepted paths: the benchmark folder (holding `tasks/*/task.yaml`), one
task's folder, or its `task.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..tasks import Task, TaskError, WorkspaceFile

if TYPE_CHECKING:
    from claw_eval.models.task import TaskDefinition

TASK_FILE = "task.yaml"
INSTALL_HINT = "pip install a copy of the ClawEval folder (`make test` installs ../shared/benchmarks/claweval)"


@dataclass(frozen=True)
class ClawEvalTask(Task):
    """One ClawEval task: its `TaskDefinition` and the benchmark folder its services run from."""

    definition: Any = None  # claw_eval.models.task.TaskDefinition (pydantic; the package is imported lazily)
    root: Path = Path()  # the benchmark folder: service commands and fixture paths are relative to it
    task_dir: Path = Path()

    benchmark: ClassVar[str] = "ClawEval"
    pass_threshold: ClassVar[float] = 0.75  # claw_eval.models.scoring.is_pass's default threshold


def _task_definition_class() -> type[TaskDefinition]:
    try:
        from claw_eval.models.task import TaskDefinition
    except ImportError:
        raise TaskError(f"ClawEval tasks need the claw_eval package: {INSTALL_HINT}") from None
    return TaskDefinition


def _task_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.name == TASK_FILE else []
    if (path / TASK_FILE).is_file():
        return [path / TASK_FILE]
    return sorted((path / "tasks").glob(f"*/{TASK_FILE}")) if (path / "tasks").is_dir() else []


def matches(path: Path) -> bool:
    """The benchmark folder, a task folder, or a `task.yaml`."""
    return bool(_task_files(path))


def _benchmark_root(task_dir: Path) -> Path:
    """The folder holding `tasks/` (and `mock_services/`): two levels above a task's own folder."""
    root = task_dir.parent.parent
    if task_dir.parent.name != "tasks" or not (root / "mock_services").is_dir():
        raise TaskError(f"{task_dir}: a ClawEval task folder must sit in <benchmark>/tasks/ beside mock_services/")
    return root


def load_one(task_file: Path) -> ClawEvalTask:
    definition_class = _task_definition_class()
    try:
        definition = definition_class.from_yaml(task_file)
    except Exception as e:  # noqa: BLE001 - yaml and pydantic errors alike: a task file the user must fix
        raise TaskError(f"{task_file}: {str(e).splitlines()[0]}") from None
    task_dir = task_file.parent.resolve()
    files = tuple(WorkspaceFile(task_dir / rel, rel) for rel in definition.sandbox_files)
    return ClawEvalTask(id=definition.task_id, prompt=definition.prompt.text, grader="", path=task_file,
                        files=files, timeout_s=float(definition.environment.timeout_seconds),
                        definition=definition, root=_benchmark_root(task_dir), task_dir=task_dir)


def load(path: Path) -> list[Task]:
    return [load_one(f) for f in _task_files(path)]
