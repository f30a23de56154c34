"""SSEDecoder: frames come out the same however the bytes are chunked."""

from __future__ import annotations

import random
import time

import pytest
from openai._streaming import SSEDecoder as OpenAIDecoder

from forgerl.recorder.sse import SSEDecoder, SSEEvent

STREAM = (
    ": keep-alive comment\n"
    "event: message_start\n"
    'data: {"type":"message_start","text":"Zürich — 東京 ☀️"}\n'
    "\n"
    "id: 7\n"
    "data:first line\n"
    "data: second line\n"
    "data\n"
    "retry: 3000\n"
    "\n"
    "event: ping\n"
    "\n"
    "\n\n"
    'data: {"delta":"ünïcødé 🎉"}\n'
    "\n"
    "data: [DONE]\n"
    "\n"
)

EXPECTED = [
    SSEEvent("message_start", '{"type":"message_start","text":"Zürich — 東京 ☀️"}'),
    SSEEvent(None, "first line\nsecond line\n", "7"),
    SSEEvent("ping", "", "7"),
    SSEEvent(None, '{"delta":"ünïcødé 🎉"}', "7"),
    SSEEvent(None, "[DONE]", "7"),
]

ENDINGS = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}


def decode(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [event for chunk in chunks for event in decoder.feed(chunk)]
    return events + decoder.close()


def encoded(ending: str) -> bytes:
    return STREAM.replace("\n", ending).encode("utf-8")


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_whole_stream(ending: str) -> None:
    assert decode([encoded(ending)]) == EXPECTED


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_every_two_way_split(ending: str) -> None:
    raw = encoded(ending)
    for cut in range(len(raw) + 1):
        assert decode([raw[:cut], raw[cut:]]) == EXPECTED, cut


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_one_byte_chunks_and_random_splits(ending: str) -> None:
    raw = encoded(ending)
    assert decode([raw[i:i + 1] for i in range(len(raw))]) == EXPECTED
    rng = random.Random(1)
    for _ in range(300):
        cuts = sorted(rng.sample(range(len(raw) + 1), rng.randint(2, 12)))
        chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
        assert decode(chunks) == EXPECTED, cuts


def test_frames_come_out_as_soon_as_their_blank_line_arrives() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: a\ndata: 1\n") == []
    assert decoder.feed(b"\n") == [SSEEvent("a", "1")]
    assert decoder.feed(b"data: 2\r\n\r") == []  # the last \r might be the start of \r\n
    assert decoder.feed(b"\ndata: 3\n\n") == [SSEEvent(None, "2"), SSEEvent(None, "3")]


def test_close_flushes_a_frame_without_its_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'event: message_stop\ndata: {"type":"message_stop"}') == []
    assert decoder.close() == [SSEEvent("message_stop", '{"type":"message_stop"}')]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.close() == [SSEEvent(None, "x")]
    assert SSEDecoder().close() == []


def test_comment_only_frames_and_empty_chunks_dispatch_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b": ping\n\n: ping\n\n") == []
    assert decoder.close() == []


def test_bom_and_invalid_utf8_never_raise() -> None:
    assert decode([b"\xef\xbb", b"\xbfdata: a\n\n"]) == [SSEEvent(None, "a")]
    assert decode([b"data: \xff\xfe ok\n\n"]) == [SSEEvent(None, "\ufffd\ufffd ok")]


def test_field_names_are_exact() -> None:
    assert decode([b"Data: no\ndata : no\ndatum: no\nevent:x\ndata:  two spaces\n\n"]) == [SSEEvent("x", " two spaces")]


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_agrees_with_the_openai_sdk_decoder(ending: str) -> None:
    """The SDK's decoder is used by every OpenAI client; fed the whole stream at once it is the reference."""
    # Without `id:`: the SDK dispatches an empty event on every blank line once an id was seen.
    raw = encoded(ending).replace(f"id: 7{ending}".encode(), b"")
    ours = decode([raw])
    theirs = [SSEEvent(event.event, event.data, event.id) for event in OpenAIDecoder().iter_bytes(iter([raw]))]
    assert ours == theirs == [SSEEvent(event.event, event.data) for event in EXPECTED]


def test_a_long_line_in_many_chunks_costs_linear_time() -> None:
    payload = b"data: " + b"x" * 4_000_000 + b"\n\n"
    chunks = [payload[i:i + 1024] for i in range(0, len(payload), 1024)]
    start = time.perf_counter()
    events = decode(chunks)
    assert time.perf_counter() - start < 1.0
    assert len(events) == 1 and len(events[0].data) == 4_000_000
