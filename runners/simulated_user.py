"""The simulated user of tasks with a persona (ClawEval's `user_agent`): ClawEval's own `UserAgent` on the user
model `forge-run --user-model URL --user-model-name M` names, and the dialogue it holds with one harness session.

Rounds are counted as ClawEval's loop counts them (`claw_eval/runner/loop.py`):
the harness answers the prompt; its final answer goes to the simulated user,
whose reply (unless it says `[DONE]`) is sent to the same harness session as
the next user turn, prefixed `[user_agent]` as ClawEval's loop sends and logs
it (its graders split the dialogue there); each reply sent is a round, and
after `max_rounds` of them the harness's next answer ends the dialogue
unasked. A turn that ends without a final answer (the harness failed or ran
out of time) ends it too. The user model's key is read from
FORGE_USER_MODEL_API_KEY, else OPENAI_API_KEY, when it is called (never
stored). A user model that cannot be reached is an infra failure of the
rollout, never an end of the dialogue: `UserAgent` itself retries 30 times
and then reads as `[DONE]`, so its calls are cut short here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from forgerl.harnesses import Harness

KEY_VARIABLES = ("FORGE_USER_MODEL_API_KEY", "OPENAI_API_KEY")
NO_KEY = "forgerl-no-key"  # a local model needs none, a pod's model-keys sidecar adds the real one; OpenAI needs one
USER_TURN_PREFIX = "[user_agent]\n"  # claw_eval's loop: Message(role="user", text=f"[user_agent]\n{reply}")
CALL_TIMEOUT_S = 300.0
CALL_RETRIES = 2  # the OpenAI client's own, with its backoff, on connection errors, 429 and 5xx


class UserModelError(RuntimeError):
    """The user model could not answer: the rollout is an infra failure."""


@dataclass(frozen=True)
class Persona:
    """A task's simulated user: who it is (the user model's brief), how many replies it may send, and what it
    said first (the task's prompt, without instructions the harness gets beside it)."""

    text: str
    max_rounds: int
    opening: str


@dataclass(frozen=True)
class UserModel:
    """An OpenAI-compatible chat model playing the simulated user (`forge-run --user-model URL
    --user-model-name M`)."""

    url: str  # the API base, e.g. http://host:8000/v1
    model: str


@dataclass
class Rounds:
    """How a dialogue went, as ClawEval's CLI reports it (`user_agent_meta`)."""

    rounds_used: int = 0
    max_rounds: int = 0
    done_reached: bool = False

    def meta(self) -> dict[str, Any]:
        return asdict(self)


class _Failed(BaseException):
    """Leaves `UserAgent.generate_response`'s retry loop (it catches Exception, and after 30 tries reads as
    `[DONE]`) at the first failed call."""


class _FailFast:
    """An OpenAI client whose `chat.completions.create` raises `_Failed` where it would raise."""

    def __init__(self, client: Any):
        self._create = client.chat.completions.create
        self.chat = self.completions = self

    def create(self, **kwargs: Any) -> Any:
        try:
            return self._create(**kwargs)
        except Exception as e:  # noqa: BLE001 - any failure of the call, reported as the rollout's infra error
            raise _Failed(f"{type(e).__name__}: {e}") from None


class SimulatedUser:
    """ClawEval's `UserAgent` (its prompt, its `[DONE]` rule) on `model`."""

    def __init__(self, model: UserModel):
        from claw_eval.runner.user_agent import UserAgent
        from openai import OpenAI

        key = next((os.environ[k] for k in KEY_VARIABLES if os.environ.get(k)), NO_KEY)
        self.url = model.url
        self._agent = UserAgent(model_id=model.model, api_key=key, base_url=model.url)
        client = OpenAI(api_key=key, base_url=model.url, timeout=CALL_TIMEOUT_S, max_retries=CALL_RETRIES)
        self._agent.client = _FailFast(client)

    def reply(self, persona: Persona, dialogue: list[tuple[str, str]]) -> str | None:
        """The user's reply to the dialogue so far ((role, text) pairs, user turns as sent), None once satisfied
        (`[DONE]`); UserModelError when the model cannot answer."""
        from claw_eval.models.content import TextBlock
        from claw_eval.models.message import Message

        messages = [Message(role=role, content=[TextBlock(text=text)]) for role, text in dialogue]
        try:
            return self._agent.generate_response(persona=persona.text, conversation_messages=messages)
        except _Failed as e:
            raise UserModelError(f"the user model at {self.url} failed: {e}") from None


def refusal(user: UserModel | None, harness: Harness) -> str:
    """Why this run leaves out tasks with a persona ("": it holds their dialogues)."""
    needs = "needs a simulated user (user_agent persona)"
    if user is None:
        return f"{needs}: give forge-run --user-model URL --user-model-name M"
    if not harness.resumes:
        return f"{needs}, and {harness.name} cannot resume its session to send it the user's replies"
    return ""


def hold_dialogue(turn: Callable[[str | None], str | None], persona: Persona, user: SimulatedUser) -> Rounds:
    """Run the harness on the prompt (`turn(None)`), then each of the user's replies in the same session
    (`turn(message)`), as ClawEval's loop does; `turn` returns the harness's final answer (None: the turn ended
    without one, which ends the dialogue)."""
    rounds = Rounds(max_rounds=persona.max_rounds)
    dialogue = [("user", persona.opening)]
    answer = turn(None)
    while answer is not None and rounds.rounds_used < persona.max_rounds:
        dialogue.append(("assistant", answer))
        reply = user.reply(persona, dialogue)
        if reply is None:
            rounds.done_reached = True
            break
        message = USER_TURN_PREFIX + reply
        dialogue.append(("user", message))
        rounds.rounds_used += 1
        answer = turn(message)
    return rounds
