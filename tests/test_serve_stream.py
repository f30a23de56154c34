"""Serve mode streams as the policy generates: real SDK clients, the recorder and gateway of
`forge-record serve --policy` in front of a streaming vLLM-protocol policy (`ScriptedPolicyServer`, one token every 20 ms), all over real sockets.

Each test checks what the harness saw (deltas before the policy finished, well-formed tool-use blocks, the
API's own error event) and what was recorded (the ids and logprobs the policy streamed, exactly)."""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from forgerl.recorder.policy import HTTPPolicy
from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig, free_port
from forgerl.recorder.serve import GatewayThread, PolicyGateway
from forgerl.schema.toolcalls import FORMATS, parse_generation

from conftest import session_calls
from serve_fixtures import FIRST_TEXT, TOKENIZER_DIR, ScriptedPolicyServer

THINK = ("<think>\nThe user wants a long answer, so I will write one.\n</think>\n\nHere is a longer answer that "
         "streams in many pieces, one token at a time, as the policy writes it.")
CALL = ('<think>\nList, then read.\n</think>\n\nLet me look.\n<tool_call>\n{"name": "Bash", "arguments": {"command": '
        '"ls -la", "timeout": 5}}\n</tool_call>\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "/tmp/x"}}'
        '\n</tool_call>')
FAIL = "This answer starts well and then the engine dies in the middle of it, mid-sentence."
CODER = ("I'll run it.\n\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n"
         "5\n</parameter>\n</function>\n</tool_call>")
BAD = ("<tool_call>\n<function=Bash>\n<parameter=timeout>\nfive\n</parameter>\n</function>\n</tool_call>")
STALL = "Sure, the policy stalls after this first word and the harness has it already."
TURNS = {"think": THINK, "call": CALL, "fail": FAIL, "coder": CODER, "bad": BAD, "stall": STALL}
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def policy(tok):
    with ScriptedPolicyServer(tok, TURNS, delay_s=0.02, fail_after={"fail": 8}, stall_after={"stall": 1}) as server:
        yield server


@dataclass
class Served:
    url: str
    out: Path

    def base(self, session: str) -> str:
        return f"{self.url}/s/{session}"


@pytest.fixture(scope="module")
def served(policy, tok, tmp_path_factory):
    """What `forge-record serve --policy URL` runs (test_serve.py runs the CLI itself): the recorder in front of a
    gateway to the policy, here in this process so the module does not pay a second start-up."""
    out = tmp_path_factory.mktemp("stream") / "data"
    with GatewayThread(PolicyGateway(HTTPPolicy(policy.url, "tiny"), tok, "tiny")) as gateway_url:
        config = RecorderConfig.one_upstream(out, gateway_url, listen_port=free_port(), policy_version="v9")
        with BackgroundRecorder(config):
            yield Served(config.url, out)


def said(policy: ScriptedPolicyServer, turn: str):
    return [s for s in policy.said if s.turn == turn][-1]


def check_recorded(served, session: str, n: int, sent: list) -> list[dict]:
    """The recorded calls hold exactly the ids the policy streamed, and its logprobs (as the float32 column
    holds them)."""
    calls = session_calls(served.out, session, n)
    for call, s in zip(calls, sent):
        assert call["streamed"] and call["policy_version"] == "v9"
        assert call["completion_token_ids"] == s.ids
        assert call["completion_logprobs"] == np.array(s.logprobs, dtype=np.float32).tolist()
    return calls


def test_anthropic_text_arrives_while_the_policy_generates(served, policy, tok):
    client = anthropic.Anthropic(base_url=served.base("a"), api_key="sk-ant-api03-streamteststreamtest")
    first = None
    with client.messages.stream(model="claude-x", max_tokens=500,
                                messages=[{"role": "user", "content": "[[think]]"}]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and first is None:
                first = time.monotonic()
        message = stream.get_final_message()
    s = said(policy, "think")
    assert first < s.first_sent + 0.5 * (s.last_sent - s.first_sent), "the first delta waited for the generation"
    turn = parse_generation(THINK)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", turn.reasoning), ("text", turn.text)]
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == len(s.ids)
    call = check_recorded(served, "a", 1, [s])[0]
    assert call["error"] is None and call["prompt_token_ids"] == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "[[think]]"}], tokenize=False, add_generation_prompt=True))


@pytest.mark.parametrize("api", list(FIRST_TEXT))
def test_the_first_token_reaches_the_harness_while_the_policy_stalls(served, policy, api):
    """The policy sends one plain-text token and stalls until the harness has seen it: through the recorder and the
    gateway, nothing waits for a second token (no buffering, no holdback of text that cannot start a tag)."""
    path, body_of, first_text = FIRST_TEXT[api]
    body = body_of("[[stall]]")
    policy.release.clear()
    seen = None
    try:
        with httpx.stream("POST", served.base(f"stall-{api}") + path, json=body, timeout=30,
                          headers={"x-api-key": "sk-ant-api03-streamteststreamtest"}) as response:
            for line in response.iter_lines():
                data = line[6:] if line.startswith("data: ") else ""
                if seen is None and data and data != "[DONE]" and first_text(json.loads(data)):
                    seen = list(said(policy, "stall").ids)
                    policy.release.set()
    finally:
        policy.release.set()
    sent = said(policy, "stall")
    assert seen is not None and len(seen) < 2, f"the first text waited for {len(seen or [])} tokens"
    assert len(sent.ids) > 2
    check_recorded(served, f"stall-{api}", 1, [sent])


