"""The Gemini API codec: exact request round trips, streams under any chunking, usage, errors, and keys.

The request fixture is field for field what Gemini CLI 0.61 sends (captured
through the recorder: `parametersJsonSchema`, the `thoughtSignature` it puts
beside a replayed call, `functionResponse.response.output`); the stream
frames are the API's `streamGenerateContent?alt=sse` chunks, each a partial
`GenerateContentResponse`, with no terminal event.
"""

from __future__ import annotations

import json

import httpx

from forgerl.recorder.apis import GEMINI, codec_for
from forgerl.recorder.apis.gemini import is_gemini_api, model_of
from forgerl.recorder.redact import REDACTED, Redactor
from forgerl.schema.chat import chat_tools, to_chat_messages
from forgerl.schema.messages import Exchange, Usage

from conftest import session_calls
from test_apis import PNG_B64, check_every_split, feed_all, round_trip, sse

SHELL = {"name": "run_shell_command", "description": "Runs a shell command.",
         "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                                  "required": ["command"]}}
CLI_REQUEST = {
    "contents": [
        {"parts": [{"text": "<session_context>\nThis is the Gemini CLI.\n</session_context>"},
                   {"text": "Write proof.txt"}, {"inlineData": {"mimeType": "image/png", "data": PNG_B64}}],
         "role": "user"},
        {"parts": [{"text": "Plan: one command.", "thought": True, "thoughtSignature": "c2lnbmF0dXJl"},
                   {"functionCall": {"id": "call_26", "args": {"command": "echo forgerl > proof.txt"},
                                     "name": "run_shell_command"},
                    "thoughtSignature": "skip_thought_signature_validator"}],
         "role": "model"},
        {"parts": [{"functionResponse": {"name": "run_shell_command", "response": {"output": "Output: (empty)"},
                                         "id": "call_26"}}], "role": "user"},
    ],
    "systemInstruction": {"parts": [{"text": "You are a non-interactive CLI agent."}], "role": "user"},
    "tools": [{"functionDeclarations": [SHELL]}, {"googleSearch": {}}],
    "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64,
                         "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192}},
}


def test_paths():
    stream = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    assert codec_for(stream) is GEMINI and codec_for("/v1beta/models/gemini-2.5-pro:generateContent") is GEMINI
    assert codec_for("/v1beta/models/gemini-2.5-pro:countTokens") is None and codec_for("/v1/messages") is not GEMINI
    assert model_of(stream) == "gemini-2.5-pro" and model_of("/v1/chat/completions") is None
    assert is_gemini_api("/v1beta/models") and is_gemini_api(stream) and not is_gemini_api("/v1/responses")


def test_round_trip_of_a_gemini_cli_request():
    exchange = round_trip(GEMINI, CLI_REQUEST)
    assert [m.role for m in exchange.input] == ["system", "user", "assistant", "user"]
    thought, call = exchange.input[2].parts
    assert (thought.type, thought.text, thought.signature) == ("reasoning", "Plan: one command.", "c2lnbmF0dXJl")
    assert (call.type, call.call_id, call.tool_name) == ("tool_call", "call_26", "run_shell_command")
    assert json.loads(call.arguments) == {"command": "echo forgerl > proof.txt"}
    assert call.extra == {"thoughtSignature": "skip_thought_signature_validator"}
    (result,) = exchange.input[3].parts
    assert (result.type, result.call_id, result.tool_name) == ("tool_result", "call_26", "run_shell_command")
    assert json.loads(result.text) == {"output": "Output: (empty)"}
    assert exchange.input[1].parts[2].type == "image" and exchange.input[1].parts[2].media_type == "image/png"
    assert exchange.params == {key: CLI_REQUEST[key] for key in ("tools", "generationConfig")}
    # Tool schemas are kept exactly; the one mapping onto the chat shape renames parametersJsonSchema.
    assert exchange.tools == [{"name": "run_shell_command", "description": "Runs a shell command.",
                               "parameters": SHELL["parametersJsonSchema"]},
                              {"name": "googleSearch", "type": "googleSearch"}]
    assert chat_tools(exchange.tools)[0] == {"type": "function", "function": exchange.tools[0]}
    chat = to_chat_messages(exchange.input)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool"]
    assert chat[2]["tool_calls"][0]["id"] == chat[3]["tool_call_id"] == "call_26"


def test_odd_shapes_stay_verbatim():
    body = {"contents": [{"parts": [{"text": "no role"}]}, {"role": "function", "parts": []},
                         {"role": "critic", "parts": [{"executableCode": {"code": "print(1)"}}]},
                         {"role": "user", "parts": [{"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://b/x"}},
                                                    {"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}},
                                                    {"text": "shown", "thought": False}]}],
            "systemInstruction": "be brief"}
    exchange = round_trip(GEMINI, body)
    assert [m.role for m in exchange.input] == ["system", "user", "tool", "user", "user"]
    assert [p.type for p in exchange.input[4].parts] == ["image", "other", "text"]
    assert round_trip(GEMINI, {"contents": "not a list"}).input == []


STREAM = [
    {"candidates": [{"content": {"parts": [{"text": "Plan", "thought": True}], "role": "model"}, "index": 0}],
     "usageMetadata": {"promptTokenCount": 5120, "totalTokenCount": 5120}, "modelVersion": "gemini-2.5-pro",
     "responseId": "r-1"},
    {"candidates": [{"content": {"parts": [{"text": ": one call.", "thought": True, "thoughtSignature": "c2ln"}],
                                 "role": "model"}, "index": 0}], "modelVersion": "gemini-2.5-pro", "responseId": "r-1"},
    {"candidates": [{"content": {"parts": [{"text": "Writing "}], "role": "model"}, "index": 0}],
     "modelVersion": "gemini-2.5-pro", "responseId": "r-1"},
    {"candidates": [{"content": {"parts": [{"text": "the file — now."}], "role": "model"}, "index": 0}],
     "modelVersion": "gemini-2.5-pro", "responseId": "r-1"},
    {"candidates": [{"content": {"parts": [{"functionCall": {"name": "write_file", "args": {"file_path": "p.txt",
                                                                                          "content": "x"}}}],
                                 "role": "model"}, "finishReason": "STOP", "index": 0}],
     "usageMetadata": {"promptTokenCount": 5120, "candidatesTokenCount": 30, "totalTokenCount": 5162,
                       "cachedContentTokenCount": 4096, "thoughtsTokenCount": 12},
     "modelVersion": "gemini-2.5-pro", "responseId": "r-1"},
]
STREAMED_BODY = {
    "candidates": [{"content": {"parts": [{"text": "Plan: one call.", "thought": True, "thoughtSignature": "c2ln"},
                                          {"text": "Writing the file — now."},
                                          {"functionCall": {"name": "write_file",
                                                            "args": {"file_path": "p.txt", "content": "x"}}}],
                                "role": "model"}, "index": 0, "finishReason": "STOP"}],
    "usageMetadata": {"promptTokenCount": 5120, "candidatesTokenCount": 30, "totalTokenCount": 5162,
                      "cachedContentTokenCount": 4096, "thoughtsTokenCount": 12},
    "modelVersion": "gemini-2.5-pro", "responseId": "r-1",
}


def test_stream_reassembles_under_any_chunking():
    check_every_split(GEMINI, sse(STREAM, named=False), STREAMED_BODY)
    stream = feed_all(GEMINI, STREAM, named=False)
    assert stream.done and stream.first_token_seen and stream.error is None


def test_response_parsing():
    exchange = Exchange()
    GEMINI.parse_response(STREAMED_BODY, exchange)
    assert exchange.model_returned == "gemini-2.5-pro" and exchange.stop_reason == "STOP"
    assert exchange.usage == Usage(input_tokens=1024, output_tokens=42, cache_read_tokens=4096, reasoning_tokens=12)
    assert [p.type for p in exchange.output[0].parts] == ["reasoning", "text", "tool_call"]
    assert exchange.output[0].parts[2].call_id is None  # the API often names no id


def test_cut_error_and_malformed_streams_never_raise():
    cut = feed_all(GEMINI, STREAM[:3], named=False)
    assert not cut.done and cut.error is None
    assert cut.result()["candidates"][0]["content"]["parts"][-1] == {"text": "Writing "}
    failure = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    failed = feed_all(GEMINI, [*STREAM[:2], failure], named=False)
    assert failed.error == "UNAVAILABLE: The model is overloaded." and not failed.done
    only = feed_all(GEMINI, [failure], named=False)
    exchange = Exchange()
    GEMINI.parse_response(only.result(), exchange)
    assert exchange.error == "UNAVAILABLE: The model is overloaded." and exchange.output == []
    broken = feed_all(GEMINI, ['{"candidates": [', "[1]", *STREAM], named=False)
    assert broken.error.startswith("malformed SSE frame #1") and broken.result() == STREAMED_BODY


def test_key_in_the_query_or_header_never_reaches_disk(scripted, recorder):
    """`key=` (the SDKs' other way) is cut from the stored path; `x-goog-api-key` from the stored headers."""
    key = "AIzaSyQueryKeyQueryKeyQueryKeyQuery123"
    assert Redactor().path(f"/v1beta/models/m:generateContent?key={key}&alt=sse") == \
        f"/v1beta/models/m:generateContent?key={REDACTED}&alt=sse"
    up = scripted()
    rec = recorder(up.url)
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    plain = httpx.post(f"{rec.base('gk')}/v1beta/models/m:generateContent?key={key}", json=body, timeout=10)
    streamed = httpx.post(f"{rec.base('gk')}/v1beta/models/m:streamGenerateContent?alt=sse", json=body,
                          headers={"x-goog-api-key": key}, timeout=10)
    assert plain.json()["candidates"][0]["content"]["parts"] == [{"text": "echo: hi"}]
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert [e.path.split("?")[0] for e in up.log] == ["/v1beta/models/m:generateContent",
                                                      "/v1beta/models/m:streamGenerateContent"]
    rows = session_calls(rec.out, "gk", 2)
    assert all(r["api"] == "gemini" and r["complete"] and r["error"] is None for r in rows)
    assert rows[0]["path"] == f"/v1beta/models/m:generateContent?key={REDACTED}"
    assert json.loads(rows[1]["response"])["candidates"][0]["content"]["parts"] == [{"text": "echo: hi"}]
    rec.stop()
    assert not [p for p in rec.out.rglob("*") if p.is_file() and key[6:].encode() in p.read_bytes()]
