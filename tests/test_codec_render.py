"""Each codec writes an answer that its own reader reads back unchanged: body and stream, every API.

`read_answer` is the reader's side in the answer's terms (what `parse_response`
filled, plus the body's id and timestamp); the property is
`read_answer(render(answer)) == answer` for every answer the API can say.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from forgerl.recorder.apis import ANTHROPIC, CHAT, COMPLETIONS, GEMINI, RESPONSES
from forgerl.recorder.apis.answer import Answer, Frame, chunks
from forgerl.recorder.sse import SSEDecoder
from forgerl.schema.messages import Exchange, Usage
from forgerl.schema.toolcalls import ParsedTurn, ToolCall

PREFIX = {"anthropic": "msg_", "responses": "resp_", "chat": "chatcmpl-", "completions": "cmpl-", "gemini": ""}
# The wire's stop reason for (finish, has tool calls), as each API says it.
STOPS = {"anthropic": {("stop", False): "end_turn", ("stop", True): "tool_use", ("length", False): "max_tokens"},
         "responses": {("stop", False): "completed", ("stop", True): "completed", ("length", False): "max_output_tokens"},
         "chat": {("stop", False): "stop", ("stop", True): "tool_calls", ("length", False): "length"},
         "completions": {("stop", False): "stop", ("length", False): "length"},
         "gemini": {("stop", False): "STOP", ("stop", True): "STOP", ("length", False): "MAX_TOKENS"}}
CALLS = (ToolCall("get_weather", {"city": "Paris", "unit": "°C"}), ToolCall("Bash", {"command": "ls -la", "n": [1, 2]}))
TOKENS = dict(prompt_token_ids=[5, 6, 7], completion_token_ids=[11, 12, 13, 2], completion_logprobs=[-0.5, 0.0, -1.25, -0.01])
REQUEST = {"stream_options": {"include_usage": True}, "tools": [{"type": "function", "name": "get_weather"}],
           "instructions": "be brief", "temperature": 0.2}


def answer(api: str, reasoning: str | None = "Two cities,\ntwo calls.", text: str = "Checking both — now.",
           calls: tuple[ToolCall, ...] = CALLS, finish: str = "stop", tokens: bool = True) -> Answer:
    """The fullest answer `api` can say with these parts."""
    openai = api != "anthropic"
    usage = Usage(input_tokens=100, output_tokens=42, cache_read_tokens=1000,
                  cache_write_tokens=None if openai else 50, reasoning_tokens=7 if openai else None)
    if api == "completions":
        reasoning, calls = None, ()
    return Answer(id="0123abcd", model="m-1", turn=ParsedTurn(reasoning, text, calls),
                  call_ids=tuple(f"call_{i}" for i in range(len(calls))), usage=usage, finish=finish,
                  created=0 if api in ("anthropic", "gemini") else 1_700_000_000,
                  signature="c2lnbmF0dXJl" if reasoning is not None and api in ("anthropic", "responses", "gemini")
                  else None,
                  **(TOKENS if tokens else {}))


def read_answer(codec, body: dict) -> Answer:
    """The answer in a body, as the codec's reader sees it."""
    exchange = Exchange()
    codec.parse_response(body, exchange)
    assert exchange.error is None
    parts = [part for message in exchange.output for part in message.parts]
    assert {message.role for message in exchange.output} <= {"assistant"}
    assert {part.type for part in parts} <= {"reasoning", "text", "tool_call"}
    reasoning = [part for part in parts if part.type == "reasoning"]
    calls = [part for part in parts if part.type == "tool_call"]
    assert len(reasoning) <= 1
    turn = ParsedTurn(reasoning[0].text if reasoning else None, "".join(p.text for p in parts if p.type == "text"),
                      tuple(ToolCall(c.tool_name, json.loads(c.arguments)) for c in calls))
    finish = next(f for (f, has_calls), wire in STOPS[codec.name].items()
                  if wire == exchange.stop_reason and has_calls == bool(calls))
    return Answer(id=body.get("id", body.get("responseId")).removeprefix(PREFIX[codec.name]),
                  model=exchange.model_returned, turn=turn,
                  call_ids=tuple(c.call_id for c in calls), usage=exchange.usage, finish=finish,
                  created=body.get("created", body.get("created_at", 0)),
                  signature=reasoning[0].signature if reasoning else None,
                  prompt_token_ids=exchange.prompt_token_ids, completion_token_ids=exchange.completion_token_ids,
                  completion_logprobs=exchange.completion_logprobs)


