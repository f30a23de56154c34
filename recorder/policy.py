"""Policies the serve-mode gateway asks for completions, token ids in and out.

A policy takes the prompt as token ids (the gateway renders the chat
template, so the ids are exactly what the model conditions on) and returns
the generated ids with their logprobs: whole (`generate`) or, when it can,
as they are generated (`stream`, a series of `Delta`s; `deltas` gives one
whole delta for a policy that cannot stream). A `ChatPolicy` also has a
chat endpoint that renders the prompt itself, images included (`chat`, for
`serve_vl.py`). Three implementations:

- `HTTPPolicy`: an OpenAI-compatible server speaking vLLM's protocol:
  `POST /v1/completions` with `prompt` = token ids, `return_token_ids: true`
  and `logprobs: 1`; the ids come back in `choices[0].token_ids`, the
  sampled tokens' logprobs in `choices[0].logprobs.token_logprobs`. With
  `stream: true` each SSE chunk carries the same fields for the tokens it
  adds (vLLM's `CompletionResponseStreamChoice`), the last one the
  `finish_reason`; an error mid-stream is an `{"error": ...}` chunk. A
  server that answers a streamed request whole (JSON) is one delta. Its
  chat endpoint: `POST /v1/chat/completions` with `return_token_ids`, which
  returns `prompt_token_ids`, per-choice `token_ids` and `logprobs.content`.
- `ScriptedPolicy`: emits chosen texts as token sequences (logprob 0: a
  deterministic policy), so tests can make a real harness run real tools.
- veRL's rollout servers, through `forgerl.trainer.agent_loop` (Ray calls).

Whatever answers, it was trained on prompts in one chat template:
`check_trained_template` refuses to serve a tokenizer folder holding another
one than its checkpoint's `forgerl_policy.json` names.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import aiohttp

from forgerl.errors import UserError
from forgerl.schema.templates import POLICY_FILE, folder_template_sha256, template_file, trained_template_sha256

from .sse import SSEDecoder


@dataclass
class Sampling:
    """What the gateway asks for; the trainer's settings, not the harness's, decide sampling."""

    max_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (end of turn) | "length"

    def delta(self) -> Delta:
        """The whole generation as one streamed step."""
        return Delta(self.token_ids, self.logprobs, self.finish_reason)


@dataclass
class Delta:
    """The tokens a streaming policy adds in one step; the last delta names how the generation ended."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str | None = None  # "stop" | "length" on the last


class Policy(Protocol):
    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation: ...


class StreamingPolicy(Policy, Protocol):
    def stream(self, prompt_ids: list[int], sampling: Sampling) -> AsyncIterator[Delta]: ...


@runtime_checkable
class ChatPolicy(Protocol):
    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   sampling: Sampling) -> tuple[list[int], Generation]:
        """Chat messages in (the engine renders them): the prompt ids it used, and the generation."""
        ...


async def deltas(policy: Policy, prompt_ids: list[int], sampling: Sampling) -> AsyncIterator[Delta]:
    """The policy's generation as it comes: its own stream, or its whole generation as one delta."""
    stream = getattr(policy, "stream", None)
    if stream is not None:
        async for delta in stream(prompt_ids, sampling):
            yield delta
        return
    yield (await policy.generate(prompt_ids, sampling)).delta()


class PolicyError(Exception):
    """The policy server failed or answered something unusable: the harness gets a 502."""


class HTTPPolicy:
    """vLLM's OpenAI server (or anything speaking its token-in/token-out subset)."""

    def __init__(self, url: str, served_model: str, timeout_s: float = 600):
        self.url = url.rstrip("/")
        self.served_model = served_model
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        try:
            async with self._post(prompt_ids, sampling, False) as response:
                data = await response.json(content_type=None)
                if response.status != 200:
                    raise PolicyError(f"policy server answered {response.status}: {str(data)[:300]}")
        except (aiohttp.ClientError, ValueError) as e:
            raise PolicyError(f"policy server {self.url}: {e}") from e
        return _generation(data)

    async def stream(self, prompt_ids: list[int], sampling: Sampling) -> AsyncIterator[Delta]:
        try:
            async with self._post(prompt_ids, sampling, True) as response:
                if response.status != 200:
                    raise PolicyError(f"policy server answered {response.status}: {(await response.text())[:300]}")
                if response.content_type == "application/json":  # a server that does not stream answers whole
                    yield _generation(await response.json()).delta()
                    return
                decoder = SSEDecoder()
                async for chunk in response.content.iter_any():
                    for event in decoder.feed(chunk):
                        if event.data.strip() == "[DONE]":
                            return
                        yield _delta(event.data)
        except (aiohttp.ClientError, ValueError) as e:
            raise PolicyError(f"policy server {self.url}: {e}") from e
        raise PolicyError(f"policy server {self.url}: the stream ended without [DONE]")

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   sampling: Sampling) -> tuple[list[int], Generation]:
        """One chat completion: the prompt ids the engine rendered (images expanded), and the generation."""
        body = {"model": self.served_model, "messages": messages, "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": True,
                "return_token_ids": True, "skip_special_tokens": False, **sampling.extra}
        if tools:
            body["tools"] = tools
        try:
            async with self._client().post(f"{self.url}/v1/chat/completions", json=body) as response:
                data = await response.json(content_type=None)
                if response.status != 200:
                    raise PolicyError(f"policy chat endpoint answered {response.status}: {str(data)[:300]}")
        except (aiohttp.ClientError, ValueError) as e:
            raise PolicyError(f"policy chat endpoint {self.url}: {e}") from e
        if not isinstance(data, dict):
            raise PolicyError(f"policy chat endpoint {self.url} answered {str(data)[:300]}")
        choice = (data.get("choices") or [{}])[0]
        prompt_ids, token_ids = data.get("prompt_token_ids"), choice.get("token_ids")
        if not isinstance(prompt_ids, list) or not isinstance(token_ids, list):
            raise PolicyError(f"policy chat endpoint {self.url} returned no token ids (vLLM's return_token_ids)")
        content = (choice.get("logprobs") or {}).get("content")
        logprobs = [entry["logprob"] for entry in content] if content and len(content) == len(token_ids) else None
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return prompt_ids, Generation(token_ids, logprobs, finish)

    def _post(self, prompt_ids: list[int], sampling: Sampling, stream: bool) -> Any:
        body = {"model": self.served_model, "prompt": prompt_ids, "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": 1,
                "return_token_ids": True, "stream": stream, **sampling.extra}
        return self._client().post(f"{self.url}/v1/completions", json=body)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _generation(data: Any) -> Generation:
    ids, logprobs, finish = _choice(data)
    return Generation(token_ids=ids, logprobs=logprobs, finish_reason="length" if finish == "length" else "stop")


