"""A scripted model server: the upstream that tests, `make demo` and benchmarks put behind the recorder.

Why it exists: the recorder has to be exercised over real HTTP -- real SSE
framing, real WebSockets, real faults -- without a paid API or a GPU, and its
latency has to be measured against an upstream that costs (almost) nothing per
request. This server answers like the model APIs that harnesses speak, with
whatever a `Script` says the model "says" on each call:

* Anthropic Messages: ``POST /v1/messages`` (any query, e.g. ``?beta=true``)
  and ``POST /v1/messages/count_tokens``;
* OpenAI Responses: ``POST /v1/responses`` (SSE or JSON) and a WebSocket on
  ``GET /v1/responses`` (Codex: one ``{"type": "response.create", ...}`` text
  frame in, the stream events out, one JSON text frame each);
* OpenAI Chat Completions ``POST /v1/chat/completions``, legacy
  ``POST /v1/completions`` and ``GET /v1/models``.

Paths match on their suffix, so ``/openai/v1/chat/completions`` works too; a
``/s/<session>/`` prefix (or an ``X-Forge-Session`` header) names the session,
and a ``/fault/<kind>/`` prefix (or an ``X-Scripted-Fault`` header) injects a
fault: ``500``, ``429``, ``timeout``, ``reset``, ``malformed``, ``nonjson``,
``big``, ``error_event`` or ``unknown`` (see `FAULTS`). Faults that carry no
model answer (500, 429, timeout, nonjson, big, unknown) do not call the script,
so they do not use up a `sequence` turn; the stream faults (reset, malformed,
error_event) do, and strike right after the first delta event.

Answers are reproducible: ids derive from a digest of the path, the request
bytes and the turn, and timestamps are the server's start time, so the same
request answered with the same turn gets the same bytes (a call made directly
can be compared with one made through the recorder). Codex's WebSocket warm-up
(``generate: false``) gets an empty response without asking the script.

Token ids are deterministic fakes, so vLLM-style answers (``return_token_ids``,
``logprobs``) are reproducible: a text's tokens are its whitespace-separated
words (each streamed piece carries its leading whitespace), a token's id is
``crc32(word) % 50000`` and its logprob ``-(crc32(word) % 1000) / 1000``.
Usage counts the same tokens: input = words of the request's message text,
output = words of thinking + text + tool arguments, unless `Turn.usage` says
otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import re
import resource
import signal
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from aiohttp import WSMsgType, web

__all__ = [
    "FAULTS",
    "LoggedExchange",
    "Request",
    "Script",
    "ScriptedUpstream",
    "ToolCall",
    "Turn",
    "echo",
    "last_user_text",
    "main",
    "saw_tool_result",
    "sequence",
    "tool_loop",
    "token_ids",
]

FAULTS = ("500", "429", "timeout", "reset", "malformed", "nonjson", "big", "error_event", "unknown")
_STREAM_FAULTS = ("reset", "malformed", "error_event")
_MAX_BODY = 1 << 30
_BIG_TEXT_BYTES = 50_000_000


# --- what a script says, and what it is told ---------------------------------------------------


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None  # generated (toolu_… / call_…) when None


@dataclass
class Turn:
    """What the model "says" on one call."""

    text: str = ""
    thinking: str | None = None  # Anthropic thinking block, Responses reasoning item, chat reasoning_content
    tool_calls: list[ToolCall] = field(default_factory=list)  # several = parallel tool calls
    stop_reason: str | None = None  # None: tool_use/tool_calls/end_turn/stop as the API says it
    # Overrides, by Anthropic's names: input_tokens (uncached), output_tokens, cache_read_input_tokens,
    # cache_creation_input_tokens, reasoning_tokens; prompt_tokens/completion_tokens/cached_tokens also work.
    usage: dict[str, int] | None = None


@dataclass
class Request:
    api: str  # "anthropic" | "responses" | "chat" | "completions"
    path: str  # without the /s/… and /fault/… prefixes and the query
    headers: dict[str, str]
    body: dict[str, Any]
    session: str = ""


Script = Callable[[Request], Turn]


@dataclass
class LoggedExchange:
    """One request as received (header names lower-cased) and the exact bytes answered.

    A WebSocket is one exchange: `body` holds the client's frames and
    `response_body` the server's, each newline-joined.
    """

    method: str
    path: str  # as received, query included
    headers: dict[str, str]
    body: bytes
    status: int | None = None  # None while unanswered (e.g. the timeout fault)
    _sent: list[bytes] = field(default_factory=list, repr=False)
    _sep: bytes = field(default=b"", repr=False)

    @property
    def response_body(self) -> bytes:
        return self._sep.join(self._sent)


def sequence(*turns: Turn) -> Script:
    """Reply `turns` in order, counted per session; the last one repeats."""
    if not turns:
        raise ValueError("sequence() needs at least one turn")
    calls: dict[str, int] = {}

    def script(request: Request) -> Turn:
        n = calls.get(request.session, 0)
        calls[request.session] = n + 1
        return turns[min(n, len(turns) - 1)]

    return script


def saw_tool_result(request: Request) -> bool:
    """Is the request's latest input a tool result (in any of the APIs)?"""
    items = request.body.get("messages") or request.body.get("input") or []
    last = items[-1] if isinstance(items, list) and items else {}
    if not isinstance(last, dict):
        return False
    if last.get("role") == "tool" or last.get("type") in ("function_call_output", "custom_tool_call_output"):
        return True
    content = last.get("content")
    return isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content)


