"""API codecs: each model API's wire format to the canonical message model and back.

A codec (`anthropic`, `responses`, `chat`, `completions`, `gemini`) parses a request
body into an `Exchange` and renders it back exactly, reassembles a stream
into the body the non-streaming call would have returned, and reads that
body's output, usage and errors. The other way, it writes an `Answer` (one
model turn) as its API's response body or stream, which is how serve mode
and the tests' scripted upstream answer. The recorder picks one by path with
`codec_for`; paths without a codec (count_tokens, retrievals, anything
unknown) are recorded raw. The Gemini API names the model in the path, not
the body: `parse_call` reads a request with its path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from forgerl.recorder.apis.answer import Answer, Frame, Pieces
from forgerl.recorder.apis.anthropic import CODEC as ANTHROPIC
from forgerl.recorder.apis.chat import CODEC as CHAT
from forgerl.recorder.apis.completions import CODEC as COMPLETIONS
from forgerl.recorder.apis.gemini import CODEC as GEMINI
from forgerl.recorder.apis.gemini import is_gemini_path, model_of
from forgerl.recorder.apis.responses import CODEC as RESPONSES
from forgerl.recorder.sse import SSEEvent
from forgerl.schema.messages import Exchange

__all__ = ["ANTHROPIC", "CHAT", "COMPLETIONS", "GEMINI", "RESPONSES", "Codec", "StreamAssembler", "codec_for",
           "parse_call"]


class StreamAssembler(Protocol):
    """Turns one response stream's events back into a response body.

    `feed` never raises: malformed frames and error events set `error`
    (the first problem seen), unknown events are ignored. `result` may be
    called at any time, so a cut stream still yields what had arrived.
    """

    error: str | None
    done: bool  # the terminal event was seen
    first_token_seen: bool

    def feed(self, event: SSEEvent) -> None: ...

    def result(self) -> dict[str, Any]: ...


class Codec(Protocol):
    name: str  # "anthropic" | "responses" | "chat" | "completions" | "gemini"

    def parse_request(self, body: dict[str, Any]) -> Exchange:
        """input (system prompts first), params (the rest of the body), tools, model_requested, blobs."""
        ...

    def render_request(self, exchange: Exchange, blobs: Mapping[str, bytes]) -> dict[str, Any]:
        """The inverse: `render_request(parse_request(b), parse_request(b).blobs) == b`."""
        ...

    def new_stream(self) -> StreamAssembler: ...

    def parse_response(self, body: dict[str, Any], exchange: Exchange) -> None:
        """Fill output, usage, stop_reason, model_returned, error (and token ids / logprobs where sent)."""
        ...

    def render_response(self, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to `request` as a body that `parse_response` reads back as `answer`."""
        ...

    def render_stream(self, answer: Answer, request: Mapping[str, Any], pieces: Pieces = ...) -> Iterator[Frame]:
        """The answer streamed, texts cut by `pieces`: reassembled by `new_stream`, it reads back as `answer` too."""
        ...


# Matched on the path's last segments, so any prefix ("/v1", "/openai/v1", a gateway's) works;
# Gemini's on the method after the model (`models/{model}:generateContent`).
_BY_SUFFIX: tuple[tuple[tuple[str, ...], Codec], ...] = (
    (("chat", "completions"), CHAT),
    (("completions",), COMPLETIONS),
    (("responses",), RESPONSES),
    (("messages",), ANTHROPIC),
)


def codec_for(path: str) -> Codec | None:
    """The codec for a request path (session prefix already stripped; query string ignored)."""
    if is_gemini_path(path):
        return GEMINI
    segments = tuple(segment for segment in path.split("?", 1)[0].split("/") if segment)
    for suffix, codec in _BY_SUFFIX:
        if segments[-len(suffix):] == suffix:
            return codec
    return None


def parse_call(codec: Codec, path: str, body: dict[str, Any]) -> Exchange:
    """`codec.parse_request`, with the model a Gemini path names when the body names none."""
    exchange = codec.parse_request(body)
    exchange.model_requested = exchange.model_requested or model_of(path)
    return exchange
