"""Serve mode: tool-call parsing, prompt continuity, and `forge-record serve --policy` driven by the SDKs."""

from __future__ import annotations

import json
import shutil
import subprocess

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from forgerl.recorder.generate import PromptBuilder
from forgerl.schema.chat import to_chat_messages
from forgerl.schema.toolcalls import ToolCall, parse_generation

from conftest import FORGE_RECORD, RecorderProcess, session_calls
from serve_fixtures import EOS_ID, TOKENIZER_DIR


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


CALL_TURN = ('<think>\nList first.\n</think>\n\nLet me look.\n<tool_call>\n{"name": "Bash", "arguments": '
             '{"command": "ls -la", "description": "List"}}\n</tool_call>\n<tool_call>\n{"name": "Read", '
             '"arguments": {"file_path": "/tmp/x"}}\n</tool_call>')


def test_parse_reasoning_text_and_calls():
    turn = parse_generation(CALL_TURN)
    assert turn.reasoning == "List first." and turn.text == "Let me look."
    assert turn.tool_calls == (ToolCall("Bash", {"command": "ls -la", "description": "List"}),
                               ToolCall("Read", {"file_path": "/tmp/x"}))


def test_parse_keeps_broken_calls_as_text():
    turn = parse_generation('Hi <tool_call>\n{"name": oops}\n</tool_call>')
    assert turn.tool_calls == () and turn.text == 'Hi <tool_call>\n{"name": oops}\n</tool_call>'
    assert parse_generation("<think>\n\n</think>\n\nplain").reasoning == ""
    assert parse_generation("no think\n").text == "no think" and parse_generation("x").reasoning is None


def test_parsed_turn_renders_back_to_the_generated_text(tok):
    """The template writes the parsed message as the model wrote it: history re-renders without drift."""
    turn = parse_generation(CALL_TURN)
    messages = [{"role": "user", "content": "go"}] + to_chat_messages([turn.message(["c1", "c2"])])
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n" + CALL_TURN + "<|im_end|>\n")


def test_prompt_continues_the_generated_ids(tok):
    builder = PromptBuilder(tok)
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    prompt = builder.build(first, None)
    assert prompt.continues is None
    generated = tok.encode(CALL_TURN, add_special_tokens=False) + [EOS_ID]
    said = to_chat_messages([parse_generation(CALL_TURN).message(["c1", "c2"])])
    builder.remember(first, None, said, prompt.ids + generated, prompt.answer_id)
    history = first + said + [{"role": "tool", "content": "a b", "tool_call_id": "c1"},
                              {"role": "tool", "content": "x", "tool_call_id": "c2"}]
    nxt = builder.build(history, None)
    assert nxt.continues == prompt.answer_id and nxt.ids[:len(prompt.ids) + len(generated)] == prompt.ids + generated
    assert tok.decode(nxt.ids) == tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    edited = [first[0], {"role": "user", "content": "something else"}] + said
    assert builder.build(edited, None).continues is None


def test_an_engine_rendered_prompt_continues_an_answer_only_where_its_ids_extend_it(tok):
    """The chat endpoint renders its own prompt (`serve_vl`): it continues the answer whose conversation it
    repeats only if the engine's ids start with that answer's ids."""
    builder = PromptBuilder(tok)
    first = [{"role": "user", "content": "go"}]
    prompt = builder.build(first, None)
    generated = tok.encode(CALL_TURN, add_special_tokens=False) + [EOS_ID]
    said = to_chat_messages([parse_generation(CALL_TURN).message(["c1", "c2"])])
    builder.remember(first, None, said, prompt.ids + generated, prompt.answer_id)
    history = first + said + [{"role": "tool", "content": "a b", "tool_call_id": "c1"}]
    held = prompt.ids + generated
    assert builder.continued(history, None, held + [1, 2, 3]) == prompt.answer_id
    assert builder.continued(history, None, held[:-2] + [1, 2, 3]) is None  # re-rendered otherwise: a new segment
    assert builder.continued(first, None, held) is None  # repeats no remembered answer


TURNS = ["<think>\nEasy.\n</think>\n\nHello there, this is a longer answer so it streams in several chunks.",
         CALL_TURN, "plain answer"]


@pytest.fixture
def served(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(TURNS))
    proc = RecorderProcess(tmp_path / "data", None, "--policy", f"script:{script}", "--tokenizer", str(TOKENIZER_DIR),
                           "--served-model", "tiny", "--policy-version", "v7").start()
    yield proc
    proc.stop()


def recorded_turns(tmp_path, session, n, tok):
    calls = [c for c in session_calls(tmp_path / "data", session, n) if c["completion_token_ids"]]
    assert len(calls) == n
    for call, text in zip(calls, TURNS):
        ids = call["completion_token_ids"]
        assert ids[-1] == EOS_ID and tok.decode(ids[:-1]) == text
        assert len(call["completion_logprobs"]) == len(ids) and call["policy_version"] == "v7"
        assert call["error"] is None and call["complete"]
    return calls


