"""A scripted model server: the upstream that `make demo`, the tests and benchmarks put behind the recorder.

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
  ``POST /v1/completions`` and ``GET /v1/models``;
* the Gemini API: ``POST /v1beta/models/{model}:generateContent`` (JSON),
  ``:streamGenerateContent`` (SSE, whatever the body says), ``:countTokens``
  and ``GET /v1beta/models``.

The answers are written by the product's codecs (`render_response`,
`render_stream`), the writers serve mode answers harnesses with; this module
holds only what a test needs around them: scripts and sessions, fake tokens,
and faults.

Paths match on their suffix, so ``/openai/v1/chat/completions`` works too; a
``/s/<session>/`` prefix (or an ``X-Forge-Session`` header) names the session,
and a ``/fault/<kind>/`` prefix (or an ``X-Scripted-Fault`` header) injects a
fault: ``500``, ``429``, ``timeout``, ``reset``, ``malformed``, ``nonjson``,
``big``, ``error_event``, ``linger`` or ``unknown`` (see `FAULTS`). Faults that carry no
model answer (500, 429, timeout, nonjson, big, unknown) do not call the script,
so they do not use up a `sequence` turn; the stream faults (reset, malformed,
error_event) do, and strike right after the first delta event; ``linger`` sends
the whole stream, then holds it open `LINGER_S` before its end.

Answers are reproducible: ids derive from a digest of the path, the request
bytes and the turn, and timestamps are the server's start time, so the same
request answered with the same turn gets the same bytes (a call made directly
can be compared with one made through the recorder). Codex's WebSocket warm-up
(``generate: false``) gets an empty response without asking the script.

Token ids are deterministic fakes, so vLLM-style answers (``return_token_ids``,
``logprobs``) are reproducible: a text's tokens are its whitespace-separated
words, a token's id is ``crc32(word) % 50000`` and its logprob
``-(crc32(word) % 1000) / 1000``. Usage counts the same tokens: input = words
of the request's message text, output = words of thinking + text + tool
arguments, unless `Turn.usage` says otherwise.

Run on its own: ``python examples/scripted_upstream.py --port P [--chunks N --chunk-delay S] [--reply TEXT]``.
It needs forgerl installed (its codecs write the answers) and nothing else; examples/README.md
shows a script, and the tests import it as ``scripted_upstream`` (tests/conftest.py puts examples/ on
their path).
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
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import WSMsgType, web

from forgerl.recorder.apis import ANTHROPIC, CHAT, COMPLETIONS, GEMINI, RESPONSES
from forgerl.recorder.apis.gemini import is_gemini_path, model_of
from forgerl.recorder.apis.answer import Answer, Frame
from forgerl.schema.messages import Usage
from forgerl.schema.toolcalls import ParsedTurn
from forgerl.schema.toolcalls import ToolCall as ParsedCall

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

FAULTS = ("500", "429", "timeout", "reset", "malformed", "nonjson", "big", "error_event", "linger", "unknown")
_STREAM_FAULTS = ("reset", "malformed", "error_event", "linger")
LINGER_S = 2.0
_MAX_BODY = 1 << 30
_BIG_TEXT_BYTES = 50_000_000


# --- what a script says, and what it is told ---------------------------------------------------


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None  # generated (toolu_… / call_…) when None; "": none (as the Gemini API sends)


@dataclass
class Turn:
    """What the model "says" on one call."""

    text: str = ""
    thinking: str | None = None  # Anthropic thinking block, Responses reasoning item, chat reasoning_content
    tool_calls: list[ToolCall] = field(default_factory=list)  # several = parallel tool calls
    finish: str = "stop"  # "stop" | "length" (cut at the token limit), named as each API names it
    usage: Usage | None = None  # the counts it sets replace the counted ones


@dataclass
class Request:
    api: str  # "anthropic" | "responses" | "chat" | "completions" | "gemini"
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
    items = request.body.get("messages") or request.body.get("input") or request.body.get("contents") or []
    last = items[-1] if isinstance(items, list) and items else {}
    if not isinstance(last, dict):
        return False
    if last.get("role") == "tool" or last.get("type") in ("function_call_output", "custom_tool_call_output"):
        return True
    content = last.get("content", last.get("parts"))
    return isinstance(content, list) and any(isinstance(c, dict) and (c.get("type") == "tool_result"
                                                                     or "functionResponse" in c) for c in content)


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
    items = body.get("messages", body.get("input", body.get("prompt", body.get("contents"))))
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if isinstance(item, str):
            return item
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content", item.get("parts"))
            if isinstance(content, str):
                return content
            parts = content if isinstance(content, list) else []
            return "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


# --- fake tokens ---------------------------------------------------------------------------------

_WORD = re.compile(r"\s*\S+(?:\s+$)?")  # one word with the whitespace before it (and any after the last)
_TEXT_KEYS = ("system", "instructions", "messages", "input", "prompt", "content", "text", "thinking", "output",
              "arguments", "systemInstruction", "contents", "parts")  # where request text lives, in any of the APIs


def token_ids(text: str) -> list[int]:
    """Fake token ids: one per whitespace-separated word, ``crc32(word) % 50000``."""
    return [zlib.crc32(w.encode()) % 50000 for w in text.split()]


def _logprobs(text: str) -> list[float]:
    """One per token of `token_ids(text)`."""
    return [-(zlib.crc32(w.encode()) % 1000) / 1000 for w in text.split()]


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


def _prompt_ids(body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt  # token in, token out
    return token_ids(_prompt_text(body))


def _answer_for(request: Request, turn: Turn, digest: str, created: int) -> Answer:
    """The turn as the codecs' `Answer`: ids from `digest`, fake token counts, and token ids and
    logprobs only where the request asked for them (vLLM's ``return_token_ids``, ``logprobs``).
    Legacy completions say the text alone."""
    prefix = "toolu_" if request.api == "anthropic" else "call_"
    text_only = request.api == "completions"
    spoken = [] if text_only else turn.tool_calls
    calls = tuple(ParsedCall(call.name, call.arguments) for call in spoken)
    said = ParsedTurn(None if text_only else turn.thinking, turn.text, calls)
    output = " ".join([said.reasoning or "", said.text, *(call.arguments_json() for call in calls)])
    prompt_ids = _prompt_ids(request.body)
    counted = Usage(input_tokens=len(prompt_ids), output_tokens=len(token_ids(output)), cache_read_tokens=0,
                    cache_write_tokens=0, reasoning_tokens=len(token_ids(said.reasoning or "")))
    given = turn.usage or Usage()
    usage = Usage(**{f.name: getattr(given, f.name) if getattr(given, f.name) is not None else getattr(counted, f.name)
                     for f in fields(Usage)})
    want_ids, want_logprobs = request.body.get("return_token_ids") is True, bool(request.body.get("logprobs"))
    signature = None
    if said.reasoning is not None:
        signature = base64.b64encode(hashlib.sha256(said.reasoning.encode()).digest() * 2).decode()
    model = request.body.get("model") or (model_of(request.path) if request.api == "gemini" else None)
    return Answer(id=digest, model=str(model or "scripted"), turn=said,
                  call_ids=tuple(f"{prefix}{digest[:22]}{i:02d}" if call.id is None else call.id
                                 for i, call in enumerate(spoken)),
                  usage=usage, finish=turn.finish, created=created, signature=signature,
                  prompt_token_ids=prompt_ids if want_ids else None,
                  completion_token_ids=token_ids(output) if want_ids or want_logprobs else None,
                  completion_logprobs=_logprobs(output) if want_logprobs else None)


def _prewarm(request: Request) -> bool:
    """Codex's WebSocket warm-up, `generate: false`: answered with an empty response, not by the script."""
    return request.api == "responses" and request.body.get("generate") is False


# --- faults ----------------------------------------------------------------------------------------

_CODECS = {"anthropic": ANTHROPIC, "responses": RESPONSES, "chat": CHAT, "completions": COMPLETIONS, "gemini": GEMINI}
_GEMINI_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}
_ANTHROPIC_ERRORS = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
                     500: "api_error"}