def tool_loop(act: Turn, answer: Turn) -> Script:
    """Reply `act` (which calls tools) until a tool result comes back, then `answer`.

    Keyed on the request, not on a counter, so it works for any number of
    sessions behind a recorder that strips their ids.
    """
    return lambda request: answer if saw_tool_result(request) else act


def echo() -> Script:
    """Reply ``echo: <last user text>``, no tools."""
    return lambda request: Turn(text=f"echo: {last_user_text(request)}")


def last_user_text(request: Request) -> str:
    """The text of the last user message (or the prompt) of any of the APIs."""
    body = request.body
    items = body.get("messages", body.get("input", body.get("prompt")))
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if isinstance(item, str):
            return item
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            parts = content if isinstance(content, list) else []
            return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


# --- fake tokens ---------------------------------------------------------------------------------

_WORD = re.compile(r"\s*\S+(?:\s+$)?")  # one word with the whitespace before it (and any after the last)
_TEXT_KEYS = ("system", "instructions", "messages", "input", "prompt", "content", "text", "thinking", "output",
              "arguments")  # where request text lives, in any of the APIs


def token_ids(text: str) -> list[int]:
    """Fake token ids: one per whitespace-separated word, ``crc32(word) % 50000``."""
    return [zlib.crc32(w.encode()) % 50000 for w in text.split()]


def _logprob(piece: str) -> float:
    return -(zlib.crc32(piece.strip().encode()) % 1000) / 1000


