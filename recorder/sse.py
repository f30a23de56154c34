"""Incremental Server-Sent Events framing for the proxy's streaming hook.

mitmproxy hands the recorder each response chunk as it arrives, cut at
arbitrary points: mid-line, mid-UTF-8 character, between the `\\r` and `\\n`
of a line ending. `SSEDecoder` buffers bytes until a line is complete and
turns complete frames into `SSEEvent`s, following the WHATWG event-stream
rules (`\\n`, `\\r\\n` and `\\r` line endings, multi-line `data:`, `:`
comments, one optional space after the colon).

It runs on every chunk of every stream, so the work is done with bytes
methods (find, replace, split) over whole chunks and a Python loop per *line*,
never per byte; a long line arriving in many chunks is kept as a list of
pieces and joined once, so it costs linear time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched frame.

    `event` is the `event:` field (None when absent or empty: the spec's
    default type "message"); `data` is the `data:` lines joined by `\\n`;
    `id` is the last event id seen on the stream, which persists across
    frames as the spec says.
    """

    event: str | None = None
    data: str = ""
    id: str | None = None


class SSEDecoder:
    """Feed raw bytes in any chunking; get back the frames each chunk completes."""

    def __init__(self) -> None:
        self._tail: list[bytes] = []  # the unfinished line, in pieces; may end in a held b"\r"
        self._tail_ends_cr = False
        self._started = False
        self._event: str | None = None
        self._data: list[str] = []
        self._last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume one chunk; return the frames it completed, in order."""
        if not chunk:
            return []
        if not self._tail_ends_cr and b"\n" not in chunk and b"\r" not in chunk:
            self._tail.append(chunk)
            return []
        data = b"".join(self._tail) + chunk if self._tail else chunk
        held = b""
        if data.endswith(b"\r"):
            # The next chunk may start with b"\n": decide what this b"\r" ends then.
            data, held = data[:-1], b"\r"
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = data.rfind(b"\n")
        self._tail = [piece for piece in (data[cut + 1:], held) if piece]
        self._tail_ends_cr = bool(held)
        return self._lines(data[:cut]) if cut >= 0 else []

    def close(self) -> list[SSEEvent]:
        """End of stream: the unfinished line ends here and a frame in progress is dispatched."""
        # The tail holds no line break but possibly one held b"\r", which ends its line.
        events = self._lines(b"".join(self._tail).removesuffix(b"\r")) if self._tail else []
        self._tail, self._tail_ends_cr = [], False
        if self._data or self._event is not None:
            events.append(self._dispatch())
        return events

    def _lines(self, complete: bytes) -> list[SSEEvent]:
        """Interpret `complete`: whole lines joined by b"\\n", the last one's terminator cut off."""
        text = complete.decode("utf-8", "replace")
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        events: list[SSEEvent] = []
        for line in text.split("\n"):
            if not line:
                if self._data or self._event is not None:
                    events.append(self._dispatch())
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value or None
            elif name == "id" and "\0" not in value:
                self._last_id = value
        return events

    def _dispatch(self) -> SSEEvent:
        event = SSEEvent(event=self._event, data="\n".join(self._data), id=self._last_id)
        self._event, self._data = None, []
        return event