def _delta(data: str) -> Delta:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise PolicyError(f"policy stream sent a frame that is not JSON: {data[:200]}") from None
    ids, logprobs, finish = _choice(chunk)
    return Delta(ids, logprobs, None if finish is None else "length" if finish == "length" else "stop")


def _choice(data: Any) -> tuple[list[int], list[float] | None, str | None]:
    """(token ids, their logprobs, finish reason) of a completion body or stream chunk's first choice."""
    error = data.get("error") if isinstance(data, dict) else None
    if error:
        raise PolicyError(f"policy server failed: {error.get('message') if isinstance(error, dict) else error}")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PolicyError("policy answer has no choices")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        raise PolicyError("policy answer has no token_ids: serve it with vLLM (return_token_ids) or a compatible server")
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if values is not None and len(values) != len(ids):
        raise PolicyError(f"policy sent {len(values)} logprobs for {len(ids)} tokens")
    return list(ids), None if values is None else [float(v) for v in values], choice.get("finish_reason")


class TemplateMismatch(UserError):
    """Serve mode would render prompts in another chat template than the policy was trained on."""


def check_trained_template(tokenizer_dir: str) -> str | None:
    """Refuse (TemplateMismatch) a tokenizer folder whose chat template is not the one the policy was trained
    with, as its `forgerl_policy.json` names it (`--tokenizer` is normally the checkpoint folder: forge-train
    writes the tokenizer files and that file beside the weights). A folder that does not name one cannot be
    checked: the note to print is returned (None when the template was checked, or when the folder holds none,
    which `serve.load_tokenizer` refuses)."""
    try:
        served, trained = folder_template_sha256(tokenizer_dir), trained_template_sha256(tokenizer_dir)
    except ValueError as e:  # a tokenizer_config.json or policy file that is not JSON
        raise UserError(f"--tokenizer {tokenizer_dir}: {str(e).splitlines()[0]}") from None
    if served is None:
        return None
    if trained is None:
        return (f"{tokenizer_dir} has no {POLICY_FILE} naming the policy's chat_template_sha256: serving with its "
                f"chat template (sha256 {served}) unchecked")
    if trained != served:
        raise TemplateMismatch(
            f"--tokenizer {tokenizer_dir}: serve mode would render chat template sha256 {served} "
            f"({template_file(tokenizer_dir)}) but the policy was trained with sha256 {trained} "
            f"({Path(tokenizer_dir) / POLICY_FILE} chat_template_sha256): serve it with the tokenizer it was trained with")
    return None


Script = Callable[[str], str]
"""A scripted policy's turn: the rendered prompt text in, the turn's text (no end token) out."""


class ScriptedPolicy:
    """Says what `script` returns, tokenised, followed by the end-of-turn token."""

    def __init__(self, tokenizer: Any, script: Script):
        self.tokenizer = tokenizer
        self.script = script
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        text = self.script(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= sampling.max_tokens:
            ids = ids[:sampling.max_tokens]
            return Generation(ids, [0.0] * len(ids), "length")
        ids.append(self.eos_id)
        return Generation(ids, [0.0] * len(ids), "stop")

    async def stream(self, prompt_ids: list[int], sampling: Sampling) -> AsyncIterator[Delta]:
        """The same turn, one token at a time."""
        whole = await self.generate(prompt_ids, sampling)
        for n, token in enumerate(whole.token_ids):
            yield Delta([token], [0.0], whole.finish_reason if n == len(whole.token_ids) - 1 else None)


def turns(*texts: str) -> Script:
    """A script that says `texts` in order, one per call, then repeats the last."""
    said = [0]

    def script(prompt: str) -> str:
        text = texts[min(said[0], len(texts) - 1)]
        said[0] += 1
        return text

    return script