_OPENAI_ERRORS = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_exceeded"}
_RESET = object()  # abort the connection here
_LINGER = object()  # hold the stream open here


def _error(api: str | None, status: int, message: str) -> dict[str, Any]:
    """An error body as the API sends it (Anthropic's for its two endpoints, OpenAI's otherwise)."""
    if api in ("anthropic", "count_tokens"):
        return {"type": "error", "error": {"type": _ANTHROPIC_ERRORS.get(status, "api_error"), "message": message}}
    if api in ("gemini", "gemini_count", "gemini_models"):
        return {"error": {"code": status, "message": message, "status": _GEMINI_STATUS.get(status, "INTERNAL")}}
    return _openai_error(_OPENAI_ERRORS.get(status, "server_error"), message)


def _openai_error(kind: str, message: str, code: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _error_frames(api: str, sent: list[Frame]) -> list[Frame]:
    """What each API sends when it fails mid-stream; `sent` are the frames that went before."""
    if api == "anthropic":
        error = {"type": "overloaded_error", "message": "Overloaded (scripted fault)"}
        return [Frame("error", {"type": "error", "error": error})]
    if api == "responses":
        error = {"code": "server_error", "message": "scripted fault: error_event"}
        failed = {**sent[0].data["response"], "status": "failed", "error": error}  # type: ignore[index]
        number = sent[-1].data["sequence_number"] + 1  # type: ignore[index]
        return [Frame("response.failed", {"type": "response.failed", "sequence_number": number, "response": failed})]
    if api == "gemini":
        return [Frame(None, _error("gemini", 500, "scripted fault: error_event"))]
    return [Frame(None, _openai_error("server_error", "scripted fault: error_event", 500)), Frame(None, "[DONE]")]


def _inject(frames: Iterable[Frame], fault: str | None, api: str) -> Iterator[Frame | object]:
    """Apply a stream fault right after the first delta frame (at the end when there is none)."""
    if fault not in _STREAM_FAULTS or fault == "linger":
        yield from frames
        if fault == "linger":
            yield _LINGER
        return
    frames = iter(frames)
    sent: list[Frame] = []
    for frame in frames:
        sent.append(frame)
        yield frame
        if frame.delta:
            break
    if fault == "reset":
        yield _RESET
    elif fault == "malformed":
        yield Frame(sent[-1].event, '{"malformed json')
        yield from frames  # the rest, unharmed
    else:
        yield from _error_frames(api, sent)


# --- the server ------------------------------------------------------------------------------------

_ENDPOINTS = (("/messages/count_tokens", "count_tokens"), ("/messages", "anthropic"), ("/responses", "responses"),
              ("/chat/completions", "chat"), ("/completions", "completions"), ("/models", "models"))
_PREFIX = re.compile(r"^/(s|fault)/([^/]+)(/.*)?$")
_MODELS = {"object": "list", "has_more": False, "first_id": "scripted", "last_id": "scripted",
           "data": [{"id": "scripted", "object": "model", "type": "model", "created": 0, "owned_by": "forgerl",
                     "display_name": "Scripted", "created_at": "2025-01-01T00:00:00Z"}]}
_GEMINI_MODELS = {"models": [{"name": "models/scripted", "displayName": "Scripted", "inputTokenLimit": 1048576,
                              "outputTokenLimit": 65536,
                              "supportedGenerationMethods": ["generateContent", "countTokens"]}]}
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_json: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _route(path: str) -> tuple[str, str, str | None]:
    """Strip `/s/<session>/` and `/fault/<kind>/` prefixes (any order): (path, session, fault)."""
    session, fault = "", None
    while m := _PREFIX.match(path):
        session, fault = (m[2], fault) if m[1] == "s" else (session, m[2])
        path = m[3] or "/"
    return path, session, fault


def _endpoint(path: str) -> str | None:
    path = path.rstrip("/")
    if is_gemini_path(path):
        return "gemini"
    if path.endswith(":countTokens"):
        return "gemini_count"
    if path.startswith(("/v1beta/models", "/v1alpha/models")) and ":" not in path:
        return "gemini_models"
    return next((api for suffix, api in _ENDPOINTS if path.endswith(suffix)), None)


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
        is_ws = api == "responses" and request.method == "GET" and headers.get("upgrade", "").lower() == "websocket"
        listing = api in ("models", "gemini_models")
        if api is None or fault == "unknown" or (request.method == "GET") != (listing or is_ws):
            return self._json(ex, 404, _error(api, 404, f"no model API at {request.method} {path}"))
        if fault in ("500", "429"):
            headers = {"retry-after": "1"} if fault == "429" else {}
            return self._json(ex, int(fault), _error(api, int(fault), f"scripted fault: {fault}"), headers)
        if fault == "nonjson":
            ex._sent.append(b"not json")
            ex.status = 200
            return web.Response(body=b"not json", content_type="text/plain")
        if fault == "timeout":
            await self._closing.wait()  # type: ignore[union-attr]  # until the client gives up or we stop
            return self._json(ex, 500, _error(api, 500, "server stopping"))
        if fault is not None and fault not in FAULTS:
            return self._json(ex, 400, _error(api, 400, f"unknown fault {fault!r}; known: {', '.join(FAULTS)}"))
        if api == "models":
            return self._json(ex, 200, _MODELS)
        if api == "gemini_models":
            return self._json(ex, 200, _GEMINI_MODELS)
        if is_ws:
            return await self._websocket(request, ex, path, session, fault)
        body = _json_object(ex.body or b"{}")
        if body is None:
            return self._json(ex, 400, _error(api, 400, "request body is not a JSON object"))
        if api in ("count_tokens", "gemini_count"):
            key = "input_tokens" if api == "count_tokens" else "totalTokens"
            return self._json(ex, 200, {key: len(token_ids(_prompt_text(body)))})
        try:
            answer = self._answer(Request(api, path, headers, body, session), ex.body, fault)
        except Exception as e:  # a broken script answers 500 and the server keeps serving
            return self._json(ex, 500, _error(api, 500, f"script failed: {e!r}"))
        codec = _CODECS[api]
        streamed = path.endswith(":streamGenerateContent") if api == "gemini" else body.get("stream") is True
        if fault in _STREAM_FAULTS or (streamed and fault != "big"):
            return await self._stream(request, ex, _inject(codec.render_stream(answer, body, self._pieces), fault, api))
        return self._json(ex, 200, codec.render_response(answer, body))

    def _answer(self, req: Request, raw: bytes, fault: str | None) -> Answer:
        """Ask the script; the same request answered with the same turn gets the same ids and bytes,
        so a call made directly and one made through the recorder can be compared."""
        if fault == "big":
            turn, said = Turn(text=self._big_text(), usage=Usage(output_tokens=_BIG_TEXT_BYTES // 6)), b"big"
        elif _prewarm(req):
            turn, said = Turn(usage=Usage(output_tokens=0)), b"prewarm"
        else:
            turn = self.script(req)
            said = repr(turn).encode()
        digest = hashlib.blake2b(b"\0".join((req.path.encode(), raw, said)), digest_size=12).hexdigest()
        return _answer_for(req, turn, digest, self.created)

    def _pieces(self, text: str) -> list[str]:
        return _split(text, self.chunks)

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

    async def _stream(self, request: web.Request, ex: LoggedExchange,
                      items: Iterable[Frame | object]) -> web.StreamResponse:
        """Frames as SSE; `chunk_delay` between delta frames. Frames with no delay between them leave in
        one write (fewer syscalls), except that the first delta leaves at once (time to first token)."""
        response = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        ex.status = 200
        await response.prepare(request)
        pending: list[bytes] = []
        deltas = 0
        for item in items:
            if item is _RESET:
                await response.write(b"".join(pending))
                await _abort(request)
                return response
            if item is _LINGER:
                await response.write(b"".join(pending))
                pending.clear()
                await asyncio.sleep(LINGER_S)
                continue
            assert isinstance(item, Frame)
            if item.delta:
                if deltas and (self.chunk_delay or deltas == 1):
                    await response.write(b"".join(pending))
                    pending.clear()
                    await asyncio.sleep(self.chunk_delay)
                deltas += 1
            frame = item.sse()
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
                await send(_json({"type": "error", "status": 400, **_error("responses", 400, "expected a response.create")}))
                continue
            try:
                answer = self._answer(Request("responses", path, ex.headers, body, session), received[-1], fault)
            except Exception as e:
                await send(_json({"type": "error", "status": 500, **_error("responses", 500, f"script failed: {e!r}")}))
                continue
            deltas = 0
            for item in _inject(RESPONSES.render_stream(answer, body, self._pieces), fault, "responses"):
                if item is _RESET:
                    await _abort(request)
                    return ws
                assert isinstance(item, Frame)
                if item.delta and deltas and self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                deltas += item.delta
                await send(item.text())
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
    """`python examples/scripted_upstream.py --port P [--chunks N --chunk-delay S] [--reply TEXT]`."""
    parser = argparse.ArgumentParser(prog="scripted_upstream.py", description=__doc__.splitlines()[0])
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
