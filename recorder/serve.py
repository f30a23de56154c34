"""Serve mode: answer the harness's own API from a policy.

    harness ──▶ forge-record (mitmproxy + addon, records as usual)
                    ──▶ PolicyGateway (aiohttp, loopback) ──▶ policy (vLLM, veRL servers)

The recorder needs no special case: the gateway is its upstream. Per call the
gateway parses the request with the recorder's own codec (Anthropic
Messages, OpenAI Responses, Chat Completions, Gemini), has a generator
(`generate.py`, the seam) make the turn's prompt and tokens: token ids in
(`TokenGenerator`: the tokenizer's chat template rendered here, a
token-in/token-out policy completes the ids), or the policy's chat endpoint
for a call that holds images (`serve_vl.ChatGenerator`). It parses the
generated text into reasoning / text / tool calls (`forgerl.schema.toolcalls`,
in the format the template writes or `--tool-format` names) and has the same
codec write that `Answer` in the harness's API. Generators only generate:
building, streaming and finishing the turn, and the response's headers, are
the gateway's alone, one way for both. The token ids and logprobs ride back
in the answer (`policy_tokens`), so the recorded call holds them; the
recorder tags the call with the policy version itself.

Streaming. When the harness asks for a stream, the gateway forwards each
delta the generator yields at once (a token-in policy streams when it can,
`Policy.stream`; the chat endpoint answers in one delta): its ids are
detokenized (`detokenize`), parsed (`TurnParser`) and written by the codec's
`StreamWriter` (reasoning and text as deltas, each tool call as one whole
block when it closes). The stream's head (message start, response created)
goes out before the first token. A policy error mid-stream is written as the
API's error event, which the recorder stores as the call's error; one before
the first token is a 502; a harness that hangs up mid-stream closes the
generator's stream. The recorded completion ids are the concatenated deltas'
ids, their logprobs the deltas' logprobs.

Segments. Every answer names itself and the answer its prompt continues (the
generator says which: `Prompt.continues`) in two response headers
(`X-Forge-Answer`, `X-Forge-Continues`), which the recorder stores: the
thread segmenter (`forgerl.schema.segments`) takes them as the decision for
served calls instead of inferring it again. A finished answer is remembered
(`PromptBuilder.remember`) for the calls that will continue it.

Sampling (temperature, top_p) is the gateway's, set by whoever trains; a
request's `max_tokens` is honoured up to the gateway's cap.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from forgerl.errors import UserError
from forgerl.schema.chat import chat_tools, to_chat_messages
from forgerl.schema.messages import Usage
from forgerl.schema.segments import ANSWER_HEADER, CONTINUES_HEADER
from forgerl.schema.toolcalls import ParsedTurn, ToolCallFormat, TurnParser, format_for_template, format_named

from .apis import ANTHROPIC, CHAT, GEMINI, RESPONSES, Codec, codec_for, parse_call
from .apis.answer import Answer, Frame, StreamWriter, chunks, new_id
from .detokenize import Detokenizer
from .generate import Call, Generator, Prompt, PromptBuilder, Started, TokenGenerator
from .policy import ChatPolicy, Delta, Policy, PolicyError, Sampling
from .serve_vl import ChatGenerator, has_images

log = logging.getLogger(__name__)

_MAX_TOKEN_KEYS = ("max_tokens", "max_output_tokens", "max_completion_tokens")


class PolicyGateway:
    """An aiohttp app on loopback that answers Anthropic, Responses, Chat and Gemini calls from a policy:
    through `tokens` (token ids in), or `images` for calls that hold images where the policy has a chat endpoint."""

    def __init__(self, policy: Policy, tokenizer: Any, served_model: str, sampling: Sampling | None = None,
                 fmt: ToolCallFormat | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None):
        self.policy = policy
        self.tokenizer = tokenizer
        self.served_model = served_model
        self.sampling = sampling or Sampling()
        self.fmt = fmt or format_for_template(getattr(tokenizer, "chat_template", None))
        self.prompts = PromptBuilder(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.tokens: Generator = TokenGenerator(policy, self.prompts)
        self.images: Generator | None = ChatGenerator(policy, self.prompts) if isinstance(policy, ChatPolicy) else None
        self.calls = 0
        self.new_segments = 0
        self.malformed_calls = 0  # call-shaped text the format could not read: left as text, counted here
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_get("/{tail:.*}", self._get)
        app.router.add_post("/{tail:.*}", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        self.url = f"http://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers ---------------------------------------------------------------
    async def _get(self, request: web.Request) -> web.Response:
        if request.path.rstrip("/").endswith("/models"):
            return web.json_response({"object": "list", "data": [
                {"id": self.served_model, "object": "model", "owned_by": "forgerl"}]})
        if request.path == "/":  # harnesses probe the base URL; the real APIs answer it too
            return web.json_response({"served_model": self.served_model})
        return _error(404, f"serve mode answers model calls only, not GET {request.path}")

    async def _post(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "request body is not a JSON object")
        if request.path.rstrip("/").endswith("/messages/count_tokens"):
            return await self._count_tokens(body)
        codec = codec_for(request.path)
        if codec not in (ANTHROPIC, RESPONSES, CHAT, GEMINI):
            return _error(404, f"serve mode does not answer {request.path}")
        exchange = parse_call(codec, request.path, body)
        generator = self.images if has_images(exchange) else self.tokens
        if generator is None:
            return _error(400, "this call holds images: serve mode sends them to a vLLM-protocol chat endpoint, "
                               "which needs --policy URL")
        call = Call(exchange, to_chat_messages(exchange.input), chat_tools(exchange.tools) or None,
                    self._sampling(exchange.params), request.content_length)
        try:
            started = await generator.start(call)
        except PolicyError as e:
            log.warning("policy failed: %s", e)
            return _error(502, str(e))
        turn = self._turn(call, started.prompt, codec)
        if _streamed(codec, request.path, body):
            return await self._stream(request, turn, started, codec.stream_writer(turn.head, body))
        try:
            async for delta in started.deltas:
                turn.add(delta)
        except PolicyError as e:
            log.warning("policy failed: %s", e)
            return _error(502, str(e))
        return web.json_response(codec.render_response(self._finish(turn), body), headers=turn.headers())

    async def _stream(self, request: web.Request, turn: Turn, started: Started,
                      writer: StreamWriter) -> web.StreamResponse:
        """Forward the turn as the policy generates it: each delta's text is parsed and written at once."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **turn.headers()})
        await response.prepare(request)
        await _send(response, writer.start())
        try:  # closing the policy's stream when the harness goes away stops the generation
            async with aclosing(started.deltas) as generated:
                async for delta in generated:
                    await _send(response, turn.tell(writer, turn.add(delta)))
        except ConnectionResetError:
            if request.transport is not None and not request.transport.is_closing():
                raise  # not the harness's connection: a bug, with its traceback
            log.info("the harness closed the stream of %s before its end", turn.prompt.answer_id)
            return response  # the recorder keeps what it got
        except PolicyError as e:
            log.warning("policy failed mid-stream: %s", e)
            await _send(response, writer.fail(str(e)))
        else:
            frames = turn.tell(writer, turn.end())
            await _send(response, frames + writer.finish(self._finish(turn)))
        await response.write_eof()
        return response

    async def _count_tokens(self, body: dict[str, Any]) -> web.Response:
        exchange = ANTHROPIC.parse_request(body)
        messages, tools = to_chat_messages(exchange.input), chat_tools(exchange.tools) or None
        text = self.prompts.render(messages, tools, True)
        return web.json_response({"input_tokens": len(self.tokenizer.encode(text, add_special_tokens=False))})

    # -- the turn -------------------------------------------------------------------
    def _turn(self, call: Call, prompt: Prompt, codec: Codec) -> Turn:
        """The turn to come, and what is known of its answer before the first token."""
        head = Answer(id=new_id(), model=call.exchange.model_requested or self.served_model,
                      turn=ParsedTurn(None, "", ()), call_ids=(),
                      usage=Usage(input_tokens=len(prompt.ids), output_tokens=0, cache_read_tokens=0,
                                  cache_write_tokens=0),
                      created=int(time.time()), prompt_token_ids=prompt.ids)
        parser = TurnParser(self.fmt, call.tools, in_reasoning=self._opens_reasoning(prompt.ids))
        return Turn(head, call, prompt, "toolu_" if codec is ANTHROPIC else "call_", parser,
                    Detokenizer(self.tokenizer), self.prompts.eos_id)

    def _opens_reasoning(self, prompt_ids: list[int]) -> bool:
        """Whether the generation prompt ends inside an opened reasoning block (the model writes only its close)."""
        tail = self.tokenizer.decode(prompt_ids[-4:], skip_special_tokens=False).rstrip("\n")
        return tail.endswith(self.fmt.think_open)

    def _finish(self, turn: Turn) -> Answer:
        """The whole answer, counted, and remembered for the requests that will continue it."""
        answer = turn.answer()
        self.calls += 1
        self.new_segments += turn.prompt.continues is None
        self.malformed_calls += answer.turn.malformed
        said = to_chat_messages([answer.message()])
        self.prompts.remember(turn.call.messages, turn.call.tools, said, turn.prompt.ids + turn.ids,
                              turn.prompt.answer_id)
        return answer

    def _sampling(self, params: dict[str, Any]) -> Sampling:
        asked = next((params[key] for key in _MAX_TOKEN_KEYS if isinstance(params.get(key), int)), None)
        if asked is None or asked >= self.sampling.max_tokens:
            return self.sampling
        return replace(self.sampling, max_tokens=max(1, asked))


