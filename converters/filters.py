"""Which sessions and samples a run keeps, and why the others were dropped."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from .samples import Sample
from .solve_rate import PassRates, SolveRate, pass_rates
from .source import Session


@dataclass
class Filters:
    models: frozenset[str] = frozenset()
    since: datetime | None = None
    until: datetime | None = None
    min_reward: float | None = None
    outcomes: frozenset[str] = frozenset()
    error_free: bool = False
    min_turns: int | None = None
    max_turns: int | None = None
    solve_rate: SolveRate | None = None
    pass_rates: PassRates = field(default_factory=PassRates)  # read when solve_rate is set

    def with_pass_rates(self, root: Path) -> Filters:
        """These filters with the dataset's task pass rates, which `--solve-rate` compares (read once per run)."""
        return replace(self, pass_rates=pass_rates(root, self.solve_rate.scope)) if self.solve_rate else self

    def describe(self) -> dict:
        """The filters a run applied, as the manifest records them (unset ones left out), so a shard set says
        which sessions it kept: `--solve-rate` with the scope its rates were counted in."""
        set_ = {"models": sorted(self.models), "since": self.since and self.since.isoformat(),
                "until": self.until and self.until.isoformat(), "min_reward": self.min_reward,
                "outcomes": sorted(self.outcomes), "error_free": self.error_free, "min_turns": self.min_turns,
                "max_turns": self.max_turns}
        if self.solve_rate:
            scope = self.solve_rate.scope
            set_["solve_rate"] = {"min": self.solve_rate.low, "max": self.solve_rate.high,
                                  "harness": scope.harness, "model": scope.model,
                                  "policy_version": scope.policy_version}
        return {k: v for k, v in set_.items() if v not in (None, [], False)}

    def session_reason(self, session: Session) -> str | None:
        """Why a session is dropped, or None to keep it."""
        started = session.started
        if self.since and (started is None or started < self.since):
            return "before --since"
        if self.until and (started is None or started >= self.until):
            return "after --until"
        if self.min_reward is not None and (session.reward is None or session.reward < self.min_reward):
            return "reward below --min-reward (or no outcome)"
        if self.outcomes and (session.outcome or {}).get("status") not in self.outcomes:
            return "outcome not in --outcome"
        if self.error_free and not all(c.ok for c in session.calls):
            return "has failed calls (--error-free)"
        if self.solve_rate:
            return self._solve_rate_reason(session)
        return None

    def _solve_rate_reason(self, session: Session) -> str | None:
        rate = self.pass_rates.rate(session.session_id, (session.outcome or {}).get("task_id"), self.solve_rate.scope)
        if rate is None:
            return "no scored attempt of its task in the --solve-rate scope"
        return None if rate in self.solve_rate else "task pass rate outside --solve-rate"

    def sample_reason(self, sample: Sample) -> str | None:
        if self.models and sample.provenance()["model"] not in self.models:
            return "model not in --model"
        if self.min_turns is not None and sample.turns < self.min_turns:
            return "fewer turns than --min-turns"
        if self.max_turns is not None and sample.turns > self.max_turns:
            return "more turns than --max-turns"
        return None

