"""The task: what a rollout does (workspace files, prompt, grader, limits), whatever file it came from.

`Task` is the one task type. Each task kind (`runners/kinds/`, one module per
file format or benchmark layout) builds it from its files, and `loader.py`
asks the kinds which of them reads a path. A kind subclasses `Task` for its
own data and overrides `score` (how a finished rollout is graded), `reward`
and `pass_threshold` (the score at which a trial passes: 1.0 for
QwenClawBench and forgerl's TOML).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from forgerl.errors import UserError
from forgerl.harnesses import McpServer

from .grading import GradeInput, Reward, combine, grade_workspace, reads_transcript, scores_of
from .services import Service
from .simulated_user import Persona
from .verifier import Layout

DEFAULT_TIMEOUT_S = 1800
DEFAULT_CPU_S = 3600
DEFAULT_MEMORY_MB = 4096
FIXED_HOME = "/agent-home"  # the harness's HOME where a task has a fixed `workdir`


class TaskError(UserError):
    """A task file that cannot be used; the message names the file (and the key, where one is wrong)."""


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
    workdir: str = ""  # set: the workspace is bound at this fixed path, the harness's cwd (`layout`)

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

        By default: with `workdir` set, a root of the rollout's own with the workspace bound at `workdir` and
        the harness's HOME at `FIXED_HOME`, so what the harness tells the model (its cwd, its memory folder) is
        the same in every rollout, not a random temp folder.
        """
        if not self.workdir:
            return None
        (rollout_dir / "root").mkdir()
        return Layout(root=str(rollout_dir / "root"), workdir=self.workdir, home=FIXED_HOME,
                      binds=[(self.workdir, str(workspace)), (FIXED_HOME, str(rollout_dir / "home"))])

    def container_image(self, registry: str) -> str | None:
        """The image a pod of this task runs in; None: the runner's rollout image (`--image`)."""
        return None