@dataclass
class Turn:
    """One call's generation as it arrives: the ids and logprobs so far, and their text parsed so far."""

    head: Answer  # what is known before the first token
    call: Call
    prompt: Prompt
    id_prefix: str
    parser: TurnParser
    text: Detokenizer
    eos_id: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    finish: str = "length"
    call_ids: list[str] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        """What the recorder stores for the segmenter: this answer, and the answer it continues."""
        return {ANSWER_HEADER: self.prompt.answer_id, CONTINUES_HEADER: self.prompt.continues or ""}

    def add(self, delta: Delta) -> list[tuple[str, Any]]:
        """Take a delta's tokens; the parse events their text completes. The end-of-turn token is not text."""
        self.ids.extend(delta.token_ids)
        if self.logprobs is not None and delta.logprobs is not None:
            self.logprobs.extend(delta.logprobs)
        else:
            self.logprobs = None
        if delta.finish_reason is not None:
            self.finish = delta.finish_reason
        return self.parser.feed(self.text.add([token for token in delta.token_ids if token != self.eos_id]))

    def end(self) -> list[tuple[str, Any]]:
        return self.parser.feed(self.text.rest()) + self.parser.finish()

    def tell(self, writer: StreamWriter, events: list[tuple[str, Any]]) -> list[Frame]:
        """Parse events as the harness's stream frames; each call gets its id as it completes."""
        frames: list[Frame] = []
        for kind, value in events:
            if kind == "reasoning":
                frames += writer.reasoning(value)
            elif kind == "text":
                frames += writer.text(value)
            else:
                self.call_ids.append(new_id(self.id_prefix))
                frames += writer.tool_call(self.call_ids[-1], value, chunks)
        return frames

    def answer(self) -> Answer:
        if not self.parser.finished:
            self.end()
        self.call_ids += [new_id(self.id_prefix) for _ in range(len(self.parser.turn().tool_calls) - len(self.call_ids))]
        return replace(self.head, turn=self.parser.turn(), call_ids=tuple(self.call_ids),
                       usage=replace(self.head.usage, output_tokens=len(self.ids)), finish=self.finish,
                       completion_token_ids=self.ids, completion_logprobs=self.logprobs)


