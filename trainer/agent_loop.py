"""veRL agent loop: each prompt row is one rollout of a real harness, served by the policy being trained.

Per row: a policy gateway (`forgerl.recorder.serve`) on this worker's event
loop answers the harness from veRL's rollout servers (`server_manager.generate`,
token-in / token-out); a recorder in serve mode sits in front of it and
records every call with its token ids and logprobs; a forgerl `LocalRunner`
prepares the task's workspace, runs the harness against the recorder, and
grades it. The recorded calls become the samples (`trajectory.py`): prompt
ids, response ids, response mask (model tokens 1, tool/user tokens 0),
logprobs, and the task's reward.

- An infrastructure failure (runner `infra_error`, which includes a rollout
  with no recorded call) comes back fully masked (response mask 0: it trains
  nothing) with reward 0, counted in `extra_fields["forge_infra_error"]`.
- A recording failure (`RecorderFailure`: the recorder's writer died or a
  write failed) is raised: training stops rather than learn from unrecorded
  turns.
- The sample is read from this rollout's calls alone (`session_rows`), once
  the runner's flush barrier has made them durable: its cost does not grow
  with the dataset. The rollout has its recorder to itself, so the barrier
  asks its writer to flush at once, not on its half-second clock.
- Task failures and agent timeouts keep their graded reward.
- The harness holds no key: the rollout's recorder holds the keys (a fresh
  secret each) and the harness gets a token for its own session in its key
  variable, revoked after the flush barrier (`recorder/credentials.py`); the
  gateway behind the recorder needs none, so none is sent upstream.
- What is returned follows the PPO config's `forgerl.rows` (`segment_rl.Expansion`):
  `thread` (what `forge-train rl` writes by default) every segment, `per_call`
  every call, last one last, for `segment_manager.py`'s workers to weigh
  (veRL's V1 trainer stores each output as a row); `last` (with no `forgerl`
  section) the segment holding the call grading read (the main thread's last) alone.
- A sample longer than `rollout.prompt_length` / `response_length` is never
  truncated silently: it comes back fully masked and counted
  (`forge_overlong`), with a warning; `forge-train rl` sizes both lengths from
  recorded data and refuses configs that would truncate.
- `forge_malformed_tool_calls`: the tool calls the policy wrote in this
  rollout that did not parse (they reached the harness as text), from the
  recorded calls' `malformed_tool_calls`.

Registered as `forgerl_harness`; the YAML for `agent_loop_config_path` that
`forge-train rl` writes passes the harness, task source and dataset root.
The row's `extra_info.task_id` names its task in the loop's `tasks` source
(`forge-train rl --tasks`); a row may carry its own `extra_info.task_path`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from forgerl.recorder.credentials import KeyHolder, Tokens, new_secret
from forgerl.recorder.policy import Generation, Sampling
from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig
from forgerl.recorder.redact import Redactor
from forgerl.recorder.serve import PolicyGateway
from forgerl.harnesses import get_harness
from forgerl.runners.loader import find_task, load_task
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import HarnessSlots, Outcome, Rollout
from forgerl.runners.tasks import Task
from forgerl.schema.sessions import session_rows

from .segment_rl import Expansion
from .trajectory import CALL_COLUMNS, Segment, per_call, segments

log = logging.getLogger(__name__)


class VerlPolicy:
    """veRL's rollout servers as a gateway policy: one sticky request id per rollout (prefix caching)."""

    def __init__(self, server_manager: Any, sampling_params: dict[str, Any], request_id: str, eos_id: int):
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id
        self.eos_id = eos_id

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        params = {**self.sampling_params, "max_tokens": sampling.max_tokens}
        output = await self.server_manager.generate(request_id=self.request_id, prompt_ids=prompt_ids,
                                                    sampling_params=params)
        ids = list(output.token_ids)
        ended = bool(ids) and ids[-1] == self.eos_id
        return Generation(ids, list(output.log_probs) if output.log_probs else None, "stop" if ended else "length")


