"""Tasks: what a rollout does (workspace files, prompt, grader, limits), and loaders for task files.

Two formats load into the same `Task`:

* QwenClawBench `task_*.md`: YAML front matter (`id`, `workspace_files` copied
  from `assets/<id>/`, `timeout_seconds`, `grading_type`, `grading_weights`),
  a `## Prompt` section and an `## Automated Checks` python block defining
  `grade(transcript, workspace_path) -> dict`.
* forgerl's own TOML spec (`*.toml`), documented in runners/README.md:

      id = "hello"
      prompt = "Create hello.txt containing 'hi'."
      timeout_seconds = 300
      [limits]                  # optional
      cpu_seconds = 600
      memory_mb = 4096
      [[workspace_files]]       # optional; source is relative to the task file
      source = "assets/seed.txt"
      dest = "seed.txt"
      [grading]
      weights = { automated = 1.0 }      # optional; default automated only
      code = '''
      def grade(transcript, workspace_path):
          ...
      '''

`load_tasks(path)` takes a task file, a folder of task files, or a benchmark
folder laid out like QwenClawBench (`tasks/` + `assets/`); other benchmark
layouts are task kinds (`runners/kinds/`), asked first.

`Task` is the one task type: a kind subclasses it for its own data and
overrides `score` (how a finished rollout is graded), `reward` and
`pass_threshold` (the score at which a trial passes: 1.0 for QwenClawBench).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import yaml

from forgerl.errors import UserError

from .grading import GradeInput, Reward, combine, grade_workspace, reads_transcript, scores_of
from .harnesses.base import McpServer
from .services import Service
from .simulated_user import Persona
from .verifier import Layout

DEFAULT_TIMEOUT_S = 1800
DEFAULT_CPU_S = 3600
DEFAULT_MEMORY_MB = 4096


class TaskError(UserError, ValueError):
    """A task file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class WorkspaceFile:
    source: Path
    dest: str


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    grader: str  # python source defining grade(transcript, workspace_path) -> dict
    path: Path  # the file it came from (pods load it again from here)
    files: tuple[WorkspaceFile, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    weights: dict[str, float] = field(default_factory=lambda: {"automated": 1.0})
    grading_type: str = "automated"
    cpu_s: int = DEFAULT_CPU_S
    memory_mb: int = DEFAULT_MEMORY_MB
    services: tuple[Service, ...] = ()  # started in the rollout's network namespace before the harness
    mcp_servers: tuple[McpServer, ...] = ()  # offered to the harness through its own MCP config
    unavailable: str = ""  # why it cannot run here: each rollout is an infra_error with this reason, never a 0
    skip: str = ""  # why forge-run leaves it out (said when it does)
    persona: Persona | None = None  # a simulated user answers the harness (`simulated_user.py`)

    benchmark: ClassVar[str] = "QwenClawBench / TOML"  # named in pass@k tables beside its pass rule
    pass_threshold: ClassVar[float] = 1.0  # a trial passes at reward >= this (QwenClawBench: only 1.0)
    missing_trials_fail: ClassVar[bool] = False  # pass@k / pass^k count a task's missing trials as failed
    # Why an answer cannot be graded offline from the recording and a fresh workspace ("": it can, as grade()
    # reads only the transcript and the workspace); the offline reward (`trainer/reward.py`) then takes the
    # reward the run recorded.
    offline_ungradable: ClassVar[str] = ""

    def score(self, run: GradeInput) -> dict[str, float]:
        """Per-check scores of one finished rollout: by default `grade(transcript, workspace)` in a child; the
        rollout's calls are read back for the transcript only if grade() may look at it. A grade the rollout's
        jail ran (`jail_grader`) is taken as it is."""
        if run.jail_grade is not None:
            return scores_of(run.jail_grade)
        return grade_workspace(self, run.transcript if self.grader_reads_transcript else [], run.workspace)

    @cached_property
    def jail_grader(self) -> str:
        """The grader a rollout's jail may run itself once the harness has ended ("": none): the default `score`'s
        grade(), when it reads files alone (it would be handed an empty transcript anyway). Saves the grade a
        process of its own, about 3 ms of CPU a rollout."""
        return self.grader if type(self).score is Task.score and not self.grader_reads_transcript else ""

    @cached_property
    def grader_reads_transcript(self) -> bool:
        """Whether `grader`'s grade() may look at its transcript (`grading.reads_transcript`)."""
        return reads_transcript(self.grader)

    def reward(self, scores: dict[str, float]) -> Reward:
        """The reward of `score`'s result: by default the weighted mean of the graded parts."""
        return combine(self, scores)

    def passes(self, reward: float) -> bool:
        return reward >= self.pass_threshold

    def pass_rule(self) -> str:
        """When a trial passes, and what else its numbers mean (a line under the pass@k table)."""
        judge = ("; reward = automated checks only (no LLM judge configured): not comparable with published "
                 "QwenClawBench totals") if "llm_judge" in self.weights else ""
        return f"{self.benchmark}: passes at reward >= {self.pass_threshold:g}{judge}"

    def layout(self, rollout_dir: Path, workspace: Path, in_image: bool = False) -> Layout | None:
        """Fixed paths and a verifier after the agent that a rollout needs (`verifier.Layout`); None: neither.

        `in_image`: the rollout runs in the task's own image (a Kubernetes pod), whose working directory is
        already there; else the workspace is bound at it.
        """
        return None

    def container_image(self, registry: str) -> str | None:
        """The image a pod of this task runs in; None: the runner's rollout image (`--image`)."""
        return None


_SECTION = re.compile(r"^## +(.+?)\s*$", re.MULTILINE)
_PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _sections(body: str) -> dict[str, str]:
    heads = list(_SECTION.finditer(body))
    return {m.group(1).strip().lower(): body[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(body)]
            for i, m in enumerate(heads)}


def _dest(dest: str) -> str:
    if not dest or Path(dest).is_absolute() or ".." in Path(dest).parts:
        raise TaskError(f"workspace file destination must be a relative path inside the workspace: {dest!r}")
    return dest


def _weights(raw: object, where: Path) -> dict[str, float]:
    if raw is None:
        return {"automated": 1.0}
    if not isinstance(raw, dict) or not raw or not all(isinstance(v, (int, float)) and v >= 0 for v in raw.values()):
        raise TaskError(f"{where}: grading weights must be a mapping of non-negative numbers, got {raw!r}")
    return {str(k): float(v) for k, v in raw.items()}


def load_qwenclawbench(path: Path, assets: Path | None = None) -> Task:
    """One `task_*.md`; its files come from `assets/<id>/` beside `tasks/` (or `assets`)."""
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        raise TaskError(f"{path}: no YAML front matter")
    front_text, _, body = text[4:].partition("\n---\n")
    try:
        front = yaml.safe_load(front_text) or {}
    except yaml.YAMLError as e:
        raise TaskError(f"{path}: bad front matter: {e}".splitlines()[0]) from None
    task_id = front.get("id") or path.stem
    sections = _sections(body)
    prompt = sections.get("prompt", "").strip()
    block = _PYTHON_BLOCK.search(sections.get("automated checks", ""))
    if not prompt or block is None:
        raise TaskError(f"{path}: needs a '## Prompt' section and a python block under '## Automated Checks'")
    assets = assets or path.parent.parent / "assets"
    files = tuple(WorkspaceFile(assets / task_id / f["source"], _dest(f["dest"]))
                  for f in front.get("workspace_files") or [])
    return Task(id=task_id, prompt=prompt, grader=block.group(1), path=path, files=files,
                timeout_s=float(front.get("timeout_seconds") or DEFAULT_TIMEOUT_S),
                weights=_weights(front.get("grading_weights"), path),
                grading_type=str(front.get("grading_type") or "automated"))


def load_toml(path: Path) -> Task:
    """A forgerl TOML task spec (see the module docstring)."""
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{path}: {e}") from None
    grading = spec.get("grading") or {}
    limits = spec.get("limits") or {}
    if not spec.get("id") or not spec.get("prompt") or not grading.get("code"):
        raise TaskError(f"{path}: needs id, prompt and [grading] code")
    files = tuple(WorkspaceFile(path.parent / f["source"], _dest(f["dest"])) for f in spec.get("workspace_files", []))
    weights = _weights(grading.get("weights"), path)
    return Task(id=str(spec["id"]), prompt=str(spec["prompt"]), grader=str(grading["code"]), path=path, files=files,
                timeout_s=float(spec.get("timeout_seconds", DEFAULT_TIMEOUT_S)), weights=weights,
                grading_type="hybrid" if len(weights) > 1 else "automated",
                cpu_s=int(limits.get("cpu_seconds", DEFAULT_CPU_S)),
                memory_mb=int(limits.get("memory_mb", DEFAULT_MEMORY_MB)))


def load_task(path: Path) -> Task:
    if path.suffix == ".md":
        return load_qwenclawbench(path)
    if path.suffix == ".toml":
        return load_toml(path)
    raise TaskError(f"{path}: not a task file (expected task_*.md or *.toml)")


def _load_builtin(path: Path) -> list[Task]:
    """QwenClawBench `task_*.md` and forgerl `*.toml`: a file, a folder of them, or `tasks/` + `assets/`."""
    if path.is_file():
        return [load_task(path)]
    if not path.is_dir():
        raise TaskError(f"no such task file or folder: {path}")
    folder = path / "tasks" if (path / "tasks").is_dir() else path
    files = sorted(p for p in folder.iterdir() if p.suffix == ".toml" or (p.suffix == ".md" and p.name.startswith("task_")))
    if not files:
        raise TaskError(f"{path}: no task files (task_*.md or *.toml)")
    return [load_task(p) for p in files]


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from a task file, a folder of task files, a benchmark folder, or a task kind's layout (`kinds/`)."""
    from .kinds import kind_of  # here: the kind modules import Task from this module

    path = Path(path)
    kind = kind_of(path)
    tasks = kind.load(path) if kind is not None else _load_builtin(path)
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