def _streamed(codec: object, path: str, body: dict[str, Any]) -> bool:
    """Gemini says it in the path (`:streamGenerateContent`), the others in the body."""
    return path.endswith(":streamGenerateContent") if codec is GEMINI else bool(body.get("stream"))


async def _send(response: web.StreamResponse, frames: list[Frame]) -> None:
    if frames:
        await response.write(b"".join(frame.sse() for frame in frames))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": "forge_serve_error", "message": message}},
                             status=status)


class GatewayThread:
    """A gateway on its own thread and event loop, for callers that are not async (the CLI, tests)."""

    def __init__(self, gateway: PolicyGateway, host: str = "127.0.0.1", port: int = 0):
        self.gateway = gateway
        self._where = (host, port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="forgerl-gateway", daemon=True)

    def start(self) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.gateway.start(*self._where), self._loop).result(30)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.gateway.close(), self._loop).result(30)
        closer = getattr(self.gateway.policy, "close", None)
        if closer is not None:
            asyncio.run_coroutine_threadsafe(closer(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_tokenizer(path: str) -> Any:
    """The policy's tokenizer from a local directory (never a hub download), checked to be servable."""
    import os

    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise UserError(f"--tokenizer: no such directory: {path}")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"--tokenizer {path}: the tokenizer has no chat template")
    return tokenizer


def tool_format(tokenizer: Any, name: str | None) -> ToolCallFormat:
    """The format named (`--tool-format`), else the one the tokenizer's chat template writes."""
    try:
        return format_named(name) if name else format_for_template(getattr(tokenizer, "chat_template", None))
    except ValueError as e:
        raise UserError(f"--tokenizer: {e}") from None
