"""One call's bytes and times as they pass, and turning them into a `CallRecord`.

The proxy's hot path only appends chunks and stamps times (`tap`); parsing,
redaction, reassembly and normalisation run later in `to_record`, in the
writer process (`writer_process.py`), which rebuilds the call from
`start_fields`, `state` and the bytes, so recording costs the harness almost
nothing per chunk.

Two kinds of trouble are told apart. What the harness or the upstream sent
wrong (a body that is not JSON, a malformed stream, an HTTP error) is the
call's own `error`: the harness saw it too. A codec raising is a bug in
forgerl (codecs read any JSON object, `apis/common.py`): `to_record` raises
`CodecBug` with the call as far as it was read, raw bytes kept, and the writer
stores that and reports the bug (`writer_process.CallSink`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from forgerl.schema.messages import Exchange
from forgerl.schema.records import CallRecord

from .apis import Codec, codec_for, parse_call
from .images import apply_mode, strip_request
from .redact import Redactor
from .sse import SSEDecoder

INCOMPLETE = "recorder stopped before the call finished"
SPLIT_SECRET = "raw response withheld: a secret was split across stream frames"
# mitmproxy's flow error when the client closes while the response still streams. A harness that hangs
# up once it has read the terminal event (Codex does) races the stream's last chunk; nothing was lost.
CLIENT_GONE = "Client disconnected."
BUG = "forgerl bug"  # how a stored error that is ours, not the harness's or the upstream's, begins
_START_FIELDS = ("call_id", "session_id", "seq", "method", "path", "upstream", "t_start", "request_headers",
                 "request_body", "websocket", "policy_version")
_STATE_FIELDS = ("status", "response_headers", "sse", "t_first_byte", "t_end", "error", "finished")


class CodecBug(Exception):
    """A codec raised on a call. `record` is the call as far as it was read (raw bytes kept), its error saying
    what raised; the exception is this one's `__cause__`."""

    def __init__(self, record: CallRecord, what: str):
        super().__init__(what)
        self.record = record


