"""One try of a rollout, wherever it runs: set up, run the harness, collect what it left, grade.

The local runner (`local.py`) and the Kubernetes pod entry (`pod.py`) both
call `run_attempt`, so a task is set up, confined and graded the same way on
either. The phases, in order:

1. set-up: the workspace (`prepare_workspace`), the task's layout (fixed
   paths and a verifier: Harbor tasks), the sandbox, the harness's command,
   and the jail confined with the task's services up (`Sandbox.confine`);
2. run: the harness, under `slots` (the local runner's bound on harnesses
   running at once); for a task with a persona and a user model, once per
   round of the dialogue with its simulated user (`simulated_user.py`), each
   round a jail of its own resuming the harness's session in the same
   workspace and HOME, the agent's time shared by all rounds;
3. collect: the verifier's verdict, the final answer, the services' state;
4. grade: once the recorder has the session's calls on disk (`grade_session`);
   a grade() that reads files alone has been run by the jail already, once
   the harness ended (`Task.jail_grader`), and is taken from there.

What differs stays with the caller: the local runner adds its harness slot,
phase timings and the harness's own transcript to the outcome; the pod reads
its `AttemptConfig` from its environment and writes a JSON result.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from forgerl.harnesses import Harness, RunContext

from .grading import GRADER_TIMEOUT_S, GradeInput, Judge
from .rollout import HarnessSlots, InfraError, NoCallsRecorded, grade_session, prepare_workspace, verdict_of
from .sandbox import Result, Sandbox
from .services import WALL_CLOCK_GRACE_S, service_notes
from .simulated_user import SimulatedUser, UserModel, UserModelError, hold_dialogue
from .tasks import Task
from .verifier import Layout, Verdict

# What a harness inherits from the runner's environment; nothing else (keys come through RunContext.env).
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "TMPDIR")


def inherited(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of `environ` a harness inherits (`PASSTHROUGH_ENV`)."""
    return {k: environ[k] for k in PASSTHROUGH_ENV if k in environ}


@dataclass(frozen=True)
class AttemptConfig:
    """What stays the same for every rollout of a run."""

    harness: Harness
    exe: str  # the harness CLI (`Harness.find`)
    recorder_url: str
    dataset: Path  # the dataset root the recorder writes (the transcript is read from it)
    model: str = ""
    keys: dict[str, str] = field(default_factory=dict)  # API keys for the harness (RunContext.env)
    base_env: dict[str, str] = field(default_factory=dict)  # what the harness inherits (`inherited`)
    timeout_s: float | None = None  # overrides every task's own timeout
    judge: Judge | None = None  # for graders with LLM-judged parts (ClawEval)
    isolate_network: bool = True  # False: the harness is only pointed at the recorder
    in_pod: bool = False  # a Kubernetes pod: the network is the pod's, the task's image is the filesystem
    user: UserModel | None = None  # plays the simulated user of tasks with a persona
    recorder_secret: str = ""  # the recorder holds the keys: its control endpoints want this


@dataclass
class Finished:
    """A graded attempt: what the outcome is made of."""

    scores: dict[str, float]
    result: Result
    final_answer: str | None
    ctx: RunContext
    enforced: list[str]
    timed_out: bool
    notes: dict  # for the outcome's `extra`: the layout's and the services' notes

    def extra(self) -> dict:
        """The outcome's `extra` both runners record."""
        return {"final_answer": self.final_answer, "returncode": self.result.returncode,
                "seconds": round(self.result.seconds, 3), "enforced": self.enforced, **self.notes}