@register("forgerl_harness")
class HarnessAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, harness: str = "claude-code", tasks: str = "", dataset: str = "forge-rollouts",
                 served_model: str = "policy", policy_version: str = "", timeout_s: float | None = None,
                 isolate_network: bool = True, env: dict[str, str] | None = None, redact_rules: str = "",
                 **kwargs: Any):
        kwargs.pop("name", None)  # the registry entry's own name, passed along by hydra
        super().__init__(*args, **kwargs)
        self.harness = get_harness(harness)
        self.tasks = tasks
        self.dataset = Path(dataset)
        self.served_model = served_model
        self.policy_version = policy_version
        self.timeout_s = timeout_s
        self.isolate_network = isolate_network
        self.env = dict(env or {})
        self.redact_rules = redact_rules  # the user's regexes (forge-train rl --redact-rules), beside the built-in
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        self.eos_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token)
        self.expansion = Expansion.of(self.config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        info = kwargs.get("extra_info") or {}
        task = _task(info, self.tasks)
        policy = VerlPolicy(self.server_manager, sampling_params, uuid.uuid4().hex, self.eos_id)
        gateway = PolicyGateway(policy, self.tokenizer, self.served_model,
                                sampling=Sampling(max_tokens=self.response_length))
        url = await gateway.start()
        secret = new_secret()
        recorder = BackgroundRecorder(RecorderConfig.one_upstream(self.dataset, url, policy_version=self.policy_version,
                                                                  redact_rules=self.redact_rules,
                                                                  keys=KeyHolder(Tokens(secret), {})))
        try:
            await asyncio.to_thread(recorder.start)
            runner = LocalRunner(self.harness, recorder.config.url, self.dataset, retries=0,
                                 isolate_network=self.isolate_network, model=self.served_model, env=self.env,
                                 timeout_s=self.timeout_s, name="verl", exe=self.harness.find(),
                                 recorder_secret=secret)
            runner.harness_slot = HarnessSlots(1)  # spare once the harness ends: its barrier flushes at once
            rollout = Rollout(task, attempt=int(info.get("attempt", 0)), policy_version=self.policy_version)
            outcome = await asyncio.to_thread(self._run_one, runner, rollout)
        finally:
            await asyncio.to_thread(recorder.stop)
            await gateway.close()
        return self.output(outcome, self._calls(outcome.session), gateway.calls)

    def _run_one(self, runner: LocalRunner, rollout: Rollout) -> Outcome:
        """The rollout; with `forge-train rl --otlp`, its trace's root ended with the outcome, as forge-run does
        (this loop writes no `outcomes` row: the offline export's root has no outcome)."""
        with runner.tracing(self.dataset):
            outcome = runner.run_one(rollout)
            rules = Redactor.from_file(self.redact_rules) if self.redact_rules else runner.redactor
            runner.end_trace(outcome.session, outcome.row(rules))
        return outcome

    def _calls(self, session: str) -> list[dict[str, Any]]:
        """This rollout's calls only: the runner's barrier made them durable; the rest of the table is not read."""
        return session_rows(self.dataset, "calls", session, CALL_COLUMNS).to_pylist()

    def output(self, outcome: Outcome, calls: list[dict[str, Any]],
               served: int) -> AgentLoopOutput | list[AgentLoopOutput]:
        """What one finished rollout trains (public so it can be checked against recorded calls): with
        `forgerl.rows=last` the segment holding the graded call; with `thread` / `per_call` every segment
        (every call), last segment last, each with the rollout's reward (`segment_manager.py` weighs them)."""
        found = per_call(calls) if self.expansion.rows == "per_call" else segments(calls)
        reward = outcome.row()["reward"]
        extra: dict[str, Any] = {"forge_session": outcome.session, "forge_status": outcome.status,
                                 "forge_segments": len(found), "forge_infra_error": 0, "forge_overlong": 0,
                                 "forge_calls": served,
                                 "forge_malformed_tool_calls": sum(c.get("malformed_tool_calls") or 0 for c in calls)}
        if outcome.status == "infra_error" or reward is None or not found:
            log.warning("rollout %s: infrastructure failure, returned fully masked: %s", outcome.session,
                        outcome.error or "no served call was recorded")
            extra["forge_infra_error"] = 1
            masked = self._masked(0.0, extra)
            return masked if self.expansion.rows == "last" else [masked]
        if self.expansion.rows == "last":
            extra["forge_dropped_model_tokens"] = sum(s.model_tokens for s in found[:-1])
            return self._sample(found[-1], float(reward), extra, outcome.session)
        return [self._sample(seg, float(reward), dict(extra), outcome.session) for seg in found]

    def _sample(self, seg: Segment, reward: float, extra: dict[str, Any], session: str) -> AgentLoopOutput:
        extra["forge_segment_id"] = seg.sample_id(session)  # the stored segment, as forge-convert names it
        if len(seg.prompt_ids) > self.prompt_length or len(seg.response_ids) > self.response_length:
            log.warning("rollout %s: %d prompt + %d response tokens exceed rollout.prompt_length=%d / "
                        "response_length=%d; returned fully masked instead of truncating", session,
                        len(seg.prompt_ids), len(seg.response_ids), self.prompt_length, self.response_length)
            extra["forge_overlong"] = 1
            return self._masked(reward, extra)
        return AgentLoopOutput(prompt_ids=seg.prompt_ids, response_ids=seg.response_ids,
                               response_mask=seg.response_mask, response_logprobs=seg.response_logprobs,
                               reward_score=reward, num_turns=2 * seg.calls,
                               metrics=AgentLoopMetrics(), extra_fields=extra)

    def _masked(self, reward: float, extra: dict[str, Any]) -> AgentLoopOutput:
        return AgentLoopOutput(prompt_ids=[self.eos_id], response_ids=[self.eos_id], response_mask=[0],
                               response_logprobs=[0.0], reward_score=reward, num_turns=0,
                               metrics=AgentLoopMetrics(), extra_fields=extra)


def _task(info: dict[str, Any], tasks: str) -> Task:
    """The row's task: `extra_info.task_id` in the loop's task source (or the row's own `task_path`)."""
    path = info.get("task_path") or tasks
    if not path:
        raise ValueError("no task source: set `tasks` in the agent loop config or extra_info.task_path in the row")
    task_id = info.get("task_id")
    return find_task(Path(path), task_id) if task_id else load_task(Path(path))