def reassembled(codec, frames: list[Frame]) -> dict:
    """The frames sent as SSE bytes, split again, fed to the codec's stream assembler."""
    decoder = SSEDecoder()
    raw = b"".join(frame.sse() for frame in frames)
    events = decoder.feed(raw[:len(raw) // 3]) + decoder.feed(raw[len(raw) // 3:]) + decoder.close()
    assert len(events) == len(frames)
    stream = codec.new_stream()
    for event in events:
        stream.feed(event)
    assert stream.done and stream.error is None
    assert stream.first_token_seen == any(frame.delta for frame in frames)
    return stream.result()


def one_char(text: str) -> list[str]:
    return list(text)


VARIANTS = {
    "full": {},
    "cut at the limit": dict(calls=(), finish="length"),
    "tool calls only": dict(reasoning=None, text=""),
    "empty reasoning": dict(reasoning="", calls=CALLS[:1]),
    "text only, no token ids": dict(reasoning=None, calls=(), tokens=False),
    "nothing said": dict(reasoning=None, text="", calls=(), tokens=False),
}
CODECS = [ANTHROPIC, RESPONSES, CHAT, COMPLETIONS, GEMINI]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("codec", CODECS, ids=lambda codec: codec.name)
def test_body_reads_back_as_the_answer(codec, variant):
    said = answer(codec.name, **VARIANTS[variant])
    body = json.loads(json.dumps(codec.render_response(said, REQUEST)))
    assert read_answer(codec, body) == said


@pytest.mark.parametrize("pieces", [chunks, one_char], ids=["chunks", "one char"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("codec", CODECS, ids=lambda codec: codec.name)
def test_stream_reads_back_as_the_answer(codec, variant, pieces):
    said = answer(codec.name, **VARIANTS[variant])
    frames = list(codec.render_stream(said, REQUEST, pieces))
    assert read_answer(codec, reassembled(codec, frames)) == said


def test_answers_outside_an_api_do_not_read_back():
    """The property is not vacuous: what an API cannot say is lost, and the reader shows it."""
    said = answer("chat")
    assert read_answer(CHAT, CHAT.render_response(replace(said, signature="sig"), {})) == said
    assert read_answer(COMPLETIONS, COMPLETIONS.render_response(said, {})).turn == ParsedTurn(None, said.turn.text, ())
    cached = replace(said, usage=replace(said.usage, cache_write_tokens=50))
    assert read_answer(CHAT, CHAT.render_response(cached, {})).usage.input_tokens == 150  # counted as input


def test_anthropic_stream_has_the_documented_shape():
    frames = list(ANTHROPIC.render_stream(answer("anthropic"), {}))
    names = [frame.event for frame in frames]
    assert names[:3] == ["message_start", "content_block_start", "ping"] and names.count("ping") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(frame.event == frame.data["type"] for frame in frames)
    start = frames[0].data["message"]
    assert start["usage"]["output_tokens"] == 1 and start["content"] == [] and "forge" not in start
    final = frames[-2].data
    assert final["usage"] == {"input_tokens": 100, "cache_creation_input_tokens": 50, "cache_read_input_tokens": 1000,
                              "output_tokens": 42}  # cumulative
    assert final["delta"]["forge"]["completion_token_ids"] == TOKENS["completion_token_ids"]
    partials = [f.data["delta"]["partial_json"] for f in frames if f.data.get("delta", {}).get("type") == "input_json_delta"]
    assert partials[0] == "" and json.loads("".join(partials[:len(partials) // 2])) == CALLS[0].arguments
    empty = [frame.event for frame in ANTHROPIC.render_stream(answer("anthropic", None, "", ()), {})]
    assert empty == ["message_start", "ping", "message_delta", "message_stop"]


def test_responses_stream_numbers_events_and_ends_with_the_body():
    said = answer("responses")
    frames = list(RESPONSES.render_stream(said, REQUEST))
    assert all(frame.event == frame.data["type"] for frame in frames)
    assert [frame.data["sequence_number"] for frame in frames] == list(range(len(frames)))
    assert frames[0].data["response"]["status"] == "in_progress" and frames[0].data["response"]["usage"] is None
    assert frames[-1].event == "response.completed"
    assert frames[-1].data["response"] == RESPONSES.render_response(said, REQUEST)
    assert frames[-1].data["response"]["instructions"] == "be brief" and frames[-1].data["response"]["temperature"] == 0.2
    done = list(RESPONSES.render_stream(answer("responses", calls=(), finish="length"), {}))
    assert done[-1].event == "response.incomplete"
    nothing = [frame.event for frame in RESPONSES.render_stream(answer("responses", None, "", (), tokens=False), {})]
    assert nothing == ["response.created", "response.in_progress", "response.completed"]


@pytest.mark.parametrize("codec", [CHAT, COMPLETIONS], ids=lambda codec: codec.name)
def test_choice_streams_end_with_usage_when_asked_then_done(codec):
    said = answer(codec.name)
    frames = list(codec.render_stream(said, REQUEST))
    assert frames[-1] == Frame(None, "[DONE]") and frames[-1].sse() == b"data: [DONE]\n\n"
    assert frames[-2].data["choices"] == [] and frames[-2].data["usage"]["total_tokens"] == 1142
    assert all(frame.event is None for frame in frames)
    unasked = list(codec.render_stream(said, {}))
    assert "usage" not in unasked[-2].data and unasked[-2].data["choices"][0]["finish_reason"]
    ids = [frame.data["choices"][0].get("token_ids") for frame in unasked[:-1]]
    assert ids[-1] == TOKENS["completion_token_ids"] and not any(ids[:-1])


def test_chat_tool_calls_stream_as_openai_sends_them():
    frames = list(CHAT.render_stream(answer("chat"), {}, one_char))
    fragments = [call for frame in frames[:-1] for call in frame.data["choices"][0]["delta"].get("tool_calls", [])]
    heads = [f for f in fragments if "id" in f]
    assert [(f["index"], f["function"]) for f in heads] == [(0, {"name": "get_weather", "arguments": ""}),
                                                            (1, {"name": "Bash", "arguments": ""})]
    assert all(set(f["function"]) == {"arguments"} for f in fragments if "id" not in f)
    assert frames[0].data["prompt_token_ids"] == TOKENS["prompt_token_ids"]
    assert not any("prompt_token_ids" in frame.data for frame in frames[1:-1])


def test_logprobs_need_the_token_ids():
    with pytest.raises(ValueError):
        replace(answer("chat"), completion_token_ids=None)
    with pytest.raises(ValueError):
        replace(answer("chat"), call_ids=("only one",))


def test_gemini_stream_has_the_documented_shape():
    """Data-only frames, each with the model version and response id; text in pieces, each call whole;
    only the last says the finish reason and usage (thoughts counted apart) and carries the extension."""
    said = answer("gemini")
    frames = list(GEMINI.render_stream(said, {}, one_char))
    assert all(frame.event is None and frame.data["responseId"] == "0123abcd" for frame in frames)
    parts = [part for frame in frames for part in frame.data["candidates"][0]["content"]["parts"]]
    assert [part["functionCall"]["name"] for part in parts if "functionCall" in part] == ["get_weather", "Bash"]
    assert [part.get("thoughtSignature") for part in parts if part.get("thought")][-1] == "c2lnbmF0dXJl"
    assert sum("thoughtSignature" in part for part in parts) == 1
    assert [("finishReason" in f.data["candidates"][0], "usageMetadata" in f.data) for f in frames[:-1]] == \
        [(False, False)] * (len(frames) - 1)
    last = frames[-1].data
    assert last["candidates"][0]["finishReason"] == "STOP" and last["forge"]["completion_token_ids"] == TOKENS[
        "completion_token_ids"]
    assert last["usageMetadata"] == {"promptTokenCount": 1100, "candidatesTokenCount": 35, "totalTokenCount": 1142,
                                     "cachedContentTokenCount": 1000, "thoughtsTokenCount": 7}
