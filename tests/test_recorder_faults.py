"""Upstream faults: the client sees what it would see without the recorder, the call is logged."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from conftest import session_calls
from scripted_upstream import ToolCall, Turn, sequence

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
GENERATE, STREAM = "/v1beta/models/m:generateContent", "/v1beta/models/m:streamGenerateContent?alt=sse"


def call(base: str, path: str, body: dict, fault: str | None, timeout: float = 10.0):
    """(status, body sha256) or the exception type name, as a client would observe it."""
    headers = {"x-scripted-fault": fault} if fault else {}
    try:
        with httpx.Client(timeout=timeout) as client:
            with client.stream("POST", base + path, json=body, headers=headers) as r:
                data = b"".join(r.iter_raw())
                return r.status_code, r.headers.get("content-type"), hashlib.sha256(data).hexdigest()
    except httpx.HTTPError as e:
        return type(e).__name__


CASES = [
    # fault, path, body, expected recorded error fragment
    ("500", "/v1/chat/completions", CHAT, "HTTP 500"),
    ("429", "/v1/messages", MESSAGES, "HTTP 429"),
    ("malformed", "/v1/chat/completions", {**CHAT, "stream": True}, "malformed"),
    ("nonjson", "/v1/chat/completions", CHAT, "not JSON"),
    ("error_event", "/v1/messages", {**MESSAGES, "stream": True}, "overloaded"),
    ("error_event", "/v1/chat/completions", {**CHAT, "stream": True}, "error"),
    ("big", "/v1/chat/completions", CHAT, None),
    ("reset", "/v1/messages", {**MESSAGES, "stream": True}, ""),
    # The same seven faults on the Gemini API.
    ("500", GENERATE, GEMINI, "HTTP 500"),
    ("429", STREAM, GEMINI, "HTTP 429"),
    ("malformed", STREAM, GEMINI, "malformed"),
    ("nonjson", GENERATE, GEMINI, "not JSON"),
    ("error_event", STREAM, GEMINI, "INTERNAL: scripted fault"),
    ("big", GENERATE, GEMINI, None),
    ("reset", STREAM, GEMINI, ""),
]


@pytest.mark.parametrize("fault,path,body,recorded", CASES, ids=[f"{c[0]}-{c[1].split('/')[-1].split('?')[0]}" for c in CASES])
def test_fault_is_transparent_and_recorded(scripted, recorder, fault, path, body, recorded):
    up = scripted()
    rec = recorder(up.url)
    direct = call(up.url, path, body, fault)
    through = call(rec.base(f"f-{fault}"), path, body, fault)
    assert through == direct
    row = session_calls(rec.out, f"f-{fault}", 1, timeout=60)[0]
    if recorded is None:
        assert row["error"] is None and row["complete"]
    else:
        assert row["error"] is not None and recorded.lower() in row["error"].lower(), row["error"]
    # ... and keeps serving.
    ok = httpx.post(rec.base("after") + "/v1/chat/completions", json=CHAT, timeout=10)
    assert ok.status_code == 200 and ok.json()["choices"]


@pytest.mark.parametrize("path,body,terminal", [
    ("/v1/responses", {"model": "m", "input": "hi", "stream": True}, b"response.completed"),
    ("/v1/messages", {**MESSAGES, "stream": True}, b"message_stop"),
], ids=["responses", "anthropic"])
def test_client_hanging_up_after_the_terminal_event_loses_nothing(scripted, recorder, path, body, terminal):
    """A harness that closes once it has the terminal event (Codex) while the server has not ended the stream:
    the call is whole. Hanging up before it (mid-stream: 4 pieces 0.3 s apart) is still an incomplete call."""
    up = scripted(chunks=4, chunk_delay=0.3)
    rec = recorder(up.url)
    for session, until in (("whole", terminal), ("cut", b"delta")):
        with httpx.stream("POST", rec.base(session) + path, json=body, headers={"x-scripted-fault": "linger"},
                          timeout=10) as r:
            seen = b""
            for chunk in r.iter_raw():
                seen += chunk
                if until in seen:
                    break
    whole = session_calls(rec.out, "whole", 1, timeout=30)[0]
    assert whole["error"] is None and whole["complete"], whole["error"]
    cut = session_calls(rec.out, "cut", 1, timeout=30)[0]
    assert not cut["complete"] and "disconnected" in (cut["error"] or "").lower(), cut["error"]


def test_upstream_timeout_is_recorded(scripted, recorder):
    up = scripted()
    rec = recorder(up.url)
    assert call(up.url, "/v1/chat/completions", CHAT, "timeout", timeout=1.0) == "ReadTimeout"
    assert call(rec.base("slow"), "/v1/chat/completions", CHAT, "timeout", timeout=1.0) == "ReadTimeout"
    rec.stop()  # the client gave up; stopping the recorder closes the call as incomplete
    row = session_calls(rec.out, "slow", 1)[0]
    assert not row["complete"] and row["error"]


def test_unknown_paths_pass_through_raw(scripted, recorder):
    up = scripted()
    rec = recorder(up.url)
    r = httpx.get(rec.base("raw") + "/v1/not-a-model-api?x=1", timeout=10)
    assert r.status_code == 404
    direct = httpx.get(up.url + "/v1/not-a-model-api?x=1", timeout=10)
    assert r.content == direct.content
    models = httpx.get(rec.base("raw") + "/v1/models", timeout=10)
    assert models.status_code == 200
    rows = session_calls(rec.out, "raw", 2)
    assert {r["api"] for r in rows} == {"raw"}
    assert rows[0]["path"] == "/v1/not-a-model-api?x=1" and rows[0]["status"] == 404


def test_upstream_down_gives_a_gateway_error(recorder):
    from forgerl.recorder.proxy import free_port
    rec = recorder(f"http://127.0.0.1:{free_port()}")
    r = httpx.post(rec.base("down") + "/v1/chat/completions", json=CHAT, timeout=10)
    assert r.status_code == 502
    row = session_calls(rec.out, "down", 1)[0]
    assert row["error"] and not row["complete"]


def test_session_header_and_default_session(scripted, recorder):
    up = scripted()
    rec = recorder(up.url, "--session", "fallback")
    httpx.post(rec.url + "/v1/chat/completions", json=CHAT, headers={"X-Forge-Session": "hdr"}, timeout=10)
    httpx.post(rec.url + "/v1/chat/completions", json=CHAT, timeout=10)
    assert session_calls(rec.out, "hdr", 1)[0]["path"] == "/v1/chat/completions"
    assert session_calls(rec.out, "fallback", 1)
    assert all("x-forge-session" not in {k.lower() for k in e.headers} for e in up.log)
    assert [e.path for e in up.log] == ["/v1/chat/completions"] * 2


def test_websocket_responses_are_recorded(scripted, recorder):
    from websockets.sync.client import connect
    up = scripted(sequence(Turn(text="hello over ws", tool_calls=[ToolCall("shell", {"cmd": "ls"})]),
                           Turn(text="done")))
    rec = recorder(up.url)
    url = rec.base("ws").replace("http://", "ws://") + "/v1/responses"
    received = []
    with connect(url, additional_headers={"Authorization": "Bearer sk-proj-wssecretwssecretwssecret"}) as ws:
        for text in ("first", "second"):
            ws.send(json.dumps({"type": "response.create", "model": "gpt-test", "input": text}))
            while True:
                event = json.loads(ws.recv(timeout=10))
                received.append(event)
                if event["type"] in ("response.completed", "response.failed"):
                    break
    rows = session_calls(rec.out, "ws", 2)
    assert [r["api"] for r in rows] == ["responses", "responses"]
    assert all(r["complete"] and r["error"] is None for r in rows), [r["error"] for r in rows]
    assert json.loads(rows[0]["response"])["output"][-1]["name"] == "shell"
    completed = [e["response"] for e in received if e["type"] == "response.completed"]
    assert json.loads(rows[1]["response"])["output"] == completed[1]["output"]
    assert "sk-proj-wssecret" not in rows[0]["request_headers"]
