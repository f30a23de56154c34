"""The generic path: a client nobody fingerprinted, speaking each wire API, is recorded, converted and analysed.

A plain httpx client with its own User-Agent runs a tool loop over the
Anthropic Messages, Chat Completions, Responses and Gemini APIs (ask, get a
`shell` tool call, send its result back with the model's turn, get the
answer) and one legacy Completions call, through a real `forge-record serve`
in front of the scripted upstream. Every session is labelled `unknown` with
the User-Agent kept; no key byte reaches disk; each loop converts to `tokens`
and `verl-sft` (veRL loads it, ids equal) and the analysis counts its tool
calls by kind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgerl.analysis import connect
from forgerl.schema.store import read_table

from conftest import session_calls
from harness_checks import check_same_ids, convert_sft_and_tokens, files_holding, recording
from scripted_upstream import ToolCall, Turn, saw_tool_result

UA = "acme-agent/0.3 (in-house)"
KEY = "generic-secret-key-0123456789abcdef"
COMMAND = "ls -la"
OUTPUT = "total 0 forgerl-listing"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOL_APIS = ("anthropic", "chat", "responses", "gemini")
pytestmark = pytest.mark.slow


def script(request) -> Turn:
    if request.api == "completions":
        return Turn(text="a completion")
    if saw_tool_result(request):
        return Turn(text="The folder is empty.")
    return Turn(text="Listing.", tool_calls=[ToolCall("shell", {"command": COMMAND})])


def _anthropic(client: httpx.Client, root: str) -> None:
    url, headers = f"{root}/v1/messages", {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    body: dict[str, Any] = {"model": "claude-x", "max_tokens": 256, "tools": [
        {"name": "shell", "description": "Run a command", "input_schema": SCHEMA}],
        "messages": [{"role": "user", "content": "List the folder."}]}
    first = client.post(url, json=body, headers=headers).json()
    use = next(b for b in first["content"] if b["type"] == "tool_use")
    body["messages"] += [{"role": "assistant", "content": first["content"]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                       "content": OUTPUT}]}]
    client.post(url, json=body, headers=headers).raise_for_status()


def _chat(client: httpx.Client, root: str) -> None:
    url, headers = f"{root}/v1/chat/completions", {"authorization": f"Bearer {KEY}"}
    body: dict[str, Any] = {"model": "gpt-x", "tools": [{"type": "function", "function": {
        "name": "shell", "description": "Run a command", "parameters": SCHEMA}}],
        "messages": [{"role": "user", "content": "List the folder."}]}
    message = client.post(url, json=body, headers=headers).json()["choices"][0]["message"]
    body["messages"] += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                   "content": OUTPUT}]
    client.post(url, json=body, headers=headers).raise_for_status()


def _responses(client: httpx.Client, root: str) -> None:
    url, headers = f"{root}/v1/responses", {"authorization": f"Bearer {KEY}"}
    body: dict[str, Any] = {"model": "gpt-x", "tools": [{"type": "function", "name": "shell",
                                                         "description": "Run a command", "parameters": SCHEMA}],
                            "input": [{"role": "user", "content": "List the folder."}]}
    output = client.post(url, json=body, headers=headers).json()["output"]
    call = next(item for item in output if item["type"] == "function_call")
    body["input"] += [*output, {"type": "function_call_output", "call_id": call["call_id"], "output": OUTPUT}]
    client.post(url, json=body, headers=headers).raise_for_status()


def _gemini(client: httpx.Client, root: str) -> None:
    url, headers = f"{root}/v1beta/models/gemini-x:generateContent", {"x-goog-api-key": KEY}
    body: dict[str, Any] = {"tools": [{"functionDeclarations": [{"name": "shell", "description": "Run a command",
                                                                  "parameters": SCHEMA}]}],
                            "contents": [{"role": "user", "parts": [{"text": "List the folder."}]}]}
    content = client.post(url, json=body, headers=headers).json()["candidates"][0]["content"]
    body["contents"] += [content, {"role": "user", "parts": [
        {"functionResponse": {"name": "shell", "response": {"output": OUTPUT}}}]}]
    client.post(url, json=body, headers=headers).raise_for_status()


LOOPS = {"anthropic": _anthropic, "chat": _chat, "responses": _responses, "gemini": _gemini}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("generic") / "data"
    with recording(script, data) as rec:
        with httpx.Client(timeout=30, headers={"user-agent": UA}) as client:
            for api, loop in LOOPS.items():
                loop(client, rec.base(f"g-{api}"))
            client.post(f"{rec.base('g-completions')}/v1/completions", json={"model": "gpt-x", "prompt": "Say"},
                        headers={"authorization": f"Bearer {KEY}"}).raise_for_status()
        for api in TOOL_APIS:
            session_calls(data, f"g-{api}", 2)
        session_calls(data, "g-completions", 1)
    return data


def test_recorded_as_unknown_with_its_user_agent(recorded):
    sessions = {s["session_id"]: s for s in read_table(recorded, "sessions").to_pylist()}
    assert set(sessions) == {f"g-{api}" for api in (*TOOL_APIS, "completions")}
    assert {(s["harness"], s["user_agent"]) for s in sessions.values()} == {("unknown", UA)}
    calls = read_table(recorded, "calls").to_pylist()
    assert {c["session_id"]: c["api"] for c in calls} == {f"g-{api}": api for api in (*TOOL_APIS, "completions")}
    assert all(c["status"] == 200 and c["error"] is None and c["complete"] for c in calls)
    assert not any(c["tools_absent"] for c in calls)
    leaked = files_holding(KEY, recorded)
    assert not leaked, leaked
    parts = [json.loads(p) for p in read_table(recorded, "messages").column("part").to_pylist()]
    made = [p for p in parts if p["type"] == "tool_call"]
    assert len(made) == 4 and {json.loads(p["arguments"])["command"] for p in made} == {COMMAND}
    results = [p for p in parts if p["type"] == "tool_result"]
    assert len(results) == 4 and all(OUTPUT in json.dumps(p) for p in results)


def test_converted_to_tokens_and_verl_sft(recorded, tmp_path):
    # --no-dedupe: the loops over different APIs may render to the same tokens
    manifest, token_rows, ds = convert_sft_and_tokens(recorded, tmp_path, "unknown", "--no-dedupe")
    assert manifest["counts"]["sessions"] == 5 and manifest["counts"]["tools_absent_calls"] == 0
    token_rows = {r["session_id"]: r for r in token_rows}
    assert {sid: r["num_turns"] for sid, r in token_rows.items()} == {
        **{f"g-{api}": 2 for api in TOOL_APIS}, "g-completions": 1}
    assert len(ds) == 5
    for i in range(len(ds)):
        sid = ds.dataframe["session_id"].iloc[i]
        if sid == "g-completions":
            continue
        calls = [c for m in ds.messages[i] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("shell", {"command": COMMAND})], sid
        assert [t["function"]["name"] for t in ds.tools[i]] == ["shell"], sid
        check_same_ids(ds[i], token_rows[sid], sid)


def test_analysed(recorded):
    con = connect(recorded)
    used = con.execute("SELECT session_id, tool_name, kind, command FROM tool_calls ORDER BY session_id").fetchall()
    assert used == [(f"g-{api}", "shell", "shell", COMMAND) for api in sorted(TOOL_APIS)]
    harnesses = con.execute("SELECT DISTINCT harness FROM session_metrics").fetchall()
    assert harnesses == [("unknown",)]
