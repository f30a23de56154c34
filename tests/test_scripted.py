"""The scripted upstream answers like the real model APIs: the official SDKs parse it, faults look real."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
import time

import aiohttp
import anthropic
import httpx
import openai
import pytest

from forgerl.schema.messages import Usage

from conftest import REPO
from scripted_upstream import ScriptedUpstream, ToolCall, Turn, echo, sequence, token_ids

PNG = base64.b64encode(base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")).decode()
TOOLS = Turn(text="Checking both.", thinking="Two cities, two calls.",
             tool_calls=[ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Oslo"})])
ONE_TOOL = Turn(tool_calls=[ToolCall("Bash", {"command": "ls -la"}, id="toolu_fixed")])
MESSAGES = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def scripted():
    """Factory for started upstreams, stopped after the test (self-contained: no conftest needed)."""
    started: list[ScriptedUpstream] = []

    def make(script=None, **kwargs) -> ScriptedUpstream:
        started.append(ScriptedUpstream(script, **kwargs).start())
        return started[-1]

    yield make
    for up in started:
        up.stop()


def sse(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE frame."""
    frames = []
    for frame in raw.decode().split("\n\n"):
        if frame:
            fields = dict(line.split(": ", 1) for line in frame.split("\n"))
            frames.append((fields.get("event"), fields["data"]))
    return frames


def stream_bytes(url: str, body: dict, **headers: str) -> bytes:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return b"".join(r.iter_raw())


# --- each API through its official SDK --------------------------------------------------------


def test_anthropic_sdk(scripted):
    up = scripted(sequence(Turn(text="hello there"), TOOLS, ONE_TOOL))
    client = anthropic.Anthropic(base_url=up.url, api_key="k", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look at this"}, image]}]
    plain = client.beta.messages.create(model="claude", max_tokens=10, messages=msgs)  # ?beta=true
    assert up.log[-1].path == "/v1/messages?beta=true"
    assert plain.content[0].text == "hello there" and plain.stop_reason == "end_turn"
    assert plain.usage.input_tokens == 3 and plain.usage.output_tokens == 2

    with client.messages.stream(model="claude", max_tokens=10, messages=msgs) as stream:
        final = stream.get_final_message()
    thinking, text, *uses = final.content
    assert thinking.type == "thinking" and thinking.thinking == TOOLS.thinking and base64.b64decode(thinking.signature)
    assert text.text == "Checking both." and final.stop_reason == "tool_use"
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert uses[0].id != uses[1].id
    events = [e for e, _ in sse(up.log[-1].response_body)]
    assert events[:3] == ["message_start", "content_block_start", "ping"]  # as Anthropic documents its streams
    assert events[-2:] == ["message_delta", "message_stop"]
    partials = [json.loads(d)["delta"]["partial_json"] for _, d in sse(up.log[-1].response_body)
                if '"input_json_delta"' in d]
    assert len(partials) >= 6 and "".join(partials) == '{"city": "Paris"}{"city": "Oslo"}'
    assert {"signature_delta", "thinking_delta", "text_delta"} <= {
        json.loads(d)["delta"]["type"] for e, d in sse(up.log[-1].response_body) if e == "content_block_delta"}

    tool = client.messages.create(model="claude", max_tokens=10, messages=msgs)
    assert [b.type for b in tool.content] == ["tool_use"] and tool.content[0].id == "toolu_fixed"
    assert client.messages.count_tokens(model="claude", messages=msgs).input_tokens == 3
    assert client.models.list().data[0].id == "scripted"


def test_responses_sdk(scripted):
    up = scripted(sequence(Turn(text="plain answer"), TOOLS))
    client = openai.OpenAI(base_url=up.url + "/v1", api_key="k", max_retries=0)
    content = [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]
    plain = client.responses.create(model="gpt", input=[{"role": "user", "content": content}])
    assert plain.output_text == "plain answer" and plain.status == "completed" and plain.usage.total_tokens == 3

    with client.responses.stream(model="gpt", input="go") as stream:
        final = stream.get_final_response()
    reasoning, message, *calls = final.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == TOOLS.thinking and reasoning.encrypted_content
    assert message.content[0].text == "Checking both."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                  ("get_weather", {"city": "Oslo"})]
    frames = sse(up.log[-1].response_body)
    assert all(e == json.loads(d)["type"] for e, d in frames)
    assert [json.loads(d)["sequence_number"] for _, d in frames] == list(range(len(frames)))
    names = [e for e, _ in frames]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert {"response.output_item.added", "response.output_text.delta", "response.function_call_arguments.delta",
            "response.output_item.done"} <= set(names)


