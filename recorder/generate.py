"""Serve mode's generation seam: a harness's call in, the prompt the policy conditions on and its tokens out.

The gateway (`serve.py`) parses the call and writes the answer in the harness's API; in between, a
`Generator` generates the turn. `start` gives the prompt (its token ids, and the earlier answer it
continues) and the generated ids as they come (`Delta`s, with logprobs and the finish reason on the
last). A generator writes no response: the turn's parsing, streaming, finishing and headers are the
gateway's. Two implementations:

- `TokenGenerator` (here): token ids in. It renders the chat template itself (`PromptBuilder`) and asks a
  token-in/token-out policy (vLLM's `/v1/completions` with prompt ids, veRL's rollout servers) for a
  completion of exactly those ids, streamed where the policy can.
- `ChatGenerator` (`serve_vl.py`): the policy's chat endpoint, for calls that hold images. The engine
  renders those itself and returns the prompt ids it used.

Token continuity: harnesses resend the whole history each call. When a request's messages continue an
earlier answer (its input + its output + new tool results or user turns), the prompt is that earlier
call's prompt ids + the ids the model generated + only the newly rendered tail, so a rollout is one token
sequence exactly as the model produced it (no re-tokenisation drift, no `<think>` stripped from history).
Otherwise the whole conversation is rendered afresh (a new segment: compaction, subagents, edited
history). Each prompt names the answer it continues (`Prompt.continues`), which the gateway sends on.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from forgerl.schema.messages import Exchange, canonical_json, sha256_hex

from .apis.answer import new_id
from .policy import Delta, Policy, Sampling, deltas

# Rendering and encoding a prompt costs about 0.1-0.4 ms per KiB of request (the encode dominates), and blocks
# every other call's stream while it runs on the loop. Requests up to this size build on the loop, which saves a
# worker-thread hop (0.5 ms and up on a busy machine) from their time to first token; larger ones build on a thread.
_INLINE_PROMPT_BYTES = 4096


@dataclass(frozen=True)
class Call:
    """A harness's call as a generator reads it: the parsed exchange (images and all), its conversation in the
    chat template's terms, the sampling the gateway grants, and the request's size in bytes where known."""

    exchange: Exchange
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: Sampling
    size: int | None = None


@dataclass
class Prompt:
    ids: list[int]
    continues: str | None  # the answer whose ids it is built on (None: rendered afresh, a new segment)
    answer_id: str = field(default_factory=lambda: new_id("fa_"))  # names the answer to this prompt


class Started(NamedTuple):
    """A generation under way: its prompt, and the generated tokens as they come (close it to stop them)."""

    prompt: Prompt
    deltas: AsyncIterator[Delta]


class Generator(Protocol):
    async def start(self, call: Call) -> Started:
        """The call's prompt and its generation; raises `PolicyError` if the policy fails before the first token."""
        ...


class PromptBuilder:
    """Chat messages to prompt ids, continuing earlier answers' token ids where the history allows."""

    def __init__(self, tokenizer: Any, remember: int = 4096, chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.kwargs = dict(chat_template_kwargs or {})
        self._known: OrderedDict[str, tuple[list[int], str]] = OrderedDict()  # prefix key -> ids, answer id
        self._remember = remember

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt, **self.kwargs)

    def build(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Prompt:
        full = self.render(messages, tools, True)
        found = self._latest(messages, tools)
        if found is not None:
            k, ids, answer = found
            # The tail starts right after the end-of-turn token that closes message k-1 in the full
            # render. Found by counting those tokens, not by comparing prefixes: templates render the
            # last message differently (Qwen3 adds an empty <think> block to a final assistant turn).
            turns = self.render(messages[:k], tools, False).count(self.tokenizer.eos_token)
            end = _nth(full, self.tokenizer.eos_token, turns)
            if end >= 0:
                return Prompt(ids + self.tokenizer.encode(full[end:], add_special_tokens=False), answer)
        return Prompt(self.tokenizer.encode(full, add_special_tokens=False), None)

    def continued(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  prompt_ids: list[int]) -> str | None:
        """The earlier answer that a prompt the engine rendered itself continues: its history repeats that answer's
        conversation and `prompt_ids` extend that answer's ids (both are checked: the ids were not built here)."""
        found = self._latest(messages, tools)
        if found is None:
            return None
        _, ids, answer = found
        return answer if prompt_ids[:len(ids)] == ids else None

    def remember(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 answer: list[dict[str, Any]], ids: list[int], answer_id: str) -> None:
        """An answer that ended its turn: later requests that repeat it continue from `ids`."""
        if not ids or ids[-1] != self.eos_id:
            return
        key = _prefix_keys(messages + answer, tools)[-1]
        self._known[key] = (ids, answer_id)
        self._known.move_to_end(key)
        while len(self._known) > self._remember:
            self._known.popitem(last=False)

    def _latest(self, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None) -> tuple[int, list[int], str] | None:
        """(k, ids, answer id) of the remembered answer whose conversation is the longest prefix messages[:k]."""
        keys = _prefix_keys(messages, tools)
        for k in range(len(messages), 0, -1):
            known = self._known.get(keys[k])
            if known is not None:
                return k, *known
        return None


def _nth(text: str, token: str, n: int) -> int:
    """The index just past the n-th occurrence of `token` in `text` (-1 if there are fewer)."""
    at = 0
    for _ in range(n):
        found = text.find(token, at)
        if found < 0:
            return -1
        at = found + len(token)
    return at if n else -1


def _prefix_keys(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[str]:
    """keys[k] identifies (tools, messages[:k]); chained, so all prefixes cost one pass over the history."""
    keys = [sha256_hex(canonical_json(tools or []))]
    for message in messages:
        keys.append(sha256_hex(keys[-1] + canonical_json(message)))
    return keys


class TokenGenerator:
    """Token ids in: the prompt rendered here, continuing earlier answers' ids; the policy completes those ids."""

    def __init__(self, policy: Policy, prompts: PromptBuilder):
        self.policy = policy
        self.prompts = prompts

    async def start(self, call: Call) -> Started:
        if call.size is not None and call.size <= _INLINE_PROMPT_BYTES:  # no thread hop before the first token
            prompt = self.prompts.build(call.messages, call.tools)
        else:  # a long render on a worker thread, so the other calls' streams keep flowing
            prompt = await asyncio.to_thread(self.prompts.build, call.messages, call.tools)
        return Started(prompt, deltas(self.policy, prompt.ids, call.sampling))