def test_a_harness_that_hangs_up_mid_stream_stops_the_generation_without_an_error(policy, tok, caplog):
    """The gateway's next write finds the harness gone: it closes the policy's stream, logs no traceback, and
    counts no finished call."""
    gateway = PolicyGateway(HTTPPolicy(policy.url, "tiny"), tok, "tiny")
    path, body_of, first_text = FIRST_TEXT["chat"]
    body = body_of("[[stall]]")
    policy.release.clear()
    try:
        with GatewayThread(gateway) as url:
            with httpx.stream("POST", url + path, json=body, timeout=30) as response:
                next(line for line in response.iter_lines()
                     if line.startswith("data: {") and first_text(json.loads(line[6:])))
            policy.release.set()
            sent = said(policy, "stall")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and time.monotonic() - sent.last_sent < 0.5:
                time.sleep(0.05)  # the policy sends until the gateway closes its stream
    finally:
        policy.release.set()
    assert len(sent.ids) < len(tok.encode(STALL)) and gateway.calls == 0
    gateway_tracebacks = [r for r in caplog.records if r.exc_info and any(
        frame.filename.endswith(("recorder/serve.py", "recorder/generate.py"))
        for frame in traceback.extract_tb(r.exc_info[2]))]
    assert not gateway_tracebacks


def test_tool_calls_are_whole_blocks_once_complete(served, policy):
    client = anthropic.Anthropic(base_url=served.base("t"), api_key="sk-ant-api03-streamteststreamtest")
    with client.messages.stream(model="claude-x", max_tokens=500,
                                messages=[{"role": "user", "content": "[[call]]"}]) as stream:
        events = list(stream)
        message = stream.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert uses == [(c.name, c.arguments) for c in parse_generation(CALL).tool_calls]
    assert message.stop_reason == "tool_use"
    check_recorded(served, "t", 1, [said(policy, "call")])


def test_responses_and_chat_stream(served, policy):
    client = openai.OpenAI(base_url=served.base("o") + "/v1", api_key="sk-proj-streamteststreamteststream")
    first = None
    with client.responses.stream(model="gpt-x", input="[[think]]") as stream:
        for event in stream:
            if event.type == "response.output_text.delta" and first is None:
                first = time.monotonic()
        response = stream.get_final_response()
    thinking = said(policy, "think")
    assert first < thinking.last_sent and response.output_text == parse_generation(THINK).text
    chunks = list(client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "[[call]]"}],
                                                 stream=True))
    fragments = [c for chunk in chunks for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
    arguments = ["".join(c.function.arguments for c in fragments if c.index == i) for i in (0, 1)]
    assert [json.loads(a) for a in arguments] == [c.arguments for c in parse_generation(CALL).tool_calls]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    whole = client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "[[call]]"}])
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["Bash", "Read"]
    calls = check_recorded(served, "o", 2, [thinking, said(policy, "call")])
    assert [c["api"] for c in calls] == ["responses", "chat"]


def test_policy_error_mid_stream_reaches_the_harness_and_is_recorded(served, policy):
    """Anthropic's `error` event and Chat's error chunk raise in the SDKs; Responses ends `response.failed`,
    Gemini with an error chunk."""
    client = anthropic.Anthropic(base_url=served.base("e"), api_key="sk-ant-api03-streamteststreamtest",
                                 max_retries=0)
    seen = []
    with pytest.raises(anthropic.APIStatusError, match="engine died"):
        with client.messages.stream(model="claude-x", max_tokens=500,
                                    messages=[{"role": "user", "content": "[[fail]]"}]) as stream:
            for event in stream:
                seen.append(event.type)
    assert "content_block_delta" in seen, "the text before the failure was forwarded"
    chat = openai.OpenAI(base_url=served.base("e") + "/v1", api_key="sk-proj-streamteststreamteststream",
                         max_retries=0)
    with pytest.raises(openai.APIError, match="engine died"):
        list(chat.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "[[fail]]"}],
                                          stream=True))
    with chat.responses.stream(model="gpt-x", input="[[fail]]") as stream:
        failed = [event for event in stream if event.type == "response.failed"]
    assert failed[0].response.error.message.endswith("engine died")
    url = served.base("e") + "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
    with httpx.stream("POST", url, json={"contents": [{"role": "user", "parts": [{"text": "[[fail]]"}]}]},
                      headers={"x-goog-api-key": "AIzaSyStreamTestStreamTestStream12345678"}, timeout=30) as r:
        frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1]["error"]["message"].endswith("engine died") and "candidates" in frames[0]
    calls = session_calls(served.out, "e", 4)
    assert [c["api"] for c in calls] == ["anthropic", "chat", "responses", "gemini"]
    assert all("engine died" in c["error"] for c in calls) and all(c["streamed"] for c in calls)


def test_qwen3_coder_calls_stream_and_malformed_ones_stay_text(policy, tok):
    """A format chosen by name (`--tool-format`): the gateway alone, its calls typed by the tools' schemas."""
    gateway = PolicyGateway(HTTPPolicy(policy.url, "tiny"), tok, "tiny", fmt=FORMATS["qwen3_coder"])
    with GatewayThread(gateway) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        chunks = list(client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "[[coder]]"}], tools=TOOLS, stream=True))
        text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
        fragments = [c for chunk in chunks for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
        assert text == "I'll run it." and fragments[0].function.name == "Bash"
        assert json.loads("".join(c.function.arguments for c in fragments)) == {"command": "ls -la", "timeout": 5}
        bad = client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "[[bad]]"}],
                                             tools=TOOLS)
        assert bad.choices[0].message.content == BAD and not bad.choices[0].message.tool_calls
    assert gateway.malformed_calls == 1 and gateway.calls == 2