def test_chat_sdk(scripted):
    up = scripted(sequence(Turn(text="hi back", thinking="hmm"), TOOLS, TOOLS))
    client = openai.OpenAI(base_url=up.url + "/openai/v1", api_key="k", max_retries=0)  # a prefix, matched on suffix
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    plain = client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, image]}])
    assert plain.choices[0].message.content == "hi back" and plain.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.reasoning_content == "hmm" and plain.usage.prompt_tokens == 3

    tools = client.chat.completions.create(model="m", messages=CHAT["messages"])
    assert tools.choices[0].finish_reason == "tool_calls"
    assert [c.function.arguments for c in tools.choices[0].message.tool_calls] == ['{"city": "Paris"}', '{"city": "Oslo"}']

    with client.chat.completions.stream(model="m", messages=CHAT["messages"],
                                        stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking both." and message.reasoning_content == TOOLS.thinking
    assert [json.loads(c.function.arguments) for c in message.tool_calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert len({c.id for c in message.tool_calls}) == 2
    chunks = [json.loads(d) for _, d in sse(up.log[-1].response_body)[:-1]]
    assert sse(up.log[-1].response_body)[-1] == (None, "[DONE]")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    fragments = [tc for c in chunks[:-1] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    firsts = [f for f in fragments if "id" in f]
    assert [f["index"] for f in firsts] == [0, 1] and all(f["function"]["name"] == "get_weather" for f in firsts)
    assert all("name" not in f["function"] for f in fragments if "id" not in f)

    completion = client.completions.create(model="m", prompt="say something")
    assert completion.choices[0].text == "Checking both."
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="x", stream=True))
    assert streamed == "Checking both."
    assert client.models.list().data[0].id == "scripted"


# --- vLLM extensions ----------------------------------------------------------------------------


def test_vllm_token_ids_and_logprobs(scripted):
    up = scripted(sequence(Turn(text="one two  three\nfour")))
    client = openai.OpenAI(base_url=up.url + "/v1", api_key="k", max_retries=0)
    extra = {"return_token_ids": True}
    whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count to four"}],
                                           logprobs=True, extra_body=extra)
    body = whole.model_dump()
    assert body["prompt_token_ids"] == token_ids("count to four") and len(body["prompt_token_ids"]) == 3
    assert body["choices"][0]["token_ids"] == token_ids("one two  three\nfour")
    logprobs = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in logprobs] == [f"token_id:{i}" for i in token_ids("one two  three\nfour")]
    assert all(e["logprob"] <= 0 for e in logprobs) and len({e["logprob"] for e in logprobs}) > 1

    chunks = [c.model_dump() for c in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count to four"}], stream=True, logprobs=True, extra_body=extra)]
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert sum((c["choices"][0].get("token_ids") or [] for c in chunks), []) == body["choices"][0]["token_ids"]
    assert [e["token"] for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]] \
        == [e["token"] for e in logprobs]

    tokens_in = client.completions.create(model="m", prompt=[5, 6, 7], logprobs=1, extra_body=extra).model_dump()
    assert tokens_in["choices"][0]["prompt_token_ids"] == [5, 6, 7]  # on the choice, as vLLM puts them
    assert tokens_in["choices"][0]["token_ids"] == token_ids("one two three four")
    assert len(tokens_in["choices"][0]["logprobs"]["token_logprobs"]) == 4


# --- scripting, sessions, pacing, logging --------------------------------------------------------


