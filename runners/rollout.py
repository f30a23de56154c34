"""One rollout: the pieces the local runner and the Kubernetes pod entry share.

A rollout is (task, attempt, harness, session id). Whatever runs it prepares
the workspace with `prepare_workspace`, runs the harness pointed at the
recorder's session URL, then `grade_session` asks the recorder to make the
session durable (its flush barrier, `recorder/control.py`), builds the
transcript from the recorded calls and runs the task's grade() on the
workspace. `Outcome` is what goes into the dataset's `outcomes` table.

Statuses: `success` (graded, reward 1.0), `failed` (graded, reward < 1, or
the harness exited non-zero), `timeout` (the agent ran past its time; graded,
keeps its reward), `infra_error` (workspace, sandbox, recorder, pod or grader
failure, a call the recorder could not record whole, or no call recorded at
all: never scored, retried, then recorded with a null reward). A recording
failure (`RecorderFailure`: the recorder's writer died, a write failed, the
recorder is gone) is not retried: it stops the whole run, since every rollout
after it would go unrecorded.

An outcome's free text (its error; in `extra`, the harness's stderr, own
transcript and final answer) is masked before it is written, as call bodies
are: with the recorder's key patterns, and a run's own rules where it has
them (`forge-run --redact-rules`, `BatchRunner.redactor`).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from forgerl.recorder.control import BarrierError, RecorderControl
from forgerl.recorder.otlp import OtlpExporter
from forgerl.recorder.redact import Redactor
from forgerl.recorder.writer_process import CallsFailed, RecorderFailure
from forgerl.schema.rollouts import rollout_session
from forgerl.schema.sessions import prefer_system_allocator, session_count
from forgerl.schema.files import MANIFEST
from forgerl.schema.writer import DatasetWriter

from .grading import GradeInput, GradingError
from .tasks import Task
from .verifier import Layout, Verdict


class InfraError(RuntimeError):
    """Not the agent's fault: retried, never scored."""


class NoCallsRecorded(InfraError):
    """The harness never reached the model: nothing to grade (the caller adds how the harness ended)."""


@dataclass(frozen=True)
class Rollout:
    task: Task
    attempt: int
    policy_version: str = ""

    def new_session(self) -> str:
        """A fresh session id per try (a retried infra failure never shares calls with its retry)."""
        return rollout_session(self.task.id, self.attempt)


def prepare_workspace(task: Task, workspace: Path) -> None:
    """Copy the task's files into an empty workspace (InfraError for a task that cannot run here)."""
    if task.unavailable:
        raise InfraError(f"task {task.id} cannot run here: {task.unavailable}")
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        for f in task.files:
            dest = workspace / f.dest
            dest.parent.mkdir(parents=True, exist_ok=True)
            if f.source.is_dir():
                shutil.copytree(f.source, dest)
            else:
                shutil.copy2(f.source, dest)
    except OSError as e:
        raise InfraError(f"workspace setup failed: {e}") from None


def durable_calls(recorder_url: str, dataset: Path, session: str, now: bool = False, secret: str = "") -> int:
    """Once the recorder acknowledges the session's calls on disk, how many: InfraError for none.

    Every call was answered before the harness exited, but the recorder's
    writer (another process) may still hold the last ones; grading on the
    call before the last would see a transcript without the final answer.
    A rollout with no recorded call never reached the model: nothing to grade;
    one with a call the recorder could not record whole (`CallsFailed`) would be
    graded on a transcript with a hole: it is retried instead.
    `now`: the recorder flushes at once instead of on its clock (`HarnessSlots.spare`).
    `secret`: a recorder holding the keys wants it (`forge-run --hold-keys`).
    """
    try:
        acknowledged = RecorderControl(recorder_url, secret=secret).flush(session, now)
    except BarrierError as e:
        raise InfraError(f"recorder flush barrier: {e}") from None
    except CallsFailed as e:
        raise InfraError(f"recorder: {e}") from None
    if acknowledged == 0:
        raise NoCallsRecorded("no calls were recorded for this rollout (the harness never reached the model)")
    found = session_count(dataset, "calls", session) if (dataset / MANIFEST).exists() else 0
    if found < acknowledged:
        raise InfraError(f"the recorder acknowledged {acknowledged} calls on disk but {dataset} holds {found}")
    return acknowledged