def _split(text: str, n: int | None = None) -> list[str]:
    """Stream pieces of `text`: one per word, or exactly `n` (whole words when there are enough)."""
    words = _WORD.findall(text) or ([text] if text else [])
    if not n or len(words) == n:
        return words
    units = words if len(words) > n else list(text)  # too few words: cut characters instead
    size, extra = divmod(len(units), n)
    bounds = [0, *itertools.accumulate(size + (i < extra) for i in range(n))]
    return ["".join(units[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def _prompt_text(body: dict[str, Any]) -> str:
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for key in _TEXT_KEYS:
                if key in value:
                    walk(value[key])

    walk(body)
    return " ".join(out)


_json: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# --- one answer, made concrete once so every rendering of it agrees ------------------------------


class _Reply:
    """`digest` names the answer (ids derive from it); `created` is a timestamp."""

    def __init__(self, request: Request, turn: Turn, chunks: int | None, digest: str, created: int) -> None:
        self.request, self.turn, self.body = request, turn, request.body
        self.id, self.created = digest, created
        self.model = str(self.body.get("model") or "scripted")
        self.seq = itertools.count()  # Responses sequence_number
        prefix = "toolu_" if request.api == "anthropic" else "call_"
        self.calls = [(c.id or f"{prefix}{digest[:22]}{i:02d}", c.name, json.dumps(c.arguments))
                      for i, c in enumerate(turn.tool_calls)]
        self.chunks = chunks
        self.want_ids = self.body.get("return_token_ids") is True
        self.want_logprobs = bool(self.body.get("logprobs"))

    @cached_property
    def text_pieces(self) -> list[str]:
        return _split(self.turn.text, self.chunks)

    @cached_property
    def prompt_ids(self) -> list[int]:
        prompt = self.body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt  # token in, token out
        return token_ids(_prompt_text(self.body))

    @cached_property
    def output_ids(self) -> list[int]:
        if self.request.api == "completions":  # text only: it has no thinking or tool calls to render
            return token_ids(self.turn.text)
        return token_ids(" ".join([self.turn.thinking or "", self.turn.text, *(args for _, _, args in self.calls)]))

    @cached_property
    def usage(self) -> dict[str, int]:
        aliases = {"prompt_tokens": "input_tokens", "completion_tokens": "output_tokens",
                   "cached_tokens": "cache_read_input_tokens"}
        given = {aliases.get(k, k): v for k, v in (self.turn.usage or {}).items()}
        count = {
            "input_tokens": lambda: len(self.prompt_ids),
            "output_tokens": lambda: len(self.output_ids),
            "reasoning_tokens": lambda: len(token_ids(self.turn.thinking or "")),
            "cache_read_input_tokens": lambda: 0,
            "cache_creation_input_tokens": lambda: 0,
        }
        return {k: given[k] if k in given else f() for k, f in count.items()}

    @property
    def openai_input_tokens(self) -> int:  # OpenAI counts cached input inside the input
        u = self.usage
        return u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]

    @cached_property
    def signature(self) -> str:
        return base64.b64encode(hashlib.sha256((self.turn.thinking or "").encode()).digest() * 2).decode()

    @cached_property
    def encrypted_content(self) -> str:
        return "gAAAAA" + base64.b64encode((self.turn.thinking or "").encode()).decode()


# Markers in a stream of (event name, payload) items.
_PAUSE = object()  # between text deltas: sleep chunk_delay
_RESET = object()  # abort the connection here
_DONE = object()  # chat's `data: [DONE]`
_MALFORMED = object()  # a frame whose data is not JSON
Item = Any  # tuple[str, dict] | one of the markers


def _paced(pieces: Iterable[str], event: Callable[[str], tuple[str, dict]]) -> Iterator[Item]:
    for i, piece in enumerate(pieces):
        if i:
            yield _PAUSE
        yield event(piece)


def _prewarm(request: Request) -> bool:
    """Codex's WebSocket warm-up, `generate: false`: answered with an empty response, not by the script."""
    return request.api == "responses" and request.body.get("generate") is False


def _openai_error(kind: str, message: str, code: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _openai_error_for(status: int, message: str) -> dict[str, Any]:
    kinds = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_exceeded"}
    return _openai_error(kinds.get(status, "server_error"), message)


# --- renderers: one per API, each a whole answer (`body`) and the same answer streamed (`events`)


class _Anthropic:
    named = True  # SSE frames carry `event:` lines
    delta_event = "content_block_delta"
    error_types = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 500: "api_error"}

    def error(self, status: int, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_types.get(status, "api_error"), "message": message}}

    def usage(self, r: _Reply) -> dict[str, int]:
        keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
        return {k: r.usage[k] for k in keys}

    def blocks(self, r: _Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if r.turn.thinking is not None:
            blocks.append({"type": "thinking", "thinking": r.turn.thinking, "signature": r.signature})
        if r.turn.text or not r.calls:
            blocks.append({"type": "text", "text": r.turn.text})
        for (cid, name, _), call in zip(r.calls, r.turn.tool_calls):
            blocks.append({"type": "tool_use", "id": cid, "name": name, "input": call.arguments})
        return blocks

    def body(self, r: _Reply) -> dict[str, Any]:
        stop = r.turn.stop_reason or ("tool_use" if r.calls else "end_turn")
        return {"id": f"msg_{r.id}", "type": "message", "role": "assistant", "model": r.model,
                "content": self.blocks(r), "stop_reason": stop, "stop_sequence": None, "usage": self.usage(r)}

    def events(self, r: _Reply) -> Iterator[Item]:
        whole = self.body(r)
        start = {**whole, "content": [], "stop_reason": None, "usage": {**whole["usage"], "output_tokens": 1}}
        yield "message_start", {"type": "message_start", "message": start}
        yield "ping", {"type": "ping"}
        for i, block in enumerate(whole["content"]):
            kind = block["type"]
            empty = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                     "text": {"type": "text", "text": ""}}.get(kind, {**block, "input": {}})
            yield "content_block_start", {"type": "content_block_start", "index": i, "content_block": empty}

            def delta(d: dict[str, Any], i: int = i) -> tuple[str, dict]:
                return "content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}

            if kind == "thinking":
                for piece in _split(block["thinking"]):
                    yield delta({"type": "thinking_delta", "thinking": piece})
                yield delta({"type": "signature_delta", "signature": block["signature"]})
            elif kind == "text":
                yield from _paced(r.text_pieces, lambda p: delta({"type": "text_delta", "text": p}))
            else:
                for piece in ["", *_split(json.dumps(block["input"]))]:
                    yield delta({"type": "input_json_delta", "partial_json": piece})
            yield "content_block_stop", {"type": "content_block_stop", "index": i}
        stop = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
        yield "message_delta", {"type": "message_delta", "delta": stop, "usage": whole["usage"]}
        yield "message_stop", {"type": "message_stop"}

    def error_events(self, r: _Reply) -> list[Item]:
        error = {"type": "overloaded_error", "message": "Overloaded (scripted fault)"}
        return [("error", {"type": "error", "error": error})]


class _Responses:
    named = True
    delta_event = "response.output_text.delta"

    def error(self, status: int, message: str) -> dict[str, Any]:
        return _openai_error_for(status, message)

    def items(self, r: _Reply) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if _prewarm(r.request):
            return items
        if r.turn.thinking is not None:
            items.append({"id": f"rs_{r.id}", "type": "reasoning", "encrypted_content": r.encrypted_content,
                          "summary": [{"type": "summary_text", "text": r.turn.thinking}]})
        if r.turn.text or not r.calls:
            items.append({"id": f"msg_{r.id}", "type": "message", "status": "completed", "role": "assistant",
                          "content": [self.text_part(r.turn.text)]})
        for cid, name, args in r.calls:
            items.append({"id": f"fc_{cid}", "type": "function_call", "status": "completed",
                          "call_id": cid, "name": name, "arguments": args})
        return items

    @staticmethod
    def text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    @staticmethod
    def status(r: _Reply) -> str:
        return "incomplete" if r.turn.stop_reason in ("max_tokens", "max_output_tokens", "length") else "completed"

    def body(self, r: _Reply, status: str | None = None, output: list | None = None) -> dict[str, Any]:
        status = status or self.status(r)
        get = r.body.get
        u, n_in = r.usage, r.openai_input_tokens
        usage = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": u["cache_read_input_tokens"]},
                 "output_tokens": u["output_tokens"],
                 "output_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
                 "total_tokens": n_in + u["output_tokens"]}
        done = status in ("completed", "incomplete")
        return {"id": f"resp_{r.id}", "object": "response", "created_at": r.created, "status": status,
                "model": r.model, "output": self.items(r) if output is None else output,
                "usage": usage if done else None, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": get("instructions"), "metadata": get("metadata") or {},
                "parallel_tool_calls": get("parallel_tool_calls", True), "tool_choice": get("tool_choice", "auto"),
                "tools": get("tools") or [], "temperature": get("temperature", 1.0), "top_p": get("top_p", 1.0),
                "reasoning": get("reasoning"), "text": get("text") or {"format": {"type": "text"}},
                "store": get("store", False), "truncation": "disabled"}

    def event(self, r: _Reply, kind: str, **data: Any) -> tuple[str, dict]:
        name = f"response.{kind}"
        return name, {"type": name, "sequence_number": next(r.seq), **data}

    def events(self, r: _Reply) -> Iterator[Item]:
        ev = self.event
        yield ev(r, "created", response=self.body(r, "in_progress", []))
        yield ev(r, "in_progress", response=self.body(r, "in_progress", []))
        for n, item in enumerate(self.items(r)):
            at = {"item_id": item["id"], "output_index": n}
            kind = item["type"]
            empty = {"reasoning": {"summary": []}, "message": {"status": "in_progress", "content": []},
                     "function_call": {"status": "in_progress", "arguments": ""}}[kind]
            yield ev(r, "output_item.added", output_index=n, item={**item, **empty})
            if kind == "reasoning":
                part = {"type": "summary_text", "text": ""}
                yield ev(r, "reasoning_summary_part.added", **at, summary_index=0, part=part)
                for piece in _split(r.turn.thinking or ""):
                    yield ev(r, "reasoning_summary_text.delta", **at, summary_index=0, delta=piece)
                yield ev(r, "reasoning_summary_text.done", **at, summary_index=0, text=r.turn.thinking)
                yield ev(r, "reasoning_summary_part.done", **at, summary_index=0, part=item["summary"][0])
            elif kind == "message":
                yield ev(r, "content_part.added", **at, content_index=0, part=self.text_part(""))
                yield from _paced(r.text_pieces, lambda p: ev(r, "output_text.delta", **at, content_index=0,
                                                              delta=p, logprobs=[]))
                yield ev(r, "output_text.done", **at, content_index=0, text=r.turn.text, logprobs=[])
                yield ev(r, "content_part.done", **at, content_index=0, part=item["content"][0])
            else:
                for piece in _split(item["arguments"]):
                    yield ev(r, "function_call_arguments.delta", **at, delta=piece)
                yield ev(r, "function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
            yield ev(r, "output_item.done", output_index=n, item=item)
        status = self.status(r)
        yield ev(r, status, response=self.body(r, status))

    def error_events(self, r: _Reply) -> list[Item]:
        error = {"code": "server_error", "message": "scripted fault: error_event"}
        failed = {**self.body(r, "failed", []), "error": error}
        return [self.event(r, "failed", response=failed)]


class _Chat:
    named = False
    delta_event = None
    objects = ("chat.completion", "chat.completion.chunk")
    id_prefix = "chatcmpl-"

    def error(self, status: int, message: str) -> dict[str, Any]:
        return _openai_error_for(status, message)

    def usage(self, r: _Reply) -> dict[str, Any]:
        u, n_in = r.usage, r.openai_input_tokens
        return {"prompt_tokens": n_in, "completion_tokens": u["output_tokens"],
                "total_tokens": n_in + u["output_tokens"],
                "prompt_tokens_details": {"cached_tokens": u["cache_read_input_tokens"]},
                "completion_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]}}

    def stop(self, r: _Reply) -> str:
        return r.turn.stop_reason or ("tool_calls" if r.calls else "stop")

    def logprobs(self, text: str) -> dict[str, Any]:
        return {"content": [{"token": p, "logprob": _logprob(p), "bytes": list(p.encode()), "top_logprobs": []}
                            for p in _WORD.findall(text)]}

    def envelope(self, r: _Reply, chunk: bool, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {"id": self.id_prefix + r.id, "object": self.objects[chunk], "created": r.created, "model": r.model,
                "choices": choices, **extra}

    def choice(self, r: _Reply, finish: str | None, scored: str, ids: Callable[[], list[int]],
               **fields: Any) -> dict[str, Any]:
        """One choice; `scored` text gets logprobs and `ids()` are its token ids, each only when asked."""
        logprobs = self.logprobs(scored) if r.want_logprobs else None
        choice = {"index": 0, **fields, "logprobs": logprobs, "finish_reason": finish}
        if r.want_ids:
            choice["token_ids"] = ids()
        return choice

    def prompt_ids(self, r: _Reply) -> dict[str, Any]:
        return {"prompt_token_ids": r.prompt_ids} if r.want_ids else {}

    def body(self, r: _Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": r.turn.text or (None if r.calls else "")}
        if r.turn.thinking is not None:
            message["reasoning_content"] = r.turn.thinking
        if r.calls:
            message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                                     for cid, name, args in r.calls]
        choice = self.choice(r, self.stop(r), r.turn.text, lambda: r.output_ids, message=message)
        return self.envelope(r, False, [choice], usage=self.usage(r), **self.prompt_ids(r))

    def chunk(self, r: _Reply, delta: dict[str, Any], ids_text: str = "", finish: str | None = None,
              **extra: Any) -> tuple[str, dict]:
        choice = self.choice(r, finish, delta.get("content") or "", lambda: token_ids(ids_text), delta=delta)
        return ("delta" if ids_text else "chunk"), self.envelope(r, True, [choice], **extra)

    def events(self, r: _Reply) -> Iterator[Item]:
        yield self.chunk(r, {"role": "assistant", "content": ""}, **self.prompt_ids(r))
        for piece in _split(r.turn.thinking or ""):
            yield self.chunk(r, {"reasoning_content": piece}, piece)
        yield from _paced(r.text_pieces, lambda p: self.chunk(r, {"content": p}, p))
        for i, (cid, name, args) in enumerate(r.calls):
            head = {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
            yield self.chunk(r, {"tool_calls": [head]})
            for piece in _split(args):
                yield self.chunk(r, {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}, piece)
        yield self.chunk(r, {}, finish=self.stop(r))
        yield from self.tail(r)

    def tail(self, r: _Reply) -> Iterator[Item]:
        if (r.body.get("stream_options") or {}).get("include_usage"):
            yield "usage", self.envelope(r, True, [], usage=self.usage(r))
        yield _DONE

    def error_events(self, r: _Reply) -> list[Item]:
        return [("error", _openai_error("server_error", "scripted fault: error_event", 500)), _DONE]


class _Completions(_Chat):
    """Legacy completions: text only (tool calls and thinking are not rendered); vLLM puts
    `prompt_token_ids` on the choice, so they go there as well as on the top level."""

    objects = ("text_completion", "text_completion")
    id_prefix = "cmpl-"

    def stop(self, r: _Reply) -> str:
        return r.turn.stop_reason or "stop"

    def logprobs(self, text: str) -> dict[str, Any]:
        pieces = _WORD.findall(text)
        return {"tokens": pieces, "token_logprobs": [_logprob(p) for p in pieces], "top_logprobs": None}

    def piece(self, r: _Reply, text: str, finish: str | None, chunk: bool, **extra: Any) -> dict[str, Any]:
        ids = (lambda: token_ids(text)) if chunk else (lambda: r.output_ids)
        return self.envelope(r, chunk, [self.choice(r, finish, text, ids, text=text, **extra)], **extra)

    def body(self, r: _Reply) -> dict[str, Any]:
        return {**self.piece(r, r.turn.text, self.stop(r), False, **self.prompt_ids(r)), "usage": self.usage(r)}

    def events(self, r: _Reply) -> Iterator[Item]:
        for i, text in enumerate(r.text_pieces or [""]):
            if i:
                yield _PAUSE
            yield "delta", self.piece(r, text, None, True, **(self.prompt_ids(r) if i == 0 else {}))
        yield "chunk", self.piece(r, "", self.stop(r), True)
        yield from self.tail(r)


_CHAT = _Chat()
_RENDERERS: dict[str | None, Any] = {"anthropic": _Anthropic(), "responses": _Responses(), "chat": _CHAT,
                                     "completions": _Completions()}
_RENDERERS["count_tokens"] = _RENDERERS["anthropic"]  # (for their error shapes)
_ENDPOINTS = (("/messages/count_tokens", "count_tokens"), ("/messages", "anthropic"), ("/responses", "responses"),
              ("/chat/completions", "chat"), ("/completions", "completions"), ("/models", "models"))
_PREFIX = re.compile(r"^/(s|fault)/([^/]+)(/.*)?$")
_MODELS = {"object": "list", "has_more": False, "first_id": "scripted", "last_id": "scripted",
           "data": [{"id": "scripted", "object": "model", "type": "model", "created": 0, "owned_by": "forgerl",
                     "display_name": "Scripted", "created_at": "2025-01-01T00:00:00Z"}]}
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _route(path: str) -> tuple[str, str, str | None]:
    """Strip `/s/<session>/` and `/fault/<kind>/` prefixes (any order): (path, session, fault)."""
    session, fault = "", None
    while m := _PREFIX.match(path):
        session, fault = (m[2], fault) if m[1] == "s" else (session, m[2])
        path = m[3] or "/"
    return path, session, fault


def _endpoint(path: str) -> str | None:
    path = path.rstrip("/")
    return next((api for suffix, api in _ENDPOINTS if path.endswith(suffix)), None)


def _inject(items: Iterable[Item], fault: str | None, errors: Callable[[], list[Item]]) -> Iterator[Item]:
    """Apply a stream fault right after the first delta event (at the end when there is none)."""
    if fault not in _STREAM_FAULTS:
        yield from items
        return

    def after() -> list[Item]:
        return [_MALFORMED] if fault == "malformed" else errors() if fault == "error_event" else [_RESET]

    items = iter(items)
    for item in items:
        yield item
        if isinstance(item, tuple) and "delta" in item[0]:
            yield from after()
            if fault != "malformed":
                return
            yield from items  # the rest, unharmed
            return
    yield from after()


def _sse(item: Item, api: Any) -> bytes:
    if item is _DONE:
        return b"data: [DONE]\n\n"
    name, data = (api.delta_event, '{"malformed json') if item is _MALFORMED else (item[0], _json(item[1]))
    return (f"event: {name}\ndata: {data}\n\n" if api.named else f"data: {data}\n\n").encode()


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class ScriptedUpstream:
    """The scripted server, run on its own thread and event loop; also a context manager.

    `chunks`/`chunk_delay` split each streamed text into that many deltas with
    that delay between them (latency benchmarks: e.g. 50 chunks 20 ms apart);
    None means one delta per word and no delay.
    """

    def __init__(self, script: Script | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 chunks: int | None = None, chunk_delay: float = 0.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.script = script or echo()
        self.ssl_context = ssl_context  # serve HTTPS (forward-proxy tests)
        self.host, self.port = host, port
        self.chunks, self.chunk_delay = chunks, chunk_delay
        self.url = ""
        self.log: list[LoggedExchange] = []
        self.created = int(time.time())  # every answer's timestamp: answers repeat byte for byte
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing: asyncio.Event | None = None
        self._big = ""

    # lifecycle

    def start(self) -> ScriptedUpstream:
        """Listen on a thread of its own (with its own event loop); return once listening."""
        _raise_fd_limit()  # 500+ open streams need more than a 1024-descriptor default
        ready, failed = threading.Event(), []
        self._thread = threading.Thread(target=self._serve, args=(ready, failed), name="scripted-upstream", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._closing.set)  # type: ignore[union-attr]
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> ScriptedUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _listen(self) -> web.AppRunner:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.25)
        await runner.setup()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=4096)
        await web.SockSite(runner, sock, ssl_context=self.ssl_context).start()
        port = sock.getsockname()[1]
        scheme = "https" if self.ssl_context else "http"
        self.url = f"{scheme}://[{self.host}]:{port}" if family == socket.AF_INET6 else f"{scheme}://{self.host}:{port}"
        return runner

    def _serve(self, ready: threading.Event, failed: list[BaseException]) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            runner = loop.run_until_complete(self._listen())
        except BaseException as e:  # e.g. the port is taken: start() raises it
            failed.append(e)
            loop.close()
            return
        finally:
            ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    # requests

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        ex = LoggedExchange(request.method, request.raw_path, headers, await request.read())
        self.log.append(ex)
        path, session, fault = _route(request.path)
        fault = headers.get("x-scripted-fault", fault)
        session = session or headers.get("x-forge-session", "")
        api = _endpoint(path)
        renderer = _RENDERERS.get(api, _CHAT)
        is_ws = api == "responses" and request.method == "GET" and headers.get("upgrade", "").lower() == "websocket"
        if api is None or fault == "unknown" or (request.method == "GET") != (api == "models" or is_ws):
            return self._json(ex, 404, renderer.error(404, f"no model API at {request.method} {path}"))
        if fault in ("500", "429"):
            headers = {"retry-after": "1"} if fault == "429" else {}
            return self._json(ex, int(fault), renderer.error(int(fault), f"scripted fault: {fault}"), headers)
        if fault == "nonjson":
            ex._sent.append(b"not json")
            ex.status = 200
            return web.Response(body=b"not json", content_type="text/plain")
        if fault == "timeout":
            await self._closing.wait()  # type: ignore[union-attr]  # until the client gives up or we stop
            return self._json(ex, 500, renderer.error(500, "server stopping"))
        if fault is not None and fault not in FAULTS:
            return self._json(ex, 400, renderer.error(400, f"unknown fault {fault!r}; known: {', '.join(FAULTS)}"))
        if api == "models":
            return self._json(ex, 200, _MODELS)
        if is_ws:
            return await self._websocket(request, ex, path, session, fault)
        body = _json_object(ex.body or b"{}")
        if body is None:
            return self._json(ex, 400, renderer.error(400, "request body is not a JSON object"))
        if api == "count_tokens":
            return self._json(ex, 200, {"input_tokens": len(token_ids(_prompt_text(body)))})
        try:
            reply = self._reply(Request(api, path, headers, body, session), ex.body, fault)
        except Exception as e:  # a broken script answers 500 and the server keeps serving
            return self._json(ex, 500, renderer.error(500, f"script failed: {e!r}"))
        if fault in _STREAM_FAULTS or (body.get("stream") is True and fault != "big"):
            items = _inject(renderer.events(reply), fault, lambda: renderer.error_events(reply))
            return await self._stream(request, ex, renderer, items)
        return self._json(ex, 200, renderer.body(reply))

    def _reply(self, req: Request, raw: bytes, fault: str | None) -> _Reply:
        """Ask the script; the same request answered with the same turn gets the same ids and bytes,
        so a call made directly and one made through the recorder can be compared."""
        if fault == "big":
            turn, said = Turn(text=self._big_text(), usage={"output_tokens": _BIG_TEXT_BYTES // 6}), b"big"
        elif _prewarm(req):
            turn, said = Turn(usage={"output_tokens": 0}), b"prewarm"
        else:
            turn = self.script(req)
            said = repr(turn).encode()
        digest = hashlib.blake2b(b"\0".join((req.path.encode(), raw, said)), digest_size=12).hexdigest()
        return _Reply(req, turn, self.chunks, digest, self.created)

    def _big_text(self) -> str:
        if not self._big:
            line = "lorem ipsum dolor sit amet, consectetur adipiscing elit\n"
            self._big = line * (_BIG_TEXT_BYTES // len(line))
        return self._big

    def _json(self, ex: LoggedExchange, status: int, data: Any, headers: dict[str, str] | None = None) -> web.Response:
        raw = _json(data).encode()
        ex._sent.append(raw)
        ex.status = status
        return web.Response(body=raw, status=status, content_type="application/json", headers=headers)

    async def _pause(self) -> None:
        if self.chunk_delay:
            await asyncio.sleep(self.chunk_delay)

    async def _stream(self, request: web.Request, ex: LoggedExchange, renderer: Any,
                      items: Iterable[Item]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        ex.status = 200
        await response.prepare(request)
        pending: list[bytes] = []  # frames with no delay between them leave in one write (fewer syscalls),
        first = True  # except that the first text delta leaves at once (time to first token)
        for item in items:
            if (item is _PAUSE and (self.chunk_delay or first)) or item is _RESET:
                first = False
                await response.write(b"".join(pending))
                pending.clear()
                if item is _RESET:
                    await _abort(request)
                    return response
                await asyncio.sleep(self.chunk_delay)
            elif item is not _PAUSE:
                frame = _sse(item, renderer)
                ex._sent.append(frame)  # logged before sent, so a client that has it finds it logged
                pending.append(frame)
        await response.write_eof(b"".join(pending))
        return response

    async def _websocket(self, request: web.Request, ex: LoggedExchange, path: str, session: str,
                         fault: str | None) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=_MAX_BODY)
        ex.status, ex._sep = 101, b"\n"
        await ws.prepare(request)
        received: list[bytes] = []
        renderer = _RENDERERS["responses"]

        async def send(data: str) -> None:
            ex._sent.append(data.encode())
            await ws.send_str(data)

        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                continue
            received.append(msg.data.encode())
            ex.body = b"\n".join(received)
            body = _json_object(received[-1])
            if body is None or body.pop("type", None) != "response.create":
                await send(_json({"type": "error", "status": 400, **renderer.error(400, "expected a response.create")}))
                continue
            try:
                reply = self._reply(Request("responses", path, ex.headers, body, session), received[-1], fault)
            except Exception as e:
                await send(_json({"type": "error", "status": 500, **renderer.error(500, f"script failed: {e!r}")}))
                continue
            for item in _inject(renderer.events(reply), fault, lambda: renderer.error_events(reply)):
                if item is _PAUSE:
                    await self._pause()
                elif item is _RESET:
                    await _abort(request)
                    return ws
                else:
                    await send('{"malformed json' if item is _MALFORMED else _json(item[1]))
        return ws


async def _abort(request: web.Request) -> None:
    """Drop the TCP connection (transport.abort) once what was written has left."""
    transport = request.transport
    if transport is None:
        return
    for _ in range(100):
        if not transport.get_write_buffer_size():
            break
        await asyncio.sleep(0.001)
    transport.abort()


def main(argv: list[str] | None = None) -> None:
    """`python -m forgerl.recorder.scripted --port P [--chunks N --chunk-delay S] [--reply TEXT]`."""
    parser = argparse.ArgumentParser(prog="python -m forgerl.recorder.scripted", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--chunks", type=int, default=None, help="streamed text is split into this many deltas")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between text deltas")
    parser.add_argument("--reply", default=None, help="always reply this text (default: echo the last user text)")
    args = parser.parse_args(argv)
    script = sequence(Turn(text=args.reply)) if args.reply is not None else echo()
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with ScriptedUpstream(script, host=args.host, port=args.port, chunks=args.chunks,
                          chunk_delay=args.chunk_delay) as up:
        print(f"listening on {up.url}", flush=True)
        stopping.wait()


if __name__ == "__main__":
    main()