def test_sequence_is_per_session_and_echo_is_default(scripted):
    up = scripted(sequence(Turn(text="first"), Turn(text="second")))

    def say(prefix: str = "", **headers: str) -> str:
        r = httpx.post(up.url + prefix + "/v1/chat/completions", json=CHAT, headers=headers)
        return r.json()["choices"][0]["message"]["content"]

    assert [say("/s/a"), say("/s/b"), say("/s/a"), say("/s/a")] == ["first", "first", "second", "second"]
    assert [say(**{"X-Forge-Session": "c"}), say(**{"X-Forge-Session": "c"}), say()] == ["first", "second", "first"]
    assert up.log[0].path == "/s/a/v1/chat/completions"
    echo_up = scripted()
    r = httpx.post(echo_up.url + "/v1/messages", json={**MESSAGES, "messages": [
        {"role": "user", "content": "old"}, {"role": "assistant", "content": "x"},
        {"role": "user", "content": [{"type": "text", "text": "latest"}]}]})
    assert r.json()["content"][0]["text"] == "echo: latest"
    r = httpx.post(echo_up.url + "/v1/responses", json={"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "via responses"}]}]})
    assert r.json()["output"][0]["content"][0]["text"] == "echo: via responses"
    assert scripted(echo()).script is not None


def test_log_holds_exact_bytes(scripted):
    up = scripted(sequence(TOOLS))
    for path, body in (("/v1/messages", MESSAGES), ("/v1/responses", {"model": "m", "input": "hi"}),
                       ("/v1/chat/completions", CHAT)):
        raw = stream_bytes(up.url + path + "?x=1", {**body, "stream": True})
        entry = up.log[-1]
        assert entry.response_body == raw and entry.status == 200 and entry.method == "POST"
        assert entry.path == path + "?x=1" and json.loads(entry.body)["stream"] is True
        whole = httpx.post(up.url + path, json=body, headers={"X-Custom": "yes"})
        assert up.log[-1].response_body == whole.content and up.log[-1].headers["x-custom"] == "yes"


def test_chunks_and_delay(scripted):
    up = scripted(sequence(Turn(text="a b c d e f g h i j k l")), chunks=4, chunk_delay=0.05)
    t0 = time.perf_counter()
    raw = stream_bytes(up.url + "/v1/messages", {**MESSAGES, "stream": True})
    assert time.perf_counter() - t0 >= 0.15
    texts = [json.loads(d)["delta"]["text"] for e, d in sse(raw) if '"text_delta"' in d]
    assert texts == ["a b c", " d e f", " g h i", " j k l"]
    short = scripted(sequence(Turn(text="hi")), chunks=2)
    raw = stream_bytes(short.url + "/v1/chat/completions", {**CHAT, "stream": True})
    assert [json.loads(d)["choices"][0]["delta"].get("content") for _, d in sse(raw)[1:3]] == ["h", "i"]


# --- websocket ---------------------------------------------------------------------------------


def test_responses_websocket(scripted):
    from websockets.sync.client import connect
    up = scripted(sequence(ONE_TOOL, Turn(text="done"), Turn(text="third")))
    received: list[dict] = []
    with connect(up.url.replace("http://", "ws://") + "/s/ws/v1/responses") as ws:
        for text in ("first", "second"):
            ws.send(json.dumps({"type": "response.create", "model": "gpt", "input": text, "stream": True}))
            while True:
                received.append(json.loads(ws.recv(timeout=5)))
                if received[-1]["type"] == "response.completed":
                    break
    completed = [e["response"] for e in received if e["type"] == "response.completed"]
    assert completed[0]["output"][0]["name"] == "Bash" and completed[0]["output"][0]["call_id"] == "toolu_fixed"
    assert completed[1]["output"][0]["content"][0]["text"] == "done"
    assert received[0]["type"] == "response.created" and received[0]["sequence_number"] == 0
    with connect(up.url.replace("http://", "ws://") + "/s/ws/v1/responses") as ws:
        ws.send("not json")
        assert json.loads(ws.recv(timeout=5))["type"] == "error"
        ws.send(json.dumps({"type": "response.create", "model": "gpt", "input": "warm", "generate": False}))
        warm = [json.loads(ws.recv(timeout=5)) for _ in range(3)]  # Codex's prewarm: nothing generated
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        ws.send(json.dumps({"type": "response.create", "model": "gpt", "input": "third"}))
        while (event := json.loads(ws.recv(timeout=5)))["type"] != "response.completed":
            pass
        assert event["response"]["output"][0]["content"][0]["text"] == "third"  # the prewarm used no turn
    entry = up.log[-2]
    assert entry.status == 101 and entry.method == "GET"
    assert [json.loads(f) for f in entry.response_body.split(b"\n")] == received
    assert [json.loads(f)["input"] for f in entry.body.split(b"\n")] == ["first", "second"]


def test_usage_and_stop_overrides(scripted):
    turn = Turn(text="cut", finish="length", usage=Usage(input_tokens=7, output_tokens=3, cache_read_tokens=5))
    up = scripted(sequence(turn))
    anth = httpx.post(up.url + "/v1/messages", json=MESSAGES).json()
    assert anth["stop_reason"] == "max_tokens"
    assert anth["usage"] == {"input_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5,
                             "output_tokens": 3}
    chat = httpx.post(up.url + "/v1/chat/completions", json=CHAT).json()
    assert chat["usage"]["prompt_tokens"] == 12 and chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 5
    assert chat["choices"][0]["finish_reason"] == "length"
    frames = sse(stream_bytes(up.url + "/v1/responses", {"model": "m", "input": "x", "stream": True}))
    assert frames[-1][0] == "response.incomplete"
    final = json.loads(frames[-1][1])["response"]
    assert final["status"] == "incomplete" and final["usage"]["input_tokens"] == 12


# --- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path,shape", [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"),
                                        ("/v1/responses", "openai")])
