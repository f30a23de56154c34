"""`LocalRunner`, the embedded default: each rollout in its own temp dir and sandbox on this machine.

Per rollout: a temp dir holding the workspace (the task's files) and a
private HOME for the harness; the harness runs under `Sandbox` (process tree,
limits, network namespace where the machine allows) with the recorder as its
only endpoint; then the workspace is graded and the outcome written. The
temp dir is removed on every exit path. Infra failures are retried
`retries` times with a fresh session, then recorded as `infra_error`.
At most `parallel` harnesses run at once; the next rollouts' workspaces, and
the grading and clean-up of finished ones, happen beside them (`pipelined`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .grading import GradeInput, Judge
from .harnesses import Harness, RunContext
from .rollout import BatchRunner, InfraError, Outcome, Rollout, grade_session, now, prepare_workspace, verdict_of
from .sandbox import Sandbox
from .services import WALL_CLOCK_GRACE_S, service_notes

# What a harness inherits from the runner's environment; nothing else (keys come through RunContext.env).
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "TMPDIR")
STDERR_TAIL = 4000


@dataclass
class LocalRunner(BatchRunner):
    harness: Harness
    recorder_url: str
    dataset: Path
    parallel: int = 1
    retries: int = 2
    isolate_network: bool = True
    model: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # overrides every task's own timeout
    name: str = "local"
    workdir: Path | None = None  # where rollout temp dirs go (default: the system's temp dir)
    judge: Judge | None = None  # for graders with LLM-judged parts (ClawEval)
    exe: str = ""  # the harness CLI, found when a batch starts
    pipelined = True

    def before_batch(self) -> None:
        self.exe = self.harness.find()

    def attempt(self, rollout: Rollout, session: str) -> Outcome:
        tmp = Path(tempfile.mkdtemp(prefix="forgerl-rollout-", dir=self.workdir))
        timings: dict[str, float] = {}
        try:
            outcome = self._run_in(tmp, rollout, session, timings)
        finally:
            start = time.monotonic()
            shutil.rmtree(tmp, ignore_errors=True)
            timings["teardown"] = round(time.monotonic() - start, 4)
        return outcome

    def _run_in(self, tmp: Path, rollout: Rollout, session: str, timings: dict[str, float]) -> Outcome:
        """Set up, run, grade; `timings` gets each phase's seconds (model time is inside `harness`)."""
        task = rollout.task
        t_start, clock = now(), time.monotonic()
        workspace, home = tmp / "workspace", tmp / "home"
        home.mkdir()
        prepare_workspace(task, workspace)
        layout = task.layout(tmp, workspace)  # fixed paths (/app, /tests, ...) and a verifier: Harbor tasks
        cwd = Path(layout.workdir) if layout else workspace
        agent_s = self.timeout_s or task.timeout_s
        with Sandbox(tmp, self.recorder_url, self.isolate_network) as sandbox:
            ctx = RunContext(task.prompt, cwd, home, sandbox.base_url, session, self.model, dict(self.env),
                             mcp_servers=task.mcp_servers)
            argv, harness_env = self.harness.full_command(self.exe, ctx)
            env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ} | (layout.env if layout else {})
            env |= harness_env
            try:  # confined before a harness slot frees, so the harness starts the moment one does
                sandbox.confine(argv, env, cwd, cpu_s=task.cpu_s, memory_mb=task.memory_mb, layout=layout,
                                harness_timeout_s=agent_s, services=task.services)
                timings["setup"] = round(time.monotonic() - clock, 4)
                clock = time.monotonic()
                with self.harness_slot:
                    timings["queued"] = round(time.monotonic() - clock, 4)
                    result = sandbox.run(layout.wall_clock_s(agent_s) if layout
                                         else agent_s + (WALL_CLOCK_GRACE_S if task.services else 0))
            except OSError as e:
                raise InfraError(f"sandbox failed to start: {e}") from None
        verdict = verdict_of(layout)
        timings["harness"] = round(result.seconds, 4)
        clock = time.monotonic()
        final_answer = self.harness.final_answer(result.stdout, ctx)
        state = sandbox.service_state()
        run = GradeInput(self.dataset, session, workspace, final_answer, verdict=verdict,
                         service_state=state.get("services", {}), judge=self.judge)
        scores = grade_session(task, run, self.recorder_url)
        timings["grade"] = round(time.monotonic() - clock, 4)
        extra = {"final_answer": final_answer,
                 "harness_transcript": self.harness.own_transcript(ctx),
                 "returncode": result.returncode, "seconds": round(result.seconds, 3),
                 "enforced": sandbox.enforced, "stderr_tail": result.stderr[-STDERR_TAIL:] or None,
                 "timings": timings, **(layout.outcome_notes(verdict) if layout else {}),
                 **service_notes(state)}
        timed_out = verdict.agent_timed_out if verdict else result.timed_out or bool(state.get("agent_timed_out"))
        return Outcome.graded(rollout, session, self.harness.name, self.name, t_start, scores,
                              timed_out, result.returncode, model=self.model, extra=extra)
