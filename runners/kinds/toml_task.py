"""forgerl's own task file, `*.toml` (runners/README.md#task-files):

    id = "hello"
    prompt = "Create hello.txt containing 'hi'."
    timeout_seconds = 300                # optional (default 1800)
    workdir = "/workspace"               # optional: the workspace bound at this fixed path, the harness's cwd
    [limits]                             # optional
    cpu_seconds = 600
    memory_mb = 4096                     # 0: no memory limit
    [[workspace_files]]                  # optional; source is relative to the task file
    source = "assets/seed.txt"
    dest = "seed.txt"
    [grading]
    weights = { automated = 1.0 }        # optional; default automated only
    code = '''
    def grade(transcript, workspace_path):
        ...
    '''

Every key is checked (`TomlTask`) and the grader compiled when the task loads.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from ..tasks import DEFAULT_CPU_S, DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, FIXED_HOME, Task, TaskError, WorkspaceFile
from .spec import Seconds, Spec, Text, WorkspaceFileSpec, checked, compile_grader

READS = "forgerl *.toml"


class Limits(Spec):
    cpu_seconds: Annotated[int, Field(gt=0)] = DEFAULT_CPU_S
    memory_mb: Annotated[int, Field(ge=0)] = DEFAULT_MEMORY_MB  # 0: no memory limit (`sandbox.Sandbox.confine`)


class Grading(Spec):
    code: Text
    weights: Annotated[dict[str, Annotated[float, Field(ge=0)]], Field(min_length=1)] = {"automated": 1.0}


def _fixed_workdir(path: str) -> str:
    """One new folder under `/`: the rollout's own root gets it, so it must not hide one of the machine's."""
    if not re.fullmatch(r"/[\w.-]+", path) or path in ("/.", "/.."):
        raise ValueError("an absolute path of one folder under / (such as /workspace)")
    if path == FIXED_HOME or Path(path).exists():
        raise ValueError(f"a folder this machine does not have (the rollout's root would hide {path})")
    return path


class TomlTask(Spec):
    id: Text
    prompt: Text
    timeout_seconds: Seconds = DEFAULT_TIMEOUT_S
    workdir: Annotated[str, AfterValidator(_fixed_workdir)] = ""
    limits: Limits = Limits()
    workspace_files: list[WorkspaceFileSpec] = []
    grading: Grading


def matches(path: Path) -> bool:
    """One `*.toml` file (a folder of them is read file by file, `loader.py`)."""
    return path.is_file() and path.suffix == ".toml"


def _first_line(text: str, code: str) -> int:
    """The file line where `code` starts (a literal multi-line string holds it verbatim; else line 1 of the file)."""
    at = text.find(code)
    return text[:at].count("\n") + 1 if at >= 0 else 1


def load(path: Path) -> list[Task]:
    text = path.read_text(encoding="utf-8")
    try:
        spec = checked(TomlTask, tomllib.loads(text), path)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{path}: {e}") from None
    compile_grader(spec.grading.code, path, _first_line(text, spec.grading.code), "[grading] code")
    weights = dict(spec.grading.weights)
    return [Task(id=spec.id, prompt=spec.prompt, grader=spec.grading.code, path=path,
                 files=tuple(WorkspaceFile(path.parent / f.source, f.dest) for f in spec.workspace_files),
                 timeout_s=spec.timeout_seconds, weights=weights,
                 grading_type="hybrid" if len(weights) > 1 else "automated",
                 cpu_s=spec.limits.cpu_seconds, memory_mb=spec.limits.memory_mb, workdir=spec.workdir)]