@pytest.mark.parametrize("fault", ["500", "429"])
def test_error_status_faults(scripted, path, shape, fault):
    up = scripted()
    by_header = httpx.post(up.url + path, json={**MESSAGES, "input": "x"}, headers={"X-Scripted-Fault": fault})
    by_path = httpx.post(up.url + f"/fault/{fault}" + path, json={**MESSAGES, "input": "x"})
    for r in (by_header, by_path):
        assert r.status_code == int(fault)
        error = r.json()["error"]
        assert error["message"] and (r.json()["type"] == "error" if shape == "anthropic" else "param" in error)
        assert (r.headers.get("retry-after") == "1") == (fault == "429")
    client = anthropic.Anthropic(base_url=up.url + f"/fault/{fault}", api_key="k", max_retries=0)
    with pytest.raises(anthropic.RateLimitError if fault == "429" else anthropic.InternalServerError):
        client.messages.create(**MESSAGES)


def test_stream_faults(scripted):
    up = scripted(sequence(Turn(text="a b c d")))
    base = up.url + "/v1/messages"
    stream = {**MESSAGES, "stream": True}

    with pytest.raises(httpx.RemoteProtocolError):  # reset: some frames, then the connection drops
        with httpx.stream("POST", base, json=stream, headers={"X-Scripted-Fault": "reset"}) as r:
            got = []
            for chunk in r.iter_raw():
                got.append(chunk)
    assert b"event: message_start" in b"".join(got) and b"message_stop" not in b"".join(got)
    assert up.log[-1].response_body == b"".join(got)

    raw = stream_bytes(up.url + "/fault/malformed/v1/messages", stream)
    datas = [d for _, d in sse(raw)]
    bad = [d for d in datas if not d.startswith("{") or d == '{"malformed json']
    assert len(bad) == 1 and json.loads(datas[-1])["type"] == "message_stop"

    frames = sse(stream_bytes(base, stream, **{"X-Scripted-Fault": "error_event"}))
    assert frames[-1][0] == "error" and json.loads(frames[-1][1])["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.APIStatusError):
        with anthropic.Anthropic(base_url=up.url + "/fault/error_event", api_key="k", max_retries=0) \
                .messages.stream(**MESSAGES) as s:
            s.get_final_message()
    frames = sse(stream_bytes(up.url + "/v1/responses", {"model": "m", "input": "x", "stream": True},
                              **{"X-Scripted-Fault": "error_event"}))
    assert frames[-1][0] == "response.failed" and json.loads(frames[-1][1])["response"]["status"] == "failed"
    frames = sse(stream_bytes(up.url + "/v1/chat/completions", {**CHAT, "stream": True},
                              **{"X-Scripted-Fault": "error_event"}))
    assert "error" in json.loads(frames[-2][1]) and frames[-1][1] == "[DONE]"
    with pytest.raises(openai.APIError):
        list(openai.OpenAI(base_url=up.url + "/fault/error_event/v1", api_key="k", max_retries=0)
             .chat.completions.create(stream=True, **CHAT))


def test_body_faults_and_unknown_paths(scripted):
    up = scripted()
    r = httpx.post(up.url + "/v1/chat/completions", json=CHAT, headers={"X-Scripted-Fault": "nonjson"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain") and r.content == b"not json"
    r = httpx.post(up.url + "/fault/big/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    assert r.status_code == 200 and len(r.content) > 45_000_000
    assert len(r.json()["choices"][0]["message"]["content"]) > 45_000_000
    for method, path in (("GET", "/nope"), ("POST", "/v1/embeddings"), ("GET", "/v1/messages"), ("POST", "/fault/unknown/v1/messages")):
        r = httpx.request(method, up.url + path)
        assert r.status_code == 404 and r.json()["error"]["message"]
    assert httpx.post(up.url + "/v1/messages", content=b"{oops").status_code == 400


def test_timeout_does_not_block_the_server(scripted):
    up = scripted()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(up.url + "/fault/timeout/v1/chat/completions", json=CHAT, timeout=0.3)
    hanging = [httpx.AsyncClient(timeout=5) for _ in range(3)]

    async def both():
        waits = [asyncio.create_task(c.post(up.url + "/v1/messages", json=MESSAGES, headers={"X-Scripted-Fault": "timeout"}))
                 for c in hanging]
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient() as c:
            ok = await c.post(up.url + "/v1/messages", json=MESSAGES)
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        return ok

    assert asyncio.run(both()).status_code == 200
    assert up.log[0].status is None  # never answered


def test_server_keeps_serving_after_every_fault(scripted):
    up = scripted()
    for fault in ("500", "429", "reset", "malformed", "nonjson", "error_event", "unknown", "bogus"):
        try:
            httpx.post(up.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                       headers={"X-Scripted-Fault": fault}).read()
        except httpx.HTTPError:
            pass
    ok = httpx.post(up.url + "/v1/chat/completions", json=CHAT)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "echo: hi"
    assert [e.status for e in up.log] == [500, 429, 200, 200, 200, 200, 404, 400, 200]


# --- capacity and the process ------------------------------------------------------------------


def test_500_concurrent_open_streams(scripted):
    up = scripted(sequence(Turn(text="x y z")), chunks=3, chunk_delay=0.5)
    n = 520

    async def run() -> list[bytes]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            responses = await asyncio.gather(*(session.post(up.url + "/v1/messages", json={**MESSAGES, "stream": True})
                                               for _ in range(n)))
            assert all(r.status == 200 for r in responses)  # all n open at once: none has finished yet
            assert sum(e.response_body.endswith(b"message_stop\"}\n\n") for e in up.log) == 0
            return await asyncio.gather(*(r.read() for r in responses))

    bodies = asyncio.run(run())
    assert len(bodies) == n and all(b.rstrip().endswith(b'{"type":"message_stop"}') for b in bodies)


def test_runs_as_a_process():
    proc = subprocess.Popen([sys.executable, str(REPO / "examples" / "scripted_upstream.py"), "--port", "0",
                             "--chunks", "2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=5)
        assert r.json()["choices"][0]["message"]["content"] == "echo: hi"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_port_in_use_raises():
    with ScriptedUpstream() as up:
        with pytest.raises(OSError):
            ScriptedUpstream(port=int(up.url.rsplit(":", 1)[1])).start()
