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

from forgerl.harnesses import Harness

from .attempt import AttemptConfig, inherited, run_attempt
from .grading import Judge
from .rollout import BatchRunner, Outcome, Rollout, now
from .serve import rollout_keys
from .simulated_user import UserModel

STDERR_TAIL = 4000
TOKEN_GRACE_S = 3600  # a rollout's token outlives its agent time by this (queueing, grading); closing revokes it


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
    user: UserModel | None = None  # the simulated user of tasks with a persona (ClawEval user_agent)
    exe: str = ""  # the harness CLI, found when a batch starts
    recorder_secret: str = ""  # the recorder holds the keys: each rollout's harness gets a token (`rollout_keys`)
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
        """Run the attempt (`attempt.run_attempt`) under a harness slot; `timings` gets each phase's seconds."""
        t_start = now()
        ttl_s = (self.timeout_s or rollout.task.timeout_s) + TOKEN_GRACE_S
        with rollout_keys(self.harness, self.recorder_url, self.recorder_secret, session, ttl_s) as token:
            config = AttemptConfig(self.harness, self.exe, self.recorder_url, self.dataset, model=self.model,
                                   keys={**self.env, **token}, base_env=inherited(os.environ),
                                   timeout_s=self.timeout_s, judge=self.judge, isolate_network=self.isolate_network,
                                   user=self.user, recorder_secret=self.recorder_secret)
            done = run_attempt(config, rollout.task, session, tmp, self.harness_slot, timings)
        extra = {**done.extra(), "harness_transcript": self.harness.own_transcript(done.ctx),
                 "stderr_tail": done.result.stderr[-STDERR_TAIL:] or None, "timings": timings}
        return Outcome.graded(rollout, session, self.harness.name, self.name, t_start, done.scores,
                              done.timed_out, done.result.returncode, model=self.model, extra=extra)