def utc(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


@dataclass
class CapturedCall:
    call_id: str
    session_id: str
    seq: int
    method: str
    path: str
    upstream: str
    t_start: float
    request_headers: list[tuple[str, str]]
    request_body: bytes | None = None
    websocket: bool = False
    status: int | None = None
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    t_first_byte: float | None = None
    t_end: float | None = None
    error: str | None = None
    finished: bool = False
    sse: bool = False
    policy_version: str | None = None
    _request_raw: bytes | None = field(default=None, repr=False)
    _request_exchange: Exchange | None = field(default=None, repr=False)
    _request_error: str | None = field(default=None, repr=False)
    _request_bug: Exception | None = field(default=None, repr=False)
    _request_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def tap(self, chunk: bytes) -> bytes:
        """mitmproxy's `flow.response.stream` callable: keep the chunk, pass it on."""
        if chunk:
            if self.t_first_byte is None:
                self.t_first_byte = time.time()
            self.chunks.append(chunk)
        return chunk

    def finish(self, error: str | None = None) -> None:
        self.t_end = time.time()
        self.error = error
        self.finished = error is None

    def start_fields(self) -> dict:
        """What is known once the request is in: `CapturedCall(**start_fields())` rebuilds it."""
        return {name: getattr(self, name) for name in _START_FIELDS}

    def state(self) -> dict:
        """What the response has changed so far, chunks aside."""
        return {name: getattr(self, name) for name in _STATE_FIELDS}

    def update(self, state: dict, data: bytes) -> None:
        """Apply a `state()` taken elsewhere, and the chunk bytes that came since."""
        for name, value in state.items():
            setattr(self, name, value)
        if data:
            self.chunks.append(data)

    def to_record(self, redactor: Redactor, full: bool = True, images: str = "keep") -> CallRecord:
        """A call row from what has been seen so far.

        `full=False` is the in-flight snapshot taken on every flush: raw bytes
        and times only, so it stays cheap for hundreds of open streams; a call
        recovered from it can be re-derived from its raw bytes. `images` is
        what `forge-record --images` keeps (`recorder/images.py`).
        """
        codec = codec_for(self.path)
        with self._request_lock:  # the writer's flush thread snapshots calls while another records them
            if self._request_raw is None:
                self._request_raw = self._stored_request(redactor, codec, images)
        request_raw = self._request_raw
        response_raw = redactor.body(b"".join(self.chunks))
        record = CallRecord(
            call_id=self.call_id, session_id=self.session_id, seq=self.seq,
            api=codec.name if codec else "raw", method=self.method, path=redactor.path(self.path),
            upstream=self.upstream, status=self.status, streamed=self.sse,
            t_start=utc(self.t_start), t_first_byte=utc(self.t_first_byte), t_end=utc(self.t_end),
            request_headers=redactor.headers(self.request_headers),
            response_headers=redactor.headers(self.response_headers),
            request_raw=request_raw, response_raw=response_raw, complete=self.finished,
            policy_version=self.policy_version,
        )
        if not full:
            record.error = self.error or INCOMPLETE
            return record
        errors = [self.error] if self.error else []
        bugs: list[tuple[str, Exception]] = []  # (what raised, the exception): see `CodecBug`
        if codec is not None and (self.method == "POST" or self.websocket):
            exchange = self._parse_request(codec, request_raw)
            if self._request_error:
                errors.append(self._request_error)
            if self._request_bug is not None:
                bugs.append((f"{codec.name} codec parsing the request", self._request_bug))
            if exchange is not None:
                record.exchange = exchange
                try:
                    record.response, response_error, whole = _reassemble(codec, self, response_raw)
                except Exception as e:  # assemblers never raise (`StreamAssembler`): ours
                    bugs.append((f"{codec.name} codec reassembling the response", e))
                    response_error, whole = None, False
                if response_error:
                    errors.append(response_error)
                if whole and self.error == CLIENT_GONE:  # hung up after the terminal event: nothing was lost
                    errors.remove(self.error)
                    record.complete = True
                if isinstance(record.response, dict):
                    if _redact_reassembled(record, redactor):
                        errors.append(SPLIT_SECRET)
                    try:
                        codec.parse_response(record.response, exchange)
                    except Exception as e:  # any JSON object is read: ours
                        bugs.append((f"{codec.name} codec reading the response", e))
        if self.status is not None and self.status >= 400 and not any("HTTP" in e for e in errors):
            errors.insert(0, f"HTTP {self.status}")
        if not self.finished and self.error is None:
            errors.append(INCOMPLETE)
        notes = [redactor.text(f"{BUG}: the {what} raised {type(e).__name__}: {e}") for what, e in bugs]
        record.error = "; ".join(dict.fromkeys(errors + notes)) or None
        if bugs:
            raise CodecBug(record, "; ".join(notes)) from bugs[0][1]
        return record

    def _stored_request(self, redactor: Redactor, codec: Codec | None, images: str) -> bytes:
        """The redacted request, its images moved out (to the exchange's blobs) as `images` says: done before
        any row is written, in-flight snapshots included, so pixels a mode leaves out never reach disk."""
        raw = redactor.body(self.request_body) or b""
        if codec is None or not (self.method == "POST" or self.websocket):
            return raw
        self._parse_request(codec, raw)
        exchange = self._request_exchange
        if exchange is None or not exchange.blobs:
            return raw
        blobs = dict(exchange.blobs)
        apply_mode(exchange, images)
        return strip_request(raw, blobs, images)

    def _parse_request(self, codec: Codec, request_raw: bytes | None) -> Exchange | None:
        """Parse once: a call may be turned into a record more than once. A body that is not a JSON object is the
        harness's doing (`_request_error`); the codec raising on one is ours (`_request_bug`)."""
        if self._request_exchange is None and self._request_error is None and self._request_bug is None:
            try:
                body = json.loads(request_raw or b"")
                if not isinstance(body, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                self._request_error = f"request body is not a JSON object: {e}"
            else:
                try:
                    self._request_exchange = parse_call(codec, self.path, body)
                except Exception as e:  # codecs take any JSON object apart (`apis/common.py`)
                    self._request_bug = e
        if self._request_exchange is None:
            return None
        return replace(self._request_exchange, output=[])


def _redact_reassembled(record: CallRecord, redactor: Redactor) -> bool:
    """Redact the reassembled body; a secret found only here was split across
    frames, so the raw stream still holds its pieces and is not kept."""
    text = json.dumps(record.response, ensure_ascii=False).encode()
    redacted = redactor.body(text)
    if redacted == text:
        return False
    record.response = json.loads(redacted)
    record.response_raw = None
    return True


def _reassemble(codec: Codec, call: CapturedCall, raw: bytes | None) -> tuple[dict | None, str | None, bool]:
    """The response body as JSON, parsed directly or rebuilt from its SSE frames; the problem; whether a
    stream reached its terminal event."""
    if not raw:
        return None, None, False
    if call.sse:
        decoder = SSEDecoder()
        stream = codec.new_stream()
        for event in [*decoder.feed(raw), *decoder.close()]:
            stream.feed(event)
        error = stream.error
        if call.finished and not stream.done and error is None:
            error = "stream ended before its terminal event"
        return stream.result(), error, stream.done and error is None
    try:
        body = json.loads(raw)
    except ValueError:
        return None, "response body is not JSON", False
    return (body, None, False) if isinstance(body, dict) else (None, "response body is not a JSON object", False)
