"""One model turn as every codec writes it: the canonical answer, and the frames its streams are made of.

Serve mode answers a harness with a policy's turn, and the scripted upstream
(`examples/scripted_upstream.py`) answers with a script's. Both build an
`Answer` and let the codec of the harness's API write it (`render_response`;
a stream through the codec's `StreamWriter`, which serve mode tells the turn
as it is generated and `render_stream` replays whole), so there is one writer
per API and it is the inverse of that codec's reader: parsing what a codec
rendered gives back the answer (tests/test_codec_render.py).

Streams are `Frame`s rather than bytes: a frame is sent as one SSE event or,
on the Responses WebSocket, as one text message (its JSON data), and frames
that carry generated text are marked `delta` (where a stream's pace and
time to first token show).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from forgerl.schema.messages import Message, Usage
from forgerl.schema.toolcalls import ParsedTurn, ToolCall

__all__ = ["Answer", "Frame", "Pieces", "StreamWriter", "chunks", "new_id", "replay"]

Pieces = Callable[[str], Iterable[str]]
"""How a stream cuts a text (reasoning, answer text, tool arguments) into deltas."""

CHUNK = 24


@dataclass(frozen=True)
class Answer:
    """A finished turn: what the model said, and the facts every API reports about it.

    `id` is the stem of every id the answer carries (each API adds its prefix:
    ``msg_``, ``resp_``, ``chatcmpl-``, ...). `finish` is "stop" (the turn ended:
    each API names it by whether there are tool calls) or "length" (cut at the
    token limit). `signature` is Anthropic's thinking signature, which the
    Responses API calls encrypted_content. Token ids and logprobs are a served
    policy's (vLLM's fields for the chat APIs, the `forge` extension otherwise).
    """

    id: str
    model: str
    turn: ParsedTurn
    call_ids: tuple[str, ...]
    usage: Usage
    finish: str = "stop"
    created: int = 0
    signature: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if len(self.call_ids) != len(self.turn.tool_calls):
            raise ValueError(f"{len(self.turn.tool_calls)} tool calls but {len(self.call_ids)} call ids")
        if self.completion_logprobs is not None and len(self.completion_logprobs) != len(
                self.completion_token_ids or ()):
            raise ValueError("logprobs need the completion's token ids, one each")

    @property
    def truncated(self) -> bool:
        return self.finish == "length"

    def calls(self) -> Iterator[tuple[str, ToolCall]]:
        """(call id, call) in order."""
        return zip(self.call_ids, self.turn.tool_calls)

    def message(self) -> Message:
        """The canonical assistant message, as a later request that repeats this turn carries it."""
        return self.turn.message(list(self.call_ids))


@dataclass(frozen=True, slots=True)
class Frame:
    """One event of a rendered stream: its SSE `event:` name (None for the data-only chat APIs) and data
    (a JSON object, or a raw string such as chat's ``[DONE]``)."""

    event: str | None
    data: dict[str, Any] | str
    delta: bool = False  # carries generated text

    def text(self) -> str:
        """The data as sent: compact JSON, as the vendors send it."""
        return self.data if isinstance(self.data, str) else _compact(self.data)

    def sse(self) -> bytes:
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {self.text()}\n\n".encode()


class StreamWriter(Protocol):
    """One API's stream of a turn, written as the turn is said (serve mode streams a policy's tokens this way).

    Made from a `head` answer (id, model, created, input usage, prompt ids: what is known before the first
    token), then told the turn in order: reasoning pieces (an empty piece opens the block), text pieces,
    whole tool calls; `finish` with the whole answer writes what only the end knows (stop reason, usage,
    token ids), `fail` the API's error event instead. Each returns the frames to send now.
    """

    def start(self) -> list[Frame]: ...

    def reasoning(self, piece: str) -> list[Frame]: ...

    def text(self, piece: str) -> list[Frame]: ...

    def tool_call(self, call_id: str, call: ToolCall, pieces: Pieces) -> list[Frame]: ...

    def finish(self, answer: Answer) -> list[Frame]: ...

    def fail(self, message: str) -> list[Frame]: ...


def replay(writer: StreamWriter, answer: Answer, pieces: Pieces) -> Iterator[Frame]:
    """A finished answer told to a writer, texts cut by `pieces`: how every codec's `render_stream` is made."""
    yield from writer.start()
    if answer.turn.reasoning is not None:
        for piece in list(pieces(answer.turn.reasoning)) or [""]:
            yield from writer.reasoning(piece)
    for piece in pieces(answer.turn.text):
        yield from writer.text(piece)
    for call_id, call in answer.calls():
        yield from writer.tool_call(call_id, call, pieces)
    yield from writer.finish(answer)


_compact: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def chunks(text: str) -> list[str]:
    """Serve mode's pieces: at most `CHUNK` characters each."""
    return [text[start:start + CHUNK] for start in range(0, len(text), CHUNK)]


def new_id(prefix: str = "") -> str:
    """A fresh random id (answers, tool calls) for a server that does not need to repeat itself."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"
