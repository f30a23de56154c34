"""The official SDKs through `forge-record serve`: the dataset reproduces every exchange.

For each call we compare with what the scripted upstream logged: the raw
request and response bytes are identical, the request re-rendered from the
stored parts equals the body the SDK sent, and the reassembled output holds
the same text and tool calls the client parsed.
"""

from __future__ import annotations

import base64
import json

import anthropic
import openai
import pyarrow.compute as pc

from forgerl.recorder.apis import codec_for
from forgerl.recorder.images import restore_request
from forgerl.schema import store
from forgerl.schema.messages import Exchange
from forgerl.schema.records import call_messages, decompress

from conftest import session_calls, session_parts
from scripted_upstream import ToolCall, Turn, sequence

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def turns():
    """A fresh script per test: `sequence` keeps its position per session."""
    return sequence(Turn(text="Checking both.", thinking="The user wants two cities.",
                         tool_calls=[ToolCall("get_weather", {"city": "Paris"}),
                                     ToolCall("get_weather", {"city": "Oslo"})]),
                    Turn(text="Paris is sunny, Oslo is cold."))


def blobs_of(root, session):
    blobs = store.read_table(root, "blobs")
    blobs = blobs.filter(pc.equal(blobs.column("session_id"), session))
    return dict(zip(blobs.column("blob_hash").to_pylist(), blobs.column("data").to_pylist()))


def assert_reproduces(root, session, upstream, n):
    """Every recorded call matches the upstream's log byte for byte, and re-renders its request."""
    calls = session_calls(root, session, n)
    logged = upstream.log[-n:]
    assert len(calls) == n
    parts = session_parts(root, session)
    blobs = blobs_of(root, session)
    for call, sent in zip(calls, logged):
        assert call["complete"] and call["error"] is None, call["error"]
        assert restore_request(decompress(call["request_raw"]), blobs.get) == sent.body  # images by reference
        assert decompress(call["response_raw"]) == sent.response_body
        assert call["path"] == sent.path
        codec = codec_for(call["path"])
        messages = call_messages(call, parts)
        exchange = Exchange(input=messages, params=json.loads(call["request_params"]))
        assert codec.render_request(exchange, blobs) == json.loads(sent.body)
        assert call["t_start"] <= call["t_first_byte"] <= call["t_end"]
    return calls


def output_tool_calls(root, session, call):
    parts = session_parts(root, session)
    out = call_messages(call, parts, "output")
    return [(p.tool_name, json.loads(p.arguments)) for m in out for p in m.parts if p.type == "tool_call"]


def test_anthropic_sdk_streaming_and_not(scripted, recorder):
    up = scripted(turns())
    rec = recorder(up.url)
    client = anthropic.Anthropic(base_url=rec.base("anth"), api_key="sk-ant-api03-secretsecretsecret")
    tool = {"name": "get_weather", "description": "weather", "input_schema": WEATHER}
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Weather in Paris and Oslo? Here is a map."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(PNG).decode()}}]}]
    with client.messages.stream(model="claude-test", max_tokens=100, tools=[tool], messages=messages,
                                system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        first = stream.get_final_message()
    uses = [b for b in first.content if b.type == "tool_use"]
    assert [u.input["city"] for u in uses] == ["Paris", "Oslo"]
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"},
                     {"type": "tool_result", "tool_use_id": uses[1].id,
                      "content": [{"type": "text", "text": "station offline"}], "is_error": True}]}]
    second = client.messages.create(model="claude-test", max_tokens=100, tools=[tool], messages=messages)
    assert second.content[0].text == "Paris is sunny, Oslo is cold."
    calls = assert_reproduces(rec.out, "anth", up, 2)
    assert calls[0]["streamed"] and not calls[1]["streamed"]
    assert calls[0]["api"] == "anthropic" and calls[0]["stop_reason"] == "tool_use"
    assert output_tool_calls(rec.out, "anth", calls[0]) == [("get_weather", {"city": "Paris"}),
                                                           ("get_weather", {"city": "Oslo"})]
    assert calls[1]["output_tokens"] == second.usage.output_tokens
    # The image is stored once, by hash, and the thinking signature survived intact.
    assert list(blobs_of(rec.out, "anth").values()) == [PNG]
    parts = [json.loads(p) for p in session_parts(rec.out, "anth").values()]
    thinking = [p for p in parts if p["type"] == "reasoning"]
    assert thinking and thinking[0]["signature"] == first.content[0].signature
    errors = [p for p in parts if p["type"] == "tool_result" and p.get("is_error")]
    assert len(errors) == 1


def test_openai_chat_streaming_and_not(scripted, recorder):
    up = scripted(turns())
    rec = recorder(up.url)
    client = openai.OpenAI(base_url=rec.base("chat") + "/v1", api_key="sk-proj-secretsecretsecretsecret")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Oslo?"},
                                             {"type": "image_url", "image_url": {"url": data_url}}]}]
    stream = client.chat.completions.create(model="gpt-test", messages=messages, tools=tools, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    fragments = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert {f.index for f in fragments} == {0, 1}
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
                  for i, city in enumerate(["Paris", "Oslo"])]
    messages += [{"role": "assistant", "content": "Checking both.", "tool_calls": tool_calls},
                 {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
                 {"role": "tool", "tool_call_id": "call_1", "content": "cold"}]
    reply = client.chat.completions.create(model="gpt-test", messages=messages, tools=tools,
                                           extra_body={"return_token_ids": True}, logprobs=True)
    assert reply.choices[0].message.content == "Paris is sunny, Oslo is cold."
    calls = assert_reproduces(rec.out, "chat", up, 2)
    assert calls[0]["api"] == "chat" and calls[0]["streamed"]
    assert output_tool_calls(rec.out, "chat", calls[0]) == [("get_weather", {"city": "Paris"}),
                                                           ("get_weather", {"city": "Oslo"})]
    assert calls[0]["input_tokens"] is not None
    body = reply.model_dump()
    assert calls[1]["prompt_token_ids"] == body["prompt_token_ids"]
    assert calls[1]["completion_token_ids"] == body["choices"][0]["token_ids"]
    logprobs = [c["logprob"] for c in body["choices"][0]["logprobs"]["content"]]
    assert calls[1]["completion_logprobs"] == [float(__import__("numpy").float32(x)) for x in logprobs]


def test_openai_responses_streaming_and_not(scripted, recorder):
    up = scripted(turns())
    rec = recorder(up.url)
    client = openai.OpenAI(base_url=rec.base("resp") + "/v1", api_key="sk-proj-secretsecretsecretsecret")
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}]
    items: list = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    with client.responses.stream(model="gpt-test", input=items, tools=tools, instructions="be brief") as s:
        first = s.get_final_response()
    calls_made = [o for o in first.output if o.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls_made] == ["Paris", "Oslo"]
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls_made]
    second = client.responses.create(model="gpt-test", input=items, tools=tools, instructions="be brief")
    assert second.output_text == "Paris is sunny, Oslo is cold."
    calls = assert_reproduces(rec.out, "resp", up, 2)
    assert calls[0]["api"] == "responses" and calls[0]["streamed"]
    assert output_tool_calls(rec.out, "resp", calls[0]) == [("get_weather", {"city": "Paris"}),
                                                           ("get_weather", {"city": "Oslo"})]
    reasoning = [json.loads(p) for p in session_parts(rec.out, "resp").values()]
    assert any(p["type"] == "reasoning" and p.get("signature") for p in reasoning)