def grade_session(task: Task, run: GradeInput, recorder_url: str, now: bool = False,
                  secret: str = "") -> dict[str, float]:
    """The task's scores for a finished rollout, once the recorder has its calls on disk (flushed at once with
    `now`; `secret`: the recorder's, where it holds the keys)."""
    durable_calls(recorder_url, run.dataset, run.session, now, secret)
    try:
        return task.score(run)
    except GradingError as e:
        raise InfraError(str(e)) from None


def verdict_of(layout: Layout | None) -> Verdict | None:
    """What the rollout's verifier stage reported, if it has one; InfraError if the stage never reported."""
    try:
        return layout.verdict() if layout else None
    except OSError as e:
        raise InfraError(str(e)) from None


class HarnessSlots:
    """At most `width` harnesses running at once (`with slots:` around each), and whether one is spare now.

    A spare slot means no harness was waiting to start: nothing else keeps
    the machine busy (a batch's last rollouts), so a rollout finishing then
    asks the recorder's flush barrier to flush at once, rather than wait out
    the writer's clock (up to half a second) with the machine idle.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self._free = threading.BoundedSemaphore(width)
        self._running = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._free.acquire()
        with self._lock:
            self._running += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._running -= 1
        self._free.release()

    def spare(self) -> bool:
        return self._running < self.width


KEY_SHAPES = Redactor()  # the built-in patterns alone: no literals are added, so threads may share it


@dataclass
class Outcome:
    rollout: Rollout
    session: str
    harness: str
    runner: str
    status: str
    t_start: datetime
    t_end: datetime
    scores: dict[str, float] | None = None
    error: str | None = None
    model: str = ""
    extra: dict = field(default_factory=dict)

    @classmethod
    def graded(cls, rollout: Rollout, session: str, harness: str, runner: str, t_start: datetime,
               scores: dict[str, float], timed_out: bool, returncode: int | None, **kw) -> Outcome:
        """The status for a graded run: timeout, failed (non-zero exit or reward < 1) or success."""
        reward = rollout.task.reward(scores).reward
        if timed_out:
            status, error = "timeout", f"the agent ran past {rollout.task.timeout_s:.0f} s"
        elif returncode:
            status, error = "failed", f"harness exited with status {returncode}"
        else:
            status, error = ("success" if rollout.task.passes(reward) else "failed"), None
        return cls(rollout, session, harness, runner, status, t_start, now(), scores=scores, error=error, **kw)

    def row(self, redactor: Redactor = KEY_SHAPES) -> dict:
        """The `outcomes` row, its free text masked by `redactor` (harnesses print what they hold)."""
        graded = self.rollout.task.reward(self.scores) if self.scores is not None else None
        return {
            "session_id": self.session,
            "task_id": self.rollout.task.id,
            "attempt": self.rollout.attempt,
            "harness": self.harness,
            "model": self.model or None,
            "policy_version": self.rollout.policy_version or None,
            "status": self.status,
            "reward": graded.reward if graded else None,
            "passed": self.rollout.task.passes(graded.reward) if graded else None,
            "scores": json.dumps(self.scores) if self.scores is not None else None,
            "graded": json.dumps(graded.graded) if graded else None,
            "error": redactor.text(self.error),
            "runner": self.runner,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "extra": redactor.text(json.dumps(self.extra, ensure_ascii=False)) if self.extra else None,
        }


def now() -> datetime:
    return datetime.now(timezone.utc)


class BatchRunner:
    """What both runners share: bounded parallelism, retries of infra failures, writing each outcome.

    Subclasses have `harness`, `parallel`, `retries`, `model`, `name` and implement `attempt`.
    `parallel` bounds the harnesses running at once. A runner whose `attempt`
    holds `harness_slot` only around the harness itself (`pipelined`) keeps
    up to twice as many rollouts again in flight: their workspace set-up,
    grading and clean-up happen beside the running harnesses instead of
    between them. Twice, because on a machine the harnesses keep busy a
    rollout's grading (the recorder's flush, the grader) can take longer than
    its harness did: with one rollout in set-up or grading per slot, 16
    harnesses on 2 cores left slots waiting for a rollout to be ready.
    """

    retry_backoff_s: float = 0.0
    pipelined: bool = False
    redactor: Redactor = KEY_SHAPES  # masks each outcome's free text before it is written
    harness_slot: HarnessSlots | None = None  # `parallel` of them while `run` runs
    traces: tuple[OtlpExporter, Path] | None = None  # inside `tracing`: what `end_trace` sends with, and reads

    def attempt(self, rollout: Rollout, session: str) -> Outcome:
        """One try under a fresh session; raise InfraError when it was not the agent's fault."""
        raise NotImplementedError

    def before_batch(self) -> None:
        """Checks that should fail the whole run rather than each rollout (e.g. the harness is missing)."""

    def run(self, rollouts: Iterable[Rollout], writer: DatasetWriter,
            on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Run every rollout, `parallel` at once; each outcome is written as soon as it is known.

        A `RecorderFailure` stops the run: rollouts not started yet never start, and it is raised.
        """
        self.before_batch()
        prefer_system_allocator()  # the rollouts' reads run on many threads
        width = max(1, self.parallel)
        self.harness_slot = HarnessSlots(width)
        stopped = threading.Event()

        def one(rollout: Rollout) -> Outcome | None:
            if stopped.is_set():
                return None  # after a recording failure, which `map` raises first
            try:
                outcome = self.run_one(rollout)
            except RecorderFailure:
                stopped.set()
                raise
            row = outcome.row(self.redactor)
            writer.add_outcome(row)
            self.end_trace(outcome.session, row)
            if on_done:
                on_done(outcome)
            return outcome

        in_flight = 3 * width if self.pipelined else width
        with self.tracing(writer.root), ThreadPoolExecutor(max_workers=in_flight,
                                                           thread_name_prefix=self.name) as pool:
            return list(pool.map(one, rollouts))

    @contextmanager
    def tracing(self, dataset: Path) -> Iterator[None]:
        """`traces` while inside, where `--otlp` made this process the one to end its sessions' traces
        (`FORGE_OTLP_ROOTS=runner`): `end_trace` sends them from `dataset`'s calls."""
        exporter = OtlpExporter.from_env() if OtlpExporter.runner_ends_roots() else None
        self.traces = (exporter, dataset) if exporter else None
        try:
            yield
        finally:
            self.traces = None
            if exporter:
                exporter.close()

    def end_trace(self, session: str, outcome: dict | None) -> None:
        """With `traces`, send the session's agent and root spans, `outcome` (its row as written) on the root."""
        if self.traces:
            exporter, dataset = self.traces
            exporter.end_session(dataset, session, outcome)

    def run_one(self, rollout: Rollout) -> Outcome:
        """Try, retrying infra failures `retries` times; then an unscored `infra_error`."""
        errors: list[str] = []
        t_start = now()
        for attempt in range(self.retries + 1):
            if attempt and self.retry_backoff_s:
                time.sleep(self.retry_backoff_s * attempt)
            session = rollout.new_session()
            try:
                return self.attempt(rollout, session)
            except InfraError as e:
                errors.append(f"{session}: {e}")
                if attempt < self.retries:
                    self.end_trace(session, None)  # a try without an outcome (the last one's is written)
        return Outcome(rollout, session, self.harness.name, self.name, "infra_error", t_start, now(),
                       error="; ".join(errors), model=self.model, extra={"tries": len(errors)})
