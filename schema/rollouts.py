"""A rollout's session id, which names the rollout it belongs to.

The runner gives each try of a rollout a fresh session, named after its
task and attempt with a random suffix (a retried infra failure never shares
calls with its retry). So the calls themselves say which rollout they are,
and whoever joins an outcome row to a session (`forge-convert`) can check
that the outcome's task and attempt are the ones its session was named for.
"""

from __future__ import annotations

import re
import uuid

TASK_CHARS = 48  # of the task id kept in the name
_NAMED = re.compile(r"(?P<task>.*)-a(?P<attempt>\d+)-[0-9a-f]{8}")


def rollout_session(task_id: str, attempt: int) -> str:
    """A fresh session id for one try of (task, attempt)."""
    return f"{task_id[:TASK_CHARS]}-a{attempt}-{uuid.uuid4().hex[:8]}"


def named_rollout(session_id: str) -> tuple[str, int] | None:
    """(task id as kept in the name, attempt) of a session `rollout_session` named; None for any other id."""
    match = _NAMED.fullmatch(session_id)
    return (match["task"], int(match["attempt"])) if match else None


def names_rollout(session_id: str, task_id: str, attempt: int) -> bool | None:
    """Whether the session was named for this (task, attempt); None when its id is not a rollout's name."""
    named = named_rollout(session_id)
    return None if named is None else named == (task_id[:TASK_CHARS], attempt)
