"""Outcomes (the rewards) joined to the sessions they grade: counted, and refused where a reward would land on
rows it was not earned by.

A reward is trained into every row of its session, so one joined to the
wrong session teaches the wrong thing while every shape check passes. The
join is by session id; this module checks it against what the session's
own calls say about the rollout they belong to:

- the session id: the runner names each try's session after its task and
  attempt (`forgerl.schema.rollouts`), so an outcome whose task or attempt
  is not the one its session was named for sits on another rollout's rows;
- the harness the recorder identified from the calls (when it named one, not
  just an SDK);
- the policy version the calls were tagged with (when they carry one).

Refused (one line with the counts, exit 2, nothing written): a session
with several outcomes (the runner writes one per session: a retried infra
failure gets a fresh session, and only its last try an outcome; rows that
repeat an outcome exactly, as a replayed write does, count once), and an
outcome that disagrees with its session on task, attempt, harness or policy
version. Counted only, in the manifest's `joins`: outcomes whose session
has no calls (an infra error that never reached the model; no row takes
their reward), and sessions named as rollouts that have no outcome (the
earlier tries of a retried infra failure).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb

from forgerl.errors import UserError
from forgerl.recorder.harness import GENERIC_RANK
from forgerl.schema.rollouts import named_rollout, names_rollout

# What makes two outcome rows the same outcome (a row written twice) rather than two outcomes of one session.
_SAME = ("task_id", "attempt", "harness", "model", "policy_version", "status", "reward", "passed")
# The session's harness where the recorder named one (an SDK's or runtime's User-Agent names none: `GENERIC_RANK`).
_SESSIONS_SQL = f"""
SELECT c.session_id, CASE WHEN s.harness_rank > {GENERIC_RANK} THEN s.harness END AS harness, c.versions
FROM (SELECT session_id, list(DISTINCT policy_version) FILTER (WHERE policy_version IS NOT NULL) AS versions
      FROM calls GROUP BY 1) c
LEFT JOIN sessions s USING (session_id)
"""
REFUSED = ("several_outcomes", "task_disagrees", "harness_disagrees", "policy_version_disagrees")


class RewardJoinError(UserError):
    """Some reward cannot be joined to exactly its own session's rows."""


@dataclass
class Joins:
    """Each session's one outcome, and what joining them found."""

    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # session id -> its outcome row
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # refused kind -> its first case, in words

    def note(self, kind: str, example: str) -> None:
        self.counts[kind] += 1
        self.examples.setdefault(kind, example)

    def report(self) -> dict[str, int]:
        """The counts, every kind named (the manifest's `joins`)."""
        kinds = ("outcome_rows", "repeated_rows", "joined", "outcomes_without_session", "rollouts_without_outcome",
                 *REFUSED)
        return {kind: self.counts[kind] for kind in kinds}

    def refuse_broken(self) -> None:
        """RewardJoinError, one line with the counts, when any reward would be joined to rows not its own."""
        broken = {kind: self.counts[kind] for kind in REFUSED if self.counts[kind]}
        if not broken:
            return
        said = {"several_outcomes": "sessions with several outcomes",
                "task_disagrees": "outcomes whose task or attempt is not the one their session is named for",
                "harness_disagrees": "outcomes whose harness is not their session's",
                "policy_version_disagrees": "outcomes whose policy version is not their session's calls'"}
        parts = "; ".join(f"{said[kind]}: {n}, e.g. {self.examples[kind]}" for kind, n in broken.items())
        c = self.counts
        raise RewardJoinError(
            f"rewards cannot be joined to exactly their sessions' rows: {parts} (outcome rows {c['outcome_rows']}, "
            f"joined {c['joined']}, without a session {c['outcomes_without_session']}, rollouts without an outcome "
            f"{c['rollouts_without_outcome']}); fix or remove those outcome rows (forge-record delete)")


def join_outcomes(con: duckdb.DuckDBPyConnection) -> Joins:
    """Every outcome row joined to its session (the dataset's `outcomes` and `calls` views on `con`), counted
    and checked; refuse with `Joins.refuse_broken`."""
    joins = Joins()
    rows = con.sql("SELECT * FROM outcomes").to_arrow_table().to_pylist()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        joins.counts["outcome_rows"] += 1
        kept = by_session.setdefault(row["session_id"], [])
        if any(all(row[k] == other[k] for k in _SAME) for other in kept):
            joins.counts["repeated_rows"] += 1
        else:
            kept.append(row)
    sessions = {sid: (harness, versions or []) for sid, harness, versions in con.sql(_SESSIONS_SQL).fetchall()}
    for session_id, found in sorted(by_session.items()):
        if session_id not in sessions:
            joins.counts["outcomes_without_session"] += len(found)
            continue
        if len(found) > 1:
            tasks = ", ".join(f"{r['task_id']} attempt {r['attempt']}" for r in found)
            joins.note("several_outcomes", f"session {session_id}: {tasks}")
            continue
        _check(joins, session_id, found[0], *sessions[session_id])
    for session_id in sessions.keys() - by_session.keys():
        joins.counts["rollouts_without_outcome"] += named_rollout(session_id) is not None
    return joins


def _check(joins: Joins, session_id: str, outcome: dict[str, Any], harness: str | None, versions: list[str]) -> None:
    """Join one outcome to its session, or note how it disagrees with the session's calls."""
    task, attempt = outcome["task_id"], outcome["attempt"]
    if task is not None and attempt is not None and names_rollout(session_id, task, attempt) is False:
        joins.note("task_disagrees", f"the outcome of {task} attempt {attempt} is joined to session {session_id}")
    elif outcome["harness"] and harness and outcome["harness"] != harness:
        joins.note("harness_disagrees", f"session {session_id}: outcome {outcome['harness']}, calls {harness}")
    elif outcome["policy_version"] and versions and outcome["policy_version"] not in versions:
        joins.note("policy_version_disagrees",
                   f"session {session_id}: outcome {outcome['policy_version']}, calls {', '.join(sorted(versions))}")
    else:
        joins.counts["joined"] += 1
        joins.outcomes[session_id] = outcome
