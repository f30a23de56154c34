"""API codecs: exact request round trips, stream reassembly under any chunking, usage and errors.

Stream fixtures are the frames each API really sends (field for field as in
the providers' docs and captured traffic); the expected bodies are written
out by hand as the non-streaming call returns them, and where the official
SDKs ship an offline accumulator the result is checked against it too.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from typing import Any

import pytest

from forgerl.recorder.apis import ANTHROPIC, CHAT, COMPLETIONS, RESPONSES, Codec, codec_for
from forgerl.recorder.sse import SSEDecoder, SSEEvent
from forgerl.schema.messages import Exchange, Message, Part, Usage, sha256_hex

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
PNG_B64 = base64.b64encode(PNG).decode()
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4
JPEG_B64 = base64.b64encode(JPEG).decode()


# -- helpers ----------------------------------------------------------------------

def sse(frames: list[dict[str, Any] | str], named: bool = True) -> bytes:
    """Frames as a server writes them: `event:` + `data:` (Anthropic, Responses) or `data:` only."""
    out = []
    for frame in frames:
        if isinstance(frame, str):
            out.append(f"data: {frame}\n\n")
        elif named:
            out.append(f"event: {frame['type']}\ndata: {json.dumps(frame, ensure_ascii=False)}\n\n")
        else:
            out.append(f"data: {json.dumps(frame, ensure_ascii=False)}\n\n")
    return "".join(out).encode("utf-8")


def assemble(codec: Codec, chunks: list[bytes]):
    decoder, stream = SSEDecoder(), codec.new_stream()
    for chunk in chunks:
        for event in decoder.feed(chunk):
            stream.feed(event)
    for event in decoder.close():
        stream.feed(event)
    return stream


def events_of(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [event for chunk in chunks for event in decoder.feed(chunk)] + decoder.close()


def check_every_split(codec: Codec, raw: bytes, expected: dict[str, Any]) -> None:
    """The assembler only sees events, so: the same events for a split at every byte, and the
    expected body through the whole pipeline for the unsplit stream and many random many-way splits."""
    whole = events_of([raw])
    for cut in range(len(raw) + 1):
        assert events_of([raw[:cut], raw[cut:]]) == whole, cut
    assert assemble(codec, [raw]).result() == expected
    rng = random.Random(7)
    for _ in range(100):
        cuts = sorted(rng.sample(range(len(raw) + 1), rng.randint(3, 40)))
        assert assemble(codec, [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]).result() == expected


def round_trip(codec: Codec, body: dict[str, Any]) -> Exchange:
    original = copy.deepcopy(body)
    exchange = codec.parse_request(body)
    assert body == original, "parse_request must not mutate the body"
    stored = {key: bytes(value) for key, value in exchange.blobs.items()}
    rendered = codec.render_request(exchange, stored)
    assert rendered == original
    # The canonical messages survive their own serialisation (what the store writes).
    again = Exchange(input=[Message.from_dict(m.to_dict()) for m in exchange.input], params=exchange.params)
    assert codec.render_request(again, stored) == original
    return exchange


def feed_all(codec: Codec, frames: list[dict[str, Any] | str], named: bool = True):
    return assemble(codec, [sse(frames, named)])


# -- codec_for ----------------------------------------------------------------------

@pytest.mark.parametrize("path, name", [
    ("/v1/messages", "anthropic"),
    ("/v1/messages?beta=true", "anthropic"),
    ("/messages", "anthropic"),
    ("/v1/messages/count_tokens", None),
    ("/v1/responses", "responses"),
    ("/responses", "responses"),
    ("/v1/responses/resp_123", None),
    ("/v1/chat/completions", "chat"),
    ("/openai/v1/chat/completions", "chat"),
    ("/chat/completions?api-version=2024-10-21", "chat"),
    ("/v1/completions", "completions"),
    ("/completions", "completions"),
    ("/v1/models", None),
    ("/", None),
    ("/v1/mymessages", None),
])
def test_codec_for(path: str, name: str | None) -> None:
    codec = codec_for(path)
    assert (codec.name if codec else None) == name


# -- Anthropic ------------------------------------------------------------------------

CLAUDE_CODE_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5-20250929",
    "max_tokens": 32000,
    "stream": True,
    "temperature": 1,
    "metadata": {"user_id": "user_5f1e_account__session_0b4c"},
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "system": [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nYou are an interactive CLI tool that helps users with software engineering tasks.",
         "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "tools": [
        {"name": "Bash", "description": "Executes a bash command.",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
                          "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}},
        {"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string"}}}, "cache_control": {"type": "ephemeral"}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "messages": [
        {"role": "user", "content": "What's in this repo? Also check the weather in Zürich."},
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>Screenshots attached.</system-reminder>"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/diagram.jpg"}},
        ]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Two independent lookups: run them in parallel.",
             "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYdsG=="},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "Bash",
             "input": {"command": "ls -la", "description": "List files"}},
            {"type": "tool_use", "id": "toolu_01B7sj2k3l4m5n6o7p8q9r0", "name": "Read",
             "input": {"file_path": "/repo/README.md", "limit": 2.5, "flags": [True, None]}},
            {"type": "server_tool_use", "id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE", "name": "web_search",
             "input": {"query": "Zürich weather"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
             "content": [{"type": "web_search_result", "url": "https://meteo.example/zh", "title": "Zürich",
                          "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y",
                          "page_age": "1 hour ago"}]},
            {"type": "text", "text": "It is 14 °C in Zürich.", "citations": [
                {"type": "web_search_result_location", "url": "https://meteo.example/zh", "title": "Zürich",
                 "encrypted_index": "Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm", "cited_text": "14 °C"}]},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
             "content": "total 8\ndrwxr-xr-x  2 root root 4096 README.md"},
            {"type": "tool_result", "tool_use_id": "toolu_01B7sj2k3l4m5n6o7p8q9r0", "is_error": True,
             "content": [{"type": "text", "text": "File is an image:"},
                         {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                                      "data": JPEG_B64}}]},
            {"type": "tool_result", "tool_use_id": "toolu_01C", "is_error": False, "content": []},
            {"type": "tool_result", "tool_use_id": "toolu_01D"},
            {"type": "text", "text": "Thanks, continue.", "cache_control": {"type": "ephemeral"}},
        ]},
    ],
}


def test_anthropic_round_trip_of_a_claude_code_request() -> None:
    exchange = round_trip(ANTHROPIC, CLAUDE_CODE_BODY)
    assert exchange.model_requested == "claude-sonnet-4-5-20250929"
    assert exchange.params == {key: value for key, value in CLAUDE_CODE_BODY.items()
                               if key not in ("system", "messages")}
    assert [m.role for m in exchange.input] == ["system", "user", "user", "assistant", "user"]
    system, _, shots, assistant, results = exchange.input
    assert system.parts[0].text.startswith("You are Claude Code")
    assert all(p.extra is None for p in system.parts), "cache_control is a layout hint, not part content"

    png, url_image = shots.parts[1:]
    assert (png.type, png.blob_hash, png.media_type, png.url) == ("image", sha256_hex(PNG), "image/png", None)
    assert url_image.url == "https://example.com/diagram.jpg" and url_image.blob_hash is None
    assert exchange.blobs == {sha256_hex(PNG): PNG, sha256_hex(JPEG): JPEG}

    thinking, redacted, _text, bash, read, server, search, cited = assistant.parts
    assert (thinking.type, thinking.text, thinking.signature) == (
        "reasoning", "Two independent lookups: run them in parallel.",
        "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYdsG==")
    assert redacted.redacted and redacted.signature.startswith("EmwK") and redacted.text is None
    assert (bash.type, bash.tool_name, bash.call_id) == ("tool_call", "Bash", "toolu_01A09q90qw90lq917835lq9")
    assert json.loads(bash.arguments) == {"command": "ls -la", "description": "List files"}
    assert read.tool_name == "Read"
    assert server.type == search.type == "other" and server.extra["type"] == "server_tool_use"
    assert cited.extra["citations"][0]["cited_text"] == "14 °C"

    listing, failed, empty, bare, thanks = results.parts
    assert (listing.type, listing.text, listing.content, listing.is_error) == (
        "tool_result", "total 8\ndrwxr-xr-x  2 root root 4096 README.md", None, None)
    assert failed.is_error is True and failed.text is None
    assert [p.type for p in failed.content] == ["text", "image"] and failed.content[1].blob_hash == sha256_hex(JPEG)
    assert empty.is_error is False and empty.content == ()
    assert bare.text is None and bare.content is None
    assert thanks.extra is None

    assert exchange.tools == [
        {"name": "Bash", "description": "Executes a bash command.",
         "parameters": CLAUDE_CODE_BODY["tools"][0]["input_schema"]},
        {"name": "Read", "description": "Reads a file.", "parameters": CLAUDE_CODE_BODY["tools"][1]["input_schema"]},
        {"name": "web_search", "max_uses": 5, "type": "web_search_20250305"},
    ]


def test_anthropic_system_string_and_shapes_left_alone() -> None:
    body = {"model": "claude-haiku-4-5", "max_tokens": 512, "system": "Be terse.",
            "messages": [{"role": "user", "content": ""},
                         {"role": "assistant", "content": []},
                         {"role": "user", "content": [{"type": "document", "source": {
                             "type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}}]},
                         {"role": "user", "content": [{"type": "image", "source": {
                             "type": "base64", "media_type": "image/png", "data": "not base64!"}}]},
                         # valid base64 that would not re-encode to itself (non-zero padding bits)
                         {"role": "user", "content": [{"type": "image", "source": {
                             "type": "base64", "media_type": "image/png", "data": "QR=="}}]}]}
    exchange = round_trip(ANTHROPIC, body)
    assert exchange.input[0] == Message("system", (Part("text", text="Be terse."),),
                                        {"forge": {"string_content": True}})
    assert exchange.input[2].parts == () and exchange.input[2].extra == {"content": []}
    assert exchange.input[3].parts[0].type == "other"
    assert exchange.input[4].parts[0].blob_hash is None and exchange.input[5].parts[0].blob_hash is None
    assert exchange.blobs == {}
    round_trip(ANTHROPIC, {"model": "m", "messages": [], "system": None})
    round_trip(ANTHROPIC, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": []})


def test_anthropic_part_hashes_ignore_the_moving_cache_breakpoint() -> None:
    turn = {"type": "text", "text": "Thanks, continue."}
    first = ANTHROPIC.parse_request({"messages": [{"role": "user", "content": [
        {**turn, "cache_control": {"type": "ephemeral"}}]}]})
    later = ANTHROPIC.parse_request({"messages": [{"role": "user", "content": [turn]}]})
    assert first.input[0].parts[0].hash("user") == later.input[0].parts[0].hash("user")
    assert first.input[0].extra != later.input[0].extra


ANTHROPIC_MESSAGE_START = {
    "type": "message_start",
    "message": {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
                "model": "claude-sonnet-4-5-20250929", "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 12, "cache_creation_input_tokens": 2048, "cache_read_input_tokens": 18000,
                          "cache_creation": {"ephemeral_5m_input_tokens": 2048, "ephemeral_1h_input_tokens": 0},
                          "output_tokens": 1, "service_tier": "standard"}},
}


def block_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


ANTHROPIC_FRAMES: list[dict[str, Any]] = [
    ANTHROPIC_MESSAGE_START,
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
    {"type": "ping"},
    block_delta(0, {"type": "thinking_delta", "thinking": "The user wants the weather in "}),
    block_delta(0, {"type": "thinking_delta", "thinking": "Paris and Zürich — two calls."}),
    block_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk=="}),
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    block_delta(1, {"type": "text_delta", "text": "Checking both cities "}),
    block_delta(1, {"type": "text_delta", "text": "now ☀️."}),
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {
        "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {}}},
    block_delta(2, {"type": "input_json_delta", "partial_json": ""}),
    block_delta(2, {"type": "input_json_delta", "partial_json": "{\"city\": \"Pa"}),
    block_delta(2, {"type": "input_json_delta", "partial_json": "ris\", \"unit\": \"c\"}"}),
    {"type": "content_block_stop", "index": 2},
    {"type": "content_block_start", "index": 3, "content_block": {
        "type": "tool_use", "id": "toolu_01WcB5v7Qq3Zr8jGvJk9nH2s", "name": "get_weather", "input": {}}},
    block_delta(3, {"type": "input_json_delta", "partial_json": "{\"city\": \"Zürich\"}"}),
    {"type": "content_block_stop", "index": 3},
    {"type": "content_block_start", "index": 4, "content_block": {
        "type": "tool_use", "id": "toolu_01Xq", "name": "list_cities", "input": {}}},
    {"type": "content_block_stop", "index": 4},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
     "usage": {"input_tokens": 12, "cache_creation_input_tokens": 2048, "cache_read_input_tokens": 18000,
               "output_tokens": 187}},
    {"type": "message_stop"},
]

ANTHROPIC_MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "thinking", "thinking": "The user wants the weather in Paris and Zürich — two calls.",
         "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk=="},
        {"type": "text", "text": "Checking both cities now ☀️."},
        {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather",
         "input": {"city": "Paris", "unit": "c"}},
        {"type": "tool_use", "id": "toolu_01WcB5v7Qq3Zr8jGvJk9nH2s", "name": "get_weather",
         "input": {"city": "Zürich"}},
        {"type": "tool_use", "id": "toolu_01Xq", "name": "list_cities", "input": {}},
    ],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 12, "cache_creation_input_tokens": 2048, "cache_read_input_tokens": 18000,
              "cache_creation": {"ephemeral_5m_input_tokens": 2048, "ephemeral_1h_input_tokens": 0},
              "output_tokens": 187, "service_tier": "standard"},
}


def test_anthropic_stream_reassembles_under_any_chunking() -> None:
    raw = sse(ANTHROPIC_FRAMES)
    check_every_split(ANTHROPIC, raw, ANTHROPIC_MESSAGE)
    stream = assemble(ANTHROPIC, [raw])
    assert stream.done and stream.error is None and stream.first_token_seen
    crlf = raw.replace(b"\n", b"\r\n")
    assert assemble(ANTHROPIC, [crlf[i:i + 5] for i in range(0, len(crlf), 5)]).result() == ANTHROPIC_MESSAGE


def test_anthropic_stream_matches_the_sdk_accumulator() -> None:
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    for frame in ANTHROPIC_FRAMES:
        if frame["type"] != "ping":
            snapshot = accumulate_event(event=copy.deepcopy(frame), current_snapshot=snapshot)
    theirs = snapshot.to_dict()
    assert theirs.pop("stop_details") is None  # the SDK sets it from every message_delta, sent or not
    assert feed_all(ANTHROPIC, ANTHROPIC_FRAMES).result() == theirs


def test_anthropic_response_parsing() -> None:
    exchange = Exchange()
    ANTHROPIC.parse_response(feed_all(ANTHROPIC, ANTHROPIC_FRAMES).result(), exchange)
    assert exchange.usage == Usage(input_tokens=12, output_tokens=187, cache_read_tokens=18000, cache_write_tokens=2048)
    assert (exchange.stop_reason, exchange.model_returned, exchange.error) == (
        "tool_use", "claude-sonnet-4-5-20250929", None)
    [message] = exchange.output
    assert message.role == "assistant"
    assert [p.type for p in message.parts] == ["reasoning", "text", "tool_call", "tool_call", "tool_call"]
    assert [p.arguments for p in message.parts[2:]] == ['{"city":"Paris","unit":"c"}', '{"city":"Zürich"}', "{}"]
    # The same turn sent back as history hashes the same, so threads continue.
    history = ANTHROPIC.parse_request({"messages": [{"role": "assistant", "content": ANTHROPIC_MESSAGE["content"]}]})
    assert [p.hash("assistant") for p in history.input[0].parts] == [p.hash("assistant") for p in message.parts]


def test_anthropic_citations_and_cumulative_usage() -> None:
    citation = {"type": "char_location", "cited_text": "grass is green", "document_index": 0,
                "document_title": "Facts", "start_char_index": 0, "end_char_index": 14}
    frames = [
        ANTHROPIC_MESSAGE_START,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "", "citations": []}},
        block_delta(0, {"type": "citations_delta", "citation": citation}),
        block_delta(0, {"type": "text_delta", "text": "The grass is green."}),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 9}},
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
         "usage": {"output_tokens": 20, "cache_read_input_tokens": None}},
        {"type": "message_stop"},
    ]
    body = feed_all(ANTHROPIC, frames).result()
    assert body["content"] == [{"type": "text", "text": "The grass is green.", "citations": [citation]}]
    assert body["stop_reason"] == "max_tokens"
    assert body["usage"]["output_tokens"] == 20 and body["usage"]["cache_read_input_tokens"] == 18000


def test_anthropic_error_event_inside_a_200_stream() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    frames = [ANTHROPIC_MESSAGE_START, *ANTHROPIC_FRAMES[7:9], overloaded]
    stream = feed_all(ANTHROPIC, frames)
    assert stream.error == "overloaded_error: Overloaded" and not stream.done
    assert stream.result()["content"] == [{"type": "text", "text": "Checking both cities "}]

    only_error = feed_all(ANTHROPIC, [overloaded])
    assert only_error.result() == overloaded
    exchange = Exchange()
    ANTHROPIC.parse_response(only_error.result(), exchange)
    assert exchange.error == "overloaded_error: Overloaded" and exchange.output == []


def test_anthropic_cut_and_malformed_streams_never_raise() -> None:
    raw = sse(ANTHROPIC_FRAMES)
    cut = raw[:raw.rindex(b"event:", 0, raw.index(b"ris\\\""))]  # between frames, mid tool JSON
    stream = assemble(ANTHROPIC, [cut])
    body = stream.result()
    assert not stream.done and stream.error is None
    assert body["content"][2] == {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                                  "name": "get_weather", "input": {}}
    assert body["usage"]["output_tokens"] == 1

    stream = ANTHROPIC.new_stream()
    for data in ['{"type":"message_start","message":', "[1, 2]", '{"type":"content_block_delta","index":9}',
                 '{"type":"content_block_start","index":0,"content_block":"text"}', '{"type":"brand_new_event"}']:
        stream.feed(SSEEvent("message_start", data))
    assert stream.error.startswith("malformed SSE frame") and stream.result() == {}

    broken = [f for f in ANTHROPIC_FRAMES if f.get("index") != 3 or f["type"] != "content_block_delta"]
    broken.insert(17, block_delta(3, {"type": "input_json_delta", "partial_json": "{\"city\": "}))
    stream = feed_all(ANTHROPIC, broken)
    assert stream.error == "tool input of block 3 is not valid JSON" and stream.result()["content"][3]["input"] == {}


# -- OpenAI Responses -------------------------------------------------------------------

REASONING_ITEM = {"type": "reasoning", "id": "rs_68a1b2", "summary": [
    {"type": "summary_text", "text": "**Inspecting the repo**\n\nI should list files first."},
    {"type": "summary_text", "text": "**Planning the patch**"}],
    "content": None, "encrypted_content": "gAAAAABoqZ0kW3x1c2VyX2VuY3J5cHRlZF9yZWFzb25pbmc="}

CODEX_BODY: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI.",
    "input": [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text",
             "text": "<permissions instructions>approval_policy=never</permissions instructions>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"},
            {"type": "input_text", "text": "Fix the failing test, see screenshot."},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}", "detail": "auto"},
            {"type": "input_image", "image_url": "https://example.com/ci.png"}]},
        REASONING_ITEM,
        {"type": "message", "role": "assistant", "id": "msg_68a1b3", "status": "completed", "content": [
            {"type": "output_text", "text": "I'll run the tests.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_68a1b4", "call_id": "call_Q1", "name": "shell",
         "arguments": "{\"command\":[\"pytest\",\"-q\"],\"workdir\":\"/repo\"}"},
        {"type": "function_call", "call_id": "call_Q2", "name": "shell",
         "arguments": "{\"command\":[\"git\",\"status\"]}"},
        {"type": "function_call_output", "call_id": "call_Q1",
         "output": "{\"output\":\"1 failed\",\"metadata\":{\"exit_code\":1}}"},
        {"type": "function_call_output", "call_id": "call_Q2", "output": [
            {"type": "input_text", "text": "On branch main"},
            {"type": "input_image", "image_url": f"data:image/jpeg;base64,{JPEG_B64}"}]},
        {"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "call_P1", "name": "apply_patch",
         "input": "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n"},
        {"type": "custom_tool_call_output", "call_id": "call_P1", "output": "Success. Updated: a.py"},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_L1", "status": "completed",
         "action": {"type": "exec", "command": ["cat", "a.py"], "env": {}, "timeout_ms": 1000}},
        {"type": "local_shell_call_output", "id": "call_L1", "output": "x = 2\n"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "pytest -q"}},
        {"role": "assistant", "content": "Done: the test passes now."},
        {"role": "user", "content": "thanks"},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"], "additionalProperties": False}},
        {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: patch"}},
        {"type": "local_shell"},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    "text": {"verbosity": "medium"},
}


def test_responses_round_trip_of_a_codex_request() -> None:
    exchange = round_trip(RESPONSES, CODEX_BODY)
    assert exchange.params == {k: v for k, v in CODEX_BODY.items() if k not in ("instructions", "input")}
    assert [m.role for m in exchange.input] == [
        "system", "developer", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "tool",
        "assistant", "user"]
    instructions, developer, user, turn, out1, out2, patch, patch_out, shell, shell_out, final, thanks = exchange.input
    assert instructions.text().startswith("You are Codex") and instructions.extra == {"forge": {"instructions": True}}
    assert developer.extra == {"type": "message"}
    assert [p.type for p in user.parts] == ["text", "text", "image", "image"]
    assert user.parts[2].blob_hash == sha256_hex(PNG) and user.parts[2].extra == {"detail": "auto"}
    assert user.parts[3].url == "https://example.com/ci.png"

    # reasoning + assistant message + two parallel calls: one assistant turn, as in the other APIs
    reasoning, text, call1, call2 = turn.parts
    assert (reasoning.type, reasoning.signature) == ("reasoning", REASONING_ITEM["encrypted_content"])
    assert reasoning.text == "**Inspecting the repo**\n\nI should list files first.\n\n**Planning the patch**"
    assert (text.text, text.extra) == ("I'll run the tests.", {"annotations": [], "logprobs": []})
    assert (call1.tool_name, call1.call_id, call1.extra) == ("shell", "call_Q1", {"id": "fc_68a1b4"})
    assert call2.extra is None and json.loads(call2.arguments) == {"command": ["git", "status"]}
    assert [item["kind"] for item in turn.extra["forge"]["items"]] == ["item", "message", "item", "item"]

    assert (out1.parts[0].type, out1.parts[0].call_id, out1.parts[0].is_error) == ("tool_result", "call_Q1", None)
    assert [p.type for p in out2.parts[0].content] == ["text", "image"]
    assert (patch.parts[0].tool_name, patch.parts[0].extra["type"]) == ("apply_patch", "custom_tool_call")
    assert patch.parts[0].arguments.startswith("*** Begin Patch")
    assert patch_out.parts[0].extra == {"type": "custom_tool_call_output"}
    assert [p.type for p in shell.parts] == ["tool_call"]
    assert shell.parts[0].tool_name == "local_shell"
    assert json.loads(shell.parts[0].arguments)["command"] == ["cat", "a.py"]
    assert shell_out.parts[0].call_id == "call_L1"
    assert [p.type for p in final.parts] == ["other", "text"] and final.parts[0].extra["type"] == "web_search_call"
    assert final.parts[1].text == "Done: the test passes now." and thanks.extra == {"forge": {"string_content": True}}
    assert exchange.blobs == {sha256_hex(PNG): PNG, sha256_hex(JPEG): JPEG}
    assert [(t["name"], t.get("type")) for t in exchange.tools] == [
        ("shell", None), ("apply_patch", "custom"), ("local_shell", "local_shell"), ("web_search", "web_search")]


def test_responses_string_input_and_other_shapes() -> None:
    exchange = round_trip(RESPONSES, {"model": "gpt-5", "input": "Write a haiku.", "instructions": "Be brief."})
    assert [m.role for m in exchange.input] == ["system", "user"]
    round_trip(RESPONSES, {"model": "gpt-5", "input": [], "instructions": None, "previous_response_id": "resp_1"})
    round_trip(RESPONSES, {"model": "gpt-oss-120b", "input": [
        {"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]},
        {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}, "status": "completed"},
        {"type": "shell_call_output", "call_id": "c1", "output": [
            {"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "input_text", "text": "sent as input_text"}, {"type": "refusal", "refusal": "no"}]},
        {"type": "message", "role": "assistant", "content": []},
        {"type": "item_reference", "id": "msg_0"},
        {"role": "moderator", "content": "unknown role"},
    ]})


def test_responses_renders_assistant_messages_it_did_not_read() -> None:
    exchange = Exchange(input=[Message("assistant", (
        Part("reasoning", signature="enc", extra={"summary": []}), Part("text", text="a"), Part("text", text="b"),
        Part("tool_call", tool_name="shell", call_id="c1", arguments="{}")))])
    assert RESPONSES.render_request(exchange, {})["input"] == [
        {"type": "reasoning", "encrypted_content": "enc", "summary": []},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
    ]


RESPONSE_HEAD = {"id": "resp_68a1c0", "object": "response", "created_at": 1755000000, "status": "in_progress",
                 "background": False, "error": None, "incomplete_details": None, "instructions": None,
                 "max_output_tokens": None, "model": "gpt-5-codex", "output": [], "parallel_tool_calls": True,
                 "previous_response_id": None, "reasoning": {"effort": "medium", "summary": "auto"},
                 "store": False, "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
                 "tools": [], "usage": None, "metadata": {}}
DONE_ITEMS = [
    {"id": "rs_1", "type": "reasoning", "encrypted_content": "gAAAAABo-enc",
     "summary": [{"type": "summary_text", "text": "**Listing** the repo first"}]},
    {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
     "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "I'll list the files — first."}]},
    {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_abc", "name": "shell",
     "arguments": "{\"command\":[\"ls\",\"-la\"]}"},
    {"id": "ctc_1", "type": "custom_tool_call", "status": "completed", "call_id": "call_def", "name": "apply_patch",
     "input": "*** Begin Patch\n*** End Patch\n"},
]
RESPONSE_USAGE = {"input_tokens": 5120, "input_tokens_details": {"cached_tokens": 4096}, "output_tokens": 180,
                  "output_tokens_details": {"reasoning_tokens": 64}, "total_tokens": 5300}
COMPLETED = {**RESPONSE_HEAD, "status": "completed", "output": DONE_ITEMS, "usage": RESPONSE_USAGE}


def responses_frames() -> list[dict[str, Any]]:
    """A Codex turn as the API streams it; sequence numbers are filled in at the end."""
    rs, msg, fc, ctc = (dict(item) for item in DONE_ITEMS)
    frames: list[dict[str, Any]] = [
        {"type": "response.created", "response": RESPONSE_HEAD},
        {"type": "response.in_progress", "response": RESPONSE_HEAD},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "rs_1", "type": "reasoning", "summary": []}},
        {"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "part": {"type": "summary_text", "text": ""}},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "delta": "**Listing** the"},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "delta": " repo first"},
        {"type": "response.reasoning_summary_text.done", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "text": "**Listing** the repo first"},
        {"type": "response.reasoning_summary_part.done", "item_id": "rs_1", "output_index": 0, "summary_index": 0,
         "part": {"type": "summary_text", "text": "**Listing** the repo first"}},
        {"type": "response.output_item.done", "output_index": 0, "item": rs},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"id": "msg_1", "type": "message", "status": "in_progress", "content": [], "role": "assistant"}},
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}},
        *({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0,
           "delta": piece, "logprobs": []} for piece in ("I'll", " list the", " files —", " first.")),
        {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "text": "I'll list the files — first.", "logprobs": []},
        {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 1, "content_index": 0,
         "part": msg["content"][0]},
        {"type": "response.output_item.done", "output_index": 1, "item": msg},
        {"type": "response.output_item.added", "output_index": 2,
         "item": {**fc, "status": "in_progress", "arguments": ""}},
        *({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": piece}
          for piece in ("{\"command\":", "[\"ls\",", "\"-la\"]}")),
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 2,
         "arguments": fc["arguments"]},
        {"type": "response.output_item.done", "output_index": 2, "item": fc},
        {"type": "response.output_item.added", "output_index": 3,
         "item": {**ctc, "status": "in_progress", "input": ""}},
        *({"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "output_index": 3, "delta": piece}
          for piece in ("*** Begin Patch\n", "*** End Patch\n")),
        {"type": "response.custom_tool_call_input.done", "item_id": "ctc_1", "output_index": 3, "input": ctc["input"]},
        {"type": "response.output_item.done", "output_index": 3, "item": ctc},
        {"type": "response.completed", "response": COMPLETED},
    ]
    return [{**frame, "sequence_number": number} for number, frame in enumerate(frames)]


def test_responses_stream_reassembles_under_any_chunking() -> None:
    raw = sse(responses_frames())
    check_every_split(RESPONSES, raw, COMPLETED)
    stream = assemble(RESPONSES, [raw])
    assert stream.done and stream.error is None and stream.first_token_seen


def test_responses_stream_builds_the_output_without_the_terminal_event() -> None:
    frames = responses_frames()[:-1]
    body = feed_all(RESPONSES, frames).result()
    assert body["output"] == DONE_ITEMS and body["status"] == "in_progress" and body["id"] == "resp_68a1c0"
    # From deltas alone (no .done events at all), the streamed text is all there.
    deltas_only = [f for f in frames if not f["type"].endswith(".done")]
    output = feed_all(RESPONSES, deltas_only).result()["output"]
    assert output[0]["summary"] == DONE_ITEMS[0]["summary"]
    assert output[1]["content"] == DONE_ITEMS[1]["content"]
    assert output[2]["arguments"] == DONE_ITEMS[2]["arguments"]
    assert output[3]["input"] == DONE_ITEMS[3]["input"]
    # output_item.done is authoritative: with a delta seen twice (a replayed frame) and none of the
    # text-level .done events (which some servers skip), the items are still exactly the done ones.
    replayed = [f for f in [*frames[:12], frames[11], *frames[12:]]
                if f["type"] == "response.output_item.done" or not f["type"].endswith(".done")]
    assert replayed[10]["type"] == replayed[11]["type"] == "response.output_text.delta"
    assert feed_all(RESPONSES, replayed).result()["output"] == DONE_ITEMS
    # A server that leaves response.completed's output empty still gets its items recorded.
    emptied = [*frames, {"type": "response.completed", "sequence_number": 99, "response": {**COMPLETED, "output": []}}]
    assert feed_all(RESPONSES, emptied).result() == COMPLETED


def test_responses_stream_agrees_with_the_sdk_snapshot() -> None:
    from openai._models import construct_type_unchecked
    from openai._types import omit
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    state = ResponseStreamState(input_tools=omit, text_format=omit)
    frames = [f for f in responses_frames()[:-1] if f["type"] != "response.output_item.done"]
    for frame in frames:
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=copy.deepcopy(frame)))
    theirs = state._ResponseStreamState__current_snapshot.to_dict()["output"]
    ours = feed_all(RESPONSES, frames).result()["output"]
    assert ours[1]["content"][0]["text"] == theirs[1]["content"][0]["text"] == "I'll list the files — first."
    assert ours[2]["arguments"] == theirs[2]["arguments"] == DONE_ITEMS[2]["arguments"]


def test_responses_response_parsing() -> None:
    exchange = Exchange()
    RESPONSES.parse_response(COMPLETED, exchange)
    assert exchange.usage == Usage(input_tokens=1024, output_tokens=180, cache_read_tokens=4096, reasoning_tokens=64)
    assert (exchange.stop_reason, exchange.model_returned, exchange.error) == ("completed", "gpt-5-codex", None)
    [turn] = exchange.output
    assert [p.type for p in turn.parts] == ["reasoning", "text", "tool_call", "tool_call"]
    assert turn.parts[0].signature == "gAAAAABo-enc" and turn.parts[3].tool_name == "apply_patch"
    # Sent back as the next request's history (ids and all, as Codex does with store=false), it renders back.
    next_body = {"model": "gpt-5-codex", "input": DONE_ITEMS}
    assert RESPONSES.render_request(Exchange(input=exchange.output, params={"model": "gpt-5-codex"}), {}) == next_body


def test_responses_failed_incomplete_and_error_events() -> None:
    failed = {**RESPONSE_HEAD, "status": "failed", "error": {"code": "server_error", "message": "The model crashed."}}
    stream = feed_all(RESPONSES, [responses_frames()[0], {"type": "response.failed", "response": failed}])
    assert stream.done and stream.error == "server_error: The model crashed." and stream.result() == failed
    exchange = Exchange()
    RESPONSES.parse_response(stream.result(), exchange)
    assert exchange.error == "server_error: The model crashed." and exchange.stop_reason == "failed"

    incomplete = {**COMPLETED, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    stream = feed_all(RESPONSES, [{"type": "response.incomplete", "response": incomplete}])
    RESPONSES.parse_response(stream.result(), exchange)
    assert stream.done and stream.error is None and exchange.stop_reason == "max_output_tokens"

    error = {"type": "error", "code": "rate_limit_exceeded", "message": "Slow down.", "param": None,
             "sequence_number": 3}
    stream = feed_all(RESPONSES, [*responses_frames()[:5], error])
    assert stream.error == "rate_limit_exceeded: Slow down." and not stream.done
    assert stream.result()["error"] == {"code": "rate_limit_exceeded", "message": "Slow down.", "param": None}
    assert feed_all(RESPONSES, [error]).result() == {
        "error": {"code": "rate_limit_exceeded", "message": "Slow down.", "param": None}}


def test_responses_malformed_frames_never_raise() -> None:
    stream = RESPONSES.new_stream()
    for data in ["{", "null", '{"type":"response.output_text.delta","output_index":5,"delta":"x"}',
                 '{"type":"response.output_item.added","output_index":"0","item":[]}',
                 '{"type":"response.content_part.added","output_index":0}', '{"type":"response.future_event"}']:
        stream.feed(SSEEvent(None, data))
    assert stream.error.startswith("malformed SSE frame") and stream.result() == {} and not stream.done


# -- OpenAI Chat Completions ---------------------------------------------------------------

OPENCLAW_BODY: dict[str, Any] = {
    "model": "qwen3-coder",
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.7,
    "max_completion_tokens": 8192,
    "tool_choice": "auto",
    "messages": [
        {"role": "system", "content": "You are a personal assistant running inside OpenClaw."},
        {"role": "developer", "content": [
            {"type": "text", "text": "Prefer tools.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "name": "alice", "content": [
            {"type": "text", "text": "What is in these pictures, and what's the weather?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}", "detail": "high"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}},
        ]},
        {"role": "assistant", "content": None, "reasoning_content": "Two tools, in parallel.", "tool_calls": [
            {"id": "call_0_a1", "type": "function", "function": {"name": "describe_image", "arguments": "{\"n\":1}"}},
            {"id": "call_1_b2", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": "{\"city\":\"Zürich\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_0_a1", "content": "A red square."},
        {"role": "tool", "tool_call_id": "call_1_b2", "content": [{"type": "text", "text": "14 °C, sunny"}]},
        {"role": "assistant", "content": "", "reasoning": "Now answer.", "refusal": None, "tool_calls": []},
        {"role": "assistant", "content": [{"type": "text", "text": "A red square; 14 °C."}],
         "tool_calls": [{"id": "call_2", "type": "custom", "custom": {"name": "notes", "input": "free text"}}]},
        {"role": "user", "content": "Thanks!"},
    ],
    "tools": [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                                          "strict": True}},
        {"type": "function", "function": {"name": "describe_image", "parameters": {"type": "object"}}},
        {"type": "custom", "custom": {"name": "notes", "description": "Free-form notes."}},
    ],
}


def test_chat_round_trip_of_an_openclaw_request() -> None:
    exchange = round_trip(CHAT, OPENCLAW_BODY)
    assert exchange.params == {k: v for k, v in OPENCLAW_BODY.items() if k != "messages"}
    system, developer, user, calls, result1, result2, answer, custom, _thanks = exchange.input
    assert system.extra == {"forge": {"string_content": True}}
    assert developer.parts[0].extra is None
    assert developer.extra == {"forge": {"cache_control": {"0": {"type": "ephemeral"}}}}
    assert user.extra == {"name": "alice"}
    assert [p.type for p in user.parts] == ["text", "image", "image", "other"]
    assert (user.parts[1].blob_hash, user.parts[1].extra) == (sha256_hex(PNG), {"image_url": {"detail": "high"}})
    assert user.parts[2].url == "https://example.com/cat.jpg" and user.parts[2].extra is None
    assert [p.type for p in calls.parts] == ["reasoning", "tool_call", "tool_call"]
    assert calls.parts[0].text == "Two tools, in parallel." and calls.extra == {"content": None}
    assert [(p.tool_name, p.call_id) for p in calls.parts[1:]] == [("describe_image", "call_0_a1"),
                                                                    ("get_weather", "call_1_b2")]
    assert (result1.role, result1.parts[0].call_id, result1.parts[0].text) == ("tool", "call_0_a1", "A red square.")
    assert result2.parts[0].content[0].text == "14 °C, sunny" and result2.parts[0].is_error is None
    assert answer.extra == {"refusal": None, "tool_calls": [], "forge": {"string_content": True,
                                                                         "reasoning_key": "reasoning"}}
    assert (custom.parts[1].tool_name, custom.parts[1].arguments) == ("notes", "free text")
    assert exchange.tools == [
        {"name": "get_weather", "description": "Weather for a city.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True},
        {"name": "describe_image", "parameters": {"type": "object"}},
        {"name": "notes", "description": "Free-form notes.", "type": "custom"},
    ]


def test_chat_round_trip_of_odd_shapes() -> None:
    round_trip(CHAT, {"model": "m", "messages": []})
    round_trip(CHAT, {"model": "m", "messages": [
        {"role": "function", "name": "legacy", "content": "42"},
        {"role": "tool", "tool_call_id": "x", "content": None},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}, "index": 0}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": "https://bare-string.example/x.png"}]},
    ]})


VLLM_PROMPT_IDS = [151644, 872, 198, 3838, 374, 279, 9104, 30, 151645]


def chat_chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """vLLM writes its optional fields as null on every chunk but the one that carries them."""
    return {"id": "chatcmpl-9f3a", "object": "chat.completion.chunk", "created": 1755000000,
            "model": "Qwen/Qwen3-8B", "choices": choices, "usage": None, "prompt_token_ids": None, **extra}


def lp(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def delta(delta: dict[str, Any], token_ids: list[int], logprobs: list[dict[str, Any]] | None = None,
          finish_reason: str | None = None, index: int = 0) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": {"content": logprobs} if logprobs else None,
            "finish_reason": finish_reason, "token_ids": token_ids}


CHAT_FRAMES: list[dict[str, Any] | str] = [
    chat_chunk([delta({"role": "assistant", "content": ""}, [])], prompt_token_ids=VLLM_PROMPT_IDS),
    chat_chunk([delta({"reasoning_content": "Need"}, [23657], [lp("Need", -0.25)])]),
    chat_chunk([delta({"reasoning_content": " weather"}, [9104], [lp(" weather", -0.5)])]),
    chat_chunk([delta({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-a1", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]}, [])]),
    # Some servers repeat the call's keys as nulls on every fragment.
    chat_chunk([delta({"tool_calls": [{"index": 0, "id": None,
                                       "function": {"name": None, "arguments": "{\"city\": "}}]}, [4913, 8926],
                      [lp("{\"", -0.01), lp("city", -0.02)])]),
    chat_chunk([delta({"tool_calls": [{"index": 0, "function": {"arguments": "\"Zürich\"}"}}]}, [57, 324],
                      [lp("\"Z", -0.03), lp("ürich\"}", -0.04)])]),
    chat_chunk([delta({"tool_calls": [{"index": 1, "id": "chatcmpl-tool-b2", "type": "function",
                                       "function": {"name": "get_time", "arguments": "{}"}}]},
                      [16], [lp("{}", -0.05)])]),
    chat_chunk([delta({}, [151645], [lp("<|im_end|>", 0.0)], finish_reason="tool_calls")]),
    chat_chunk([], usage={"prompt_tokens": 312, "total_tokens": 321, "completion_tokens": 9,
                          "prompt_tokens_details": {"cached_tokens": 256}}),
    "[DONE]",
]

CHAT_COMPLETION = {
    "id": "chatcmpl-9f3a", "object": "chat.completion", "created": 1755000000, "model": "Qwen/Qwen3-8B",
    "usage": {"prompt_tokens": 312, "total_tokens": 321, "completion_tokens": 9,
              "prompt_tokens_details": {"cached_tokens": 256}},
    "prompt_token_ids": VLLM_PROMPT_IDS,
    "choices": [{
        "index": 0, "finish_reason": "tool_calls",
        "token_ids": [23657, 9104, 4913, 8926, 57, 324, 16, 151645],
        "logprobs": {"content": [lp("Need", -0.25), lp(" weather", -0.5), lp("{\"", -0.01), lp("city", -0.02),
                                 lp("\"Z", -0.03), lp("ürich\"}", -0.04), lp("{}", -0.05), lp("<|im_end|>", 0.0)]},
        "message": {"role": "assistant", "content": "", "reasoning_content": "Need weather", "tool_calls": [
            {"id": "chatcmpl-tool-a1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}},
            {"id": "chatcmpl-tool-b2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    }],
}


def test_chat_stream_reassembles_under_any_chunking() -> None:
    raw = sse(CHAT_FRAMES, named=False)
    check_every_split(CHAT, raw, CHAT_COMPLETION)
    stream = assemble(CHAT, [raw])
    assert stream.done and stream.error is None and stream.first_token_seen


def test_chat_stream_matches_the_sdk_accumulator() -> None:
    from openai._models import construct_type
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state = ChatCompletionStreamState()
    for frame in CHAT_FRAMES[:-1]:
        state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=copy.deepcopy(frame)))
    theirs = state.current_completion_snapshot.to_dict()
    ours = feed_all(CHAT, CHAT_FRAMES, named=False).result()
    for call in theirs["choices"][0]["message"]["tool_calls"]:
        del call["index"], call["function"]["parsed_arguments"]  # SDK bookkeeping, not in the API's body
    for key in ("id", "model", "created", "usage"):
        assert ours[key] == theirs[key]
    assert ours["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    assert ours["choices"][0]["logprobs"]["content"] == theirs["choices"][0]["logprobs"]["content"]
    for key in ("role", "content", "tool_calls"):
        assert ours["choices"][0]["message"][key] == theirs["choices"][0]["message"][key]


def test_chat_response_parsing_with_vllm_extensions() -> None:
    exchange = Exchange()
    CHAT.parse_response(feed_all(CHAT, CHAT_FRAMES, named=False).result(), exchange)
    assert exchange.usage == Usage(input_tokens=56, output_tokens=9, cache_read_tokens=256)
    assert exchange.stop_reason == "tool_calls" and exchange.model_returned == "Qwen/Qwen3-8B"
    assert exchange.prompt_token_ids == VLLM_PROMPT_IDS
    assert exchange.completion_token_ids == [23657, 9104, 4913, 8926, 57, 324, 16, 151645]
    assert exchange.completion_logprobs == [-0.25, -0.5, -0.01, -0.02, -0.03, -0.04, -0.05, 0.0]
    [message] = exchange.output
    assert [p.type for p in message.parts] == ["reasoning", "text", "tool_call", "tool_call"]
    assert message.parts[2].arguments == "{\"city\": \"Zürich\"}"

    openai_body = {"id": "chatcmpl-B9", "object": "chat.completion", "created": 1, "model": "gpt-4.1-2025-04-14",
                   "choices": [{"index": 1, "message": {"role": "assistant", "content": "second"},
                                "finish_reason": "length", "logprobs": None},
                               {"index": 0, "message": {"role": "assistant", "content": "first", "refusal": None,
                                                        "annotations": []},
                                "finish_reason": "stop", "logprobs": None}],
                   "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                             "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                             "completion_tokens_details": {"reasoning_tokens": 4}}}
    exchange = Exchange()
    CHAT.parse_response(openai_body, exchange)
    assert [m.text() for m in exchange.output] == ["first", "second"]
    assert exchange.stop_reason == "stop" and exchange.completion_logprobs is None
    assert exchange.usage == Usage(input_tokens=19, output_tokens=10, cache_read_tokens=0, reasoning_tokens=4)


def test_chat_stream_with_two_choices_and_no_indexes_on_tool_calls() -> None:
    frames = [
        chat_chunk([{"index": 0, "delta": {"role": "assistant", "content": "Hel"}},
                    {"index": 1, "delta": {"role": "assistant", "content": "Bon"}}]),
        chat_chunk([{"index": 1, "delta": {"content": "jour"}, "finish_reason": "stop"}]),
        chat_chunk([{"index": 0, "delta": {"tool_calls": [
            {"id": "call_g1", "type": "function", "function": {"name": "greet", "arguments": "{\"a\""}}]}}]),
        chat_chunk([{"index": 0, "delta": {"tool_calls": [
            {"id": "call_g1", "type": "function", "function": {"name": "greet", "arguments": ":1}"}}]}}]),
        chat_chunk([{"index": 0, "delta": {"tool_calls": [
            {"id": "call_w2", "type": "function", "function": {"name": "wave", "arguments": "{\"b\""}}]}}]),
        chat_chunk([{"index": 0, "delta": {"tool_calls": [{"function": {"arguments": ":2}"}}]}}]),
        chat_chunk([{"index": 0, "delta": {"content": "lo"}, "finish_reason": "tool_calls"}]),
        "[DONE]",
    ]
    exchange = Exchange()
    CHAT.parse_response(feed_all(CHAT, frames, named=False).result(), exchange)
    first, second = exchange.output
    assert first.text() == "Hello" and second.text() == "Bonjour"
    assert [(p.tool_name, p.call_id, p.arguments) for p in first.parts if p.type == "tool_call"] == [
        ("greet", "call_g1", "{\"a\":1}"), ("wave", "call_w2", "{\"b\":2}")]


def test_chat_error_chunk_and_malformed_frames() -> None:
    frames = [CHAT_FRAMES[0], CHAT_FRAMES[1], "{not json", {"error": {"message": "CUDA out of memory",
                                                                      "type": "InternalServerError", "code": 500}}]
    stream = feed_all(CHAT, frames, named=False)
    assert stream.error == "malformed SSE frame #3: not a JSON object" and not stream.done
    assert stream.result()["choices"][0]["message"]["reasoning_content"] == "Need"

    stream = feed_all(CHAT, frames[3:], named=False)
    assert stream.error == "InternalServerError: CUDA out of memory"
    exchange = Exchange()
    CHAT.parse_response(stream.result(), exchange)
    assert exchange.error == "InternalServerError: CUDA out of memory" and exchange.output == []

    stream = CHAT.new_stream()
    for data in ["[1]", '{"choices": "x"}', '{"choices": [{"index": 0, "delta": "str", "token_ids": 5}]}',
                 '{"choices": [{"delta": {"tool_calls": [1, {"function": "f"}]}, "logprobs": [1]}]}']:
        stream.feed(SSEEvent(None, data))
    assert stream.result()["choices"][0]["message"]["role"] == "assistant"


# -- OpenAI legacy Completions -------------------------------------------------------------

@pytest.mark.parametrize("prompt", [
    "The capital of France is",
    ["Once upon a time", "In a galaxy far away"],
    VLLM_PROMPT_IDS,
    [VLLM_PROMPT_IDS, [1, 2, 3]],
    "",
    [],
    None,
])
def test_completions_round_trip(prompt: Any) -> None:
    body = {"model": "Qwen/Qwen3-8B", "prompt": prompt, "max_tokens": 64, "temperature": 1.0, "logprobs": 1,
            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}
    exchange = round_trip(COMPLETIONS, body)
    assert exchange.prompt_token_ids == (VLLM_PROMPT_IDS if prompt is VLLM_PROMPT_IDS else None)
    if prompt is VLLM_PROMPT_IDS:
        assert exchange.input[0].parts == (Part("other", extra={"token_ids": VLLM_PROMPT_IDS}),)


def completion_chunk(choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "cmpl-7c", "object": "text_completion", "created": 1755000001, "model": "Qwen/Qwen3-8B",
            "choices": [choice] if choice else [], "usage": None, **extra}


def text_choice(text: str, ids: list[int], logprob: float, offset: int, **extra: Any) -> dict[str, Any]:
    return {"index": 0, "text": text, "token_ids": ids, "finish_reason": None, "stop_reason": None,
            "logprobs": {"text_offset": [offset], "token_logprobs": [logprob], "tokens": [text],
                         "top_logprobs": [{text: logprob}]}, **extra}


COMPLETION_FRAMES: list[dict[str, Any] | str] = [
    completion_chunk(text_choice(" Paris", [12095], -0.1, 0, prompt_token_ids=VLLM_PROMPT_IDS)),
    completion_chunk(text_choice(".", [13], -0.2, 6)),
    completion_chunk({**text_choice(" It", [1084], -1.5, 7), "finish_reason": "length"}),
    completion_chunk({}, usage={"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3}),
    "[DONE]",
]

COMPLETION = {
    "id": "cmpl-7c", "object": "text_completion", "created": 1755000001, "model": "Qwen/Qwen3-8B",
    "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3},
    "choices": [{"index": 0, "text": " Paris. It", "token_ids": [12095, 13, 1084], "finish_reason": "length",
                 "stop_reason": None, "prompt_token_ids": VLLM_PROMPT_IDS,
                 "logprobs": {"text_offset": [0, 6, 7], "token_logprobs": [-0.1, -0.2, -1.5],
                              "tokens": [" Paris", ".", " It"],
                              "top_logprobs": [{" Paris": -0.1}, {".": -0.2}, {" It": -1.5}]}}],
}


def test_completions_stream_and_response() -> None:
    raw = sse(COMPLETION_FRAMES, named=False)
    check_every_split(COMPLETIONS, raw, COMPLETION)
    exchange = COMPLETIONS.parse_request({"model": "Qwen/Qwen3-8B", "prompt": "The capital of France is"})
    COMPLETIONS.parse_response(assemble(COMPLETIONS, [raw]).result(), exchange)
    assert exchange.output == [Message("assistant", (Part("text", text=" Paris. It"),))]
    assert exchange.prompt_token_ids == VLLM_PROMPT_IDS
    assert exchange.completion_token_ids == [12095, 13, 1084]
    assert exchange.completion_logprobs == [-0.1, -0.2, -1.5]
    assert exchange.stop_reason == "length" and exchange.usage == Usage(input_tokens=9, output_tokens=3)


def test_results_are_snapshots_that_later_frames_do_not_change() -> None:
    for codec, frames, named in ((CHAT, CHAT_FRAMES, False), (COMPLETIONS, COMPLETION_FRAMES, False),
                                 (ANTHROPIC, ANTHROPIC_FRAMES, True), (RESPONSES, responses_frames(), True)):
        decoder, stream = SSEDecoder(), codec.new_stream()
        events = decoder.feed(sse(frames, named))
        for event in events[:len(events) // 2]:
            stream.feed(event)
        early = stream.result()
        frozen = copy.deepcopy(early)
        for event in events[len(events) // 2:]:
            stream.feed(event)
        assert early == frozen, codec.name