def run_attempt(config: AttemptConfig, task: Task, session: str, rollout_dir: Path,
                slots: HarnessSlots | None = None, timings: dict[str, float] | None = None) -> Finished:
    """Set up, run, collect and grade one try of `task` in `rollout_dir` (InfraError: not the agent's fault).

    `timings`, if given, gets each phase's seconds (model time is inside `harness`).
    """
    timings = {} if timings is None else timings
    clock = time.monotonic()
    # 1. set-up
    workspace, home = rollout_dir / "workspace", rollout_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    prepare_workspace(task, workspace)
    layout = task.layout(rollout_dir, workspace, in_image=config.in_pod)
    cwd = Path(layout.workdir) if layout else workspace
    agent_s = config.timeout_s or task.timeout_s
    # In a pod the NetworkPolicy isolates the network: namespaces only where the task needs them (the judge's and the
    # user model's keys are in the pod's model-keys container, not in this one).
    isolate = bool(layout or task.services) if config.in_pod else config.isolate_network
    runs: list[tuple[Result, Sandbox, RunContext]] = []
    dialogue = bool(task.persona and config.user)
    # A grade() that reads files alone runs in the (single) jail after the harness: no process of its own.
    grade = ({"code": task.jail_grader, "workspace": str(workspace)}
             if task.jail_grader and not dialogue and layout is None else None)

    def run_harness(reply: str | None) -> str | None:
        """One run of the harness in a jail of its own: on the prompt, or with `reply` resuming its session; its
        final answer (None when it failed or ran out of time)."""
        start, left = time.monotonic(), max(agent_s - sum(r.seconds for r, _, _ in runs), 1.0)
        jail_dir = rollout_dir / f"round-{len(runs)}" if runs else rollout_dir  # its services' state goes here
        jail_dir.mkdir(exist_ok=True)
        with Sandbox(jail_dir, config.recorder_url, isolate) as sandbox:
            ctx = RunContext(task.prompt, cwd, home, sandbox.base_url, session, config.model, dict(config.keys),
                             mcp_servers=task.mcp_servers)
            argv, harness_env = config.harness.full_command(config.exe, ctx, reply)
            env = config.base_env | (layout.env if layout else {}) | harness_env | (
                {"HOME": layout.home} if layout and layout.home else {})
            try:  # confined before a harness slot frees, so the harness starts the moment one does
                sandbox.confine(argv, env, cwd, cpu_s=task.cpu_s, memory_mb=task.memory_mb, layout=layout,
                                harness_timeout_s=left, services=task.services, grade=grade,
                                mcp_servers=task.mcp_servers)
                _add(timings, "setup", (clock if not runs else start), time.monotonic())
                start = time.monotonic()
                # 2. run the harness
                with slots or nullcontext():
                    _add(timings, "queued", start, time.monotonic())
                    result = sandbox.run(_wall_clock_s(task, layout, left))
            except OSError as e:
                raise InfraError(f"sandbox failed to start: {e}") from None
            result = replace(result, grade=sandbox.graded(GRADER_TIMEOUT_S))
        runs.append((result, sandbox, ctx))
        answer = config.harness.final_answer(result.stdout, ctx)
        return None if result.returncode or result.timed_out else answer

    notes: dict = {}
    if dialogue:
        try:
            notes["user_agent"] = hold_dialogue(run_harness, task.persona, SimulatedUser(config.user)).meta()
        except UserModelError as e:
            raise InfraError(str(e)) from None
    else:
        run_harness(None)
    last, sandbox, ctx = runs[-1]
    result = replace(last, seconds=sum(r.seconds for r, _, _ in runs))  # the last run's status, every run's time
    timings["harness"] = round(result.seconds, 4)
    clock = time.monotonic()
    # 3. collect
    verdict = verdict_of(layout)
    final_answer = config.harness.final_answer(result.stdout, ctx)
    state = sandbox.service_state()
    # 4. grade
    run = GradeInput(config.dataset, session, workspace, final_answer, verdict=verdict,
                     service_state=state.get("services", {}), judge=config.judge, jail_grade=result.grade)
    try:
        scores = grade_session(task, run, config.recorder_url, now=bool(slots and slots.spare()),
                               secret=config.recorder_secret)
    except NoCallsRecorded as e:
        raise NoCallsRecorded(f"{e}; {_how_it_ended(result)}") from None
    timings["grade"] = round(time.monotonic() - clock, 4)
    return Finished(scores, result, final_answer, ctx, sandbox.enforced, _timed_out(verdict, result, state),
                    notes={**(layout.outcome_notes(verdict) if layout else {}), **service_notes(state), **notes})


def _how_it_ended(result: Result, lines: int = 3, width: int = 600) -> str:
    """The harness's exit and the end of its stderr: why a rollout that never reached the model failed."""
    how = "it ran out of time" if result.timed_out else f"it exited with status {result.returncode}"
    said = [line.strip() for line in result.stderr.splitlines() if line.strip()][-lines:]
    return f"{how}; its stderr ended: {' | '.join(said)[-width:]}" if said else f"{how}, nothing on its stderr"


def _add(timings: dict[str, float], phase: str, start: float, end: float) -> None:
    """Add a phase's seconds (a dialogue's rounds each set up, queue and run the harness)."""
    timings[phase] = round(timings.get(phase, 0.0) + end - start, 4)


def _wall_clock_s(task: Task, layout: Layout | None, agent_s: float) -> float:
    """The runner's limit for the whole jail: the agent's time, a verifier's, and the services' grace."""
    return (layout.wall_clock_s(agent_s) if layout else agent_s) + (WALL_CLOCK_GRACE_S if task.services else 0.0)


def _timed_out(verdict: Verdict | None, result: Result, state: dict) -> bool:
    """Whether the agent ran past its time: the verifier stage says so, else the jail (or PID 1's own clock)."""
    return verdict.agent_timed_out if verdict else result.timed_out or bool(state.get("agent_timed_out"))