def test_anthropic_sdk_stream_and_body(served, tmp_path, tok):
    client = anthropic.Anthropic(base_url=served.base("a"), api_key="sk-ant-api03-servetestservetest")
    with client.messages.stream(model="claude-x", max_tokens=500, messages=[{"role": "user", "content": "hi"}]) as s:
        message = s.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == parse_generation(TURNS[0]).text and message.stop_reason == "end_turn"
    message = client.messages.create(model="claude-x", max_tokens=500, messages=[{"role": "user", "content": "hi"}])
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[2].input == {"command": "ls -la", "description": "List"}
    assert message.stop_reason == "tool_use"
    calls = recorded_turns(tmp_path, "a", 2, tok)
    assert calls[0]["streamed"] and not calls[1]["streamed"]
    assert calls[0]["prompt_token_ids"] == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True))


def test_responses_and_chat_sdks(served, tmp_path, tok):
    client = openai.OpenAI(base_url=served.base("o") + "/v1", api_key="sk-proj-servetestservetestserve")
    with client.responses.stream(model="gpt-x", input="hi") as s:
        response = s.get_final_response()
    assert response.output_text == parse_generation(TURNS[0]).text and response.status == "completed"
    chunks = list(client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True}))
    calls_made = [c for chunk in chunks for choice in chunk.choices for c in (choice.delta.tool_calls or [])]
    heads = [c for c in calls_made if c.id]  # a call's first fragment names it; its arguments follow in pieces
    assert [c.function.name for c in heads] == ["Bash", "Read"]
    arguments = ["".join(c.function.arguments for c in calls_made if c.index == i) for i in (0, 1)]
    assert [json.loads(a) for a in arguments] == [call.arguments for call in parse_generation(CALL_TURN).tool_calls]
    done = client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    assert done.choices[0].message.content == "plain answer" and done.choices[0].finish_reason == "stop"
    calls = recorded_turns(tmp_path, "o", 3, tok)
    assert [c["api"] for c in calls] == ["responses", "chat", "chat"]


def test_bad_serve_flags_are_one_line_exit_2(tmp_path):
    plain = tmp_path / "plain-template"  # a tokenizer whose template writes no tool calls any format knows
    shutil.copytree(TOKENIZER_DIR, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    (plain / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    for args, needle in [(["--policy", "http://127.0.0.1:9", "--tokenizer", str(plain), "--served-model", "m"],
                          "no known tool-call format"),(["--policy", "http://127.0.0.1:9"], "needs --policy, --tokenizer and --served-model"),
                         (["--policy", "http://127.0.0.1:9", "--tokenizer", str(tmp_path), "--served-model", "m",
                           "--upstream", "http://127.0.0.1:9"], "drop --upstream"),
                         (["--policy", "ftp://x", "--tokenizer", str(TOKENIZER_DIR), "--served-model", "m"],
                          "expected http(s)"),
                         (["--policy", "http://127.0.0.1:9", "--tokenizer", str(tmp_path / "nope"),
                           "--served-model", "m"], "no such directory")]:
        r = subprocess.run([FORGE_RECORD, "serve", *args, "--out", str(tmp_path / "d")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_gemini_stream_and_body(served, tmp_path, tok):
    """The Gemini API, as Gemini CLI's SDK calls it: the stream by path (`:streamGenerateContent?alt=sse`), the
    plain call by `:generateContent`; calls get ids (Gemini CLI answers with them), thoughts are `thought` parts."""
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    url = served.base("g") + "/v1beta/models/gemini-x"
    headers = {"x-goog-api-key": "AIzaSyServeTestServeTestServeTest123456"}
    with httpx.stream("POST", url + ":streamGenerateContent?alt=sse", json=body, headers=headers, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    parts = [p for frame in frames for p in frame["candidates"][0]["content"]["parts"]]
    said = parse_generation(TURNS[0])
    assert "".join(p["text"] for p in parts if p.get("thought")) == said.reasoning
    assert "".join(p["text"] for p in parts if not p.get("thought")) == said.text
    assert frames[-1]["candidates"][0]["finishReason"] == "STOP" and len(frames) > 3
    plain = httpx.post(url + ":generateContent", json=body, headers=headers, timeout=30).json()
    calls = [p["functionCall"] for p in plain["candidates"][0]["content"]["parts"] if "functionCall" in p]
    assert [(c["name"], c["args"]) for c in calls] == [(c.name, c.arguments)
                                                       for c in parse_generation(CALL_TURN).tool_calls]
    assert all(c["id"] for c in calls) and plain["modelVersion"] == "gemini-x"
    recorded = recorded_turns(tmp_path, "g", 2, tok)
    assert [c["api"] for c in recorded] == ["gemini", "gemini"] and recorded[0]["streamed"]
