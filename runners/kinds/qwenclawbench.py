"""QwenClawBench tasks: `task_*.md`, a benchmark folder of them (`tasks/` + `assets/`), or one file.

    ---
    id: task_00067_write_sparql_query      # default: the file's stem
    name: ...                              # name, category, subcategory, input_modality, external_dependency,
    grading_type: hybrid                   #   difficulty, verification_method, skill_creation: the benchmark's
    grading_weights: {automated: 0.5, llm_judge: 0.5}   # own metadata, accepted and not used
    timeout_seconds: 1800
    workspace_files:                       # copied from assets/<id>/ beside tasks/
    - source: data/spec.ttl
      dest: data/spec.ttl
    ---
    ## Prompt
    ...
    ## Automated Checks
    ```python
    def grade(transcript, workspace_path) -> dict: ...
    ```

The front matter is checked against the fields QwenClawBench's tasks carry
(`Front`); the grader block is compiled when the task loads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field

from ..tasks import DEFAULT_TIMEOUT_S, Task, TaskError, WorkspaceFile
from .spec import Seconds, Spec, WorkspaceFileSpec, checked, compile_grader

READS = "QwenClawBench task_*.md"
SECTION = re.compile(r"^## +(.+?)\s*$", re.MULTILINE)
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
Weights = dict[str, Annotated[float, Field(ge=0)]]


class Front(Spec):
    """A task's YAML front matter."""

    id: str = ""
    name: str = ""
    category: str = ""
    subcategory: str = ""
    grading_type: Literal["automated", "llm_judge", "hybrid"] = "automated"
    grading_weights: Annotated[Weights, Field(min_length=1)] = {"automated": 1.0}
    timeout_seconds: Seconds = DEFAULT_TIMEOUT_S
    workspace_files: list[WorkspaceFileSpec] = []
    input_modality: str = ""
    external_dependency: str = ""
    difficulty: str = ""
    verification_method: str = ""
    skill_creation: bool = False


def matches(path: Path) -> bool:
    """One `task_*.md` file (a folder of them is read file by file, `loader.py`)."""
    return path.is_file() and path.suffix == ".md" and path.name.startswith("task_")


def _sections(body: str) -> dict[str, tuple[str, int]]:
    """Each `## ` section's text and the offset in `body` where it starts."""
    heads = list(SECTION.finditer(body))
    return {m.group(1).strip().lower(): (body[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(body)],
                                         m.end()) for i, m in enumerate(heads)}


def load(path: Path) -> list[Task]:
    """One `task_*.md`; its files come from `assets/<id>/` beside its folder (QwenClawBench's `tasks/`)."""
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        raise TaskError(f"{path}: no YAML front matter")
    front_text, _, body = text[4:].partition("\n---\n")
    try:
        front = checked(Front, yaml.safe_load(front_text) or {}, path)
    except yaml.YAMLError as e:
        raise TaskError(f"{path}: bad front matter: {e}".splitlines()[0]) from None
    sections = _sections(body)
    prompt = sections.get("prompt", ("", 0))[0].strip()
    checks, at = sections.get("automated checks", ("", 0))
    block = PYTHON_BLOCK.search(checks)
    if not prompt or block is None:
        raise TaskError(f"{path}: needs a '## Prompt' section and a python block under '## Automated Checks'")
    body_line = text[:len(text) - len(body)].count("\n") + 1
    compile_grader(block.group(1), path, body_line + body[:at + block.start(1)].count("\n"), "## Automated Checks")
    task_id = front.id or path.stem
    assets = path.parent.parent / "assets"
    return [Task(id=task_id, prompt=prompt, grader=block.group(1), path=path,
                 files=tuple(WorkspaceFile(assets / task_id / f.source, f.dest) for f in front.workspace_files),
                 timeout_s=front.timeout_seconds, weights=dict(front.grading_weights),
                 grading_type=front.grading_type)]
