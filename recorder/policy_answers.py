"""A policy's turn written in the harness's own API, whole or as a stream of events.

`Answer` is one generated turn after parsing (reasoning, text, tool calls
with ids) plus its token facts; `anthropic_*`, `responses_*` and `chat_*`
write it as each API's non-streaming body or as its SSE events, in the
order and shapes the real services use, so a harness cannot tell the
difference. Text streams in pieces of at most `CHUNK` characters.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from forgerl.schema.toolcalls import ParsedTurn

from .policy_tokens import TOKENS_KEY, token_extension

CHUNK = 24


@dataclass
class Answer:
    turn: ParsedTurn
    call_ids: list[str]
    model: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" | "length"
    policy_version: str | None

    def tokens(self) -> dict[str, Any]:
        return token_extension(self.prompt_ids, self.completion_ids, self.logprobs, self.policy_version)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _pieces(text: str) -> Iterator[str]:
    for start in range(0, len(text), CHUNK):
        yield text[start:start + CHUNK]


def sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


# -- Anthropic Messages ---------------------------------------------------------

def _anthropic_stop(answer: Answer) -> str:
    if answer.finish_reason == "length":
        return "max_tokens"
    return "tool_use" if answer.turn.tool_calls else "end_turn"


def _anthropic_blocks(answer: Answer) -> list[dict[str, Any]]:
    turn = answer.turn
    blocks: list[dict[str, Any]] = []
    if turn.reasoning:
        blocks.append({"type": "thinking", "thinking": turn.reasoning, "signature": ""})
    if turn.text:
        blocks.append({"type": "text", "text": turn.text})
    for call, call_id in zip(turn.tool_calls, answer.call_ids):
        blocks.append({"type": "tool_use", "id": call_id, "name": call.name, "input": call.arguments})
    return blocks


def _anthropic_usage(answer: Answer) -> dict[str, Any]:
    return {"input_tokens": len(answer.prompt_ids), "output_tokens": len(answer.completion_ids),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def anthropic_body(answer: Answer, message_id: str) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": answer.model,
            "content": _anthropic_blocks(answer), "stop_reason": _anthropic_stop(answer), "stop_sequence": None,
            "usage": _anthropic_usage(answer), TOKENS_KEY: answer.tokens()}


def anthropic_events(answer: Answer, message_id: str) -> Iterator[bytes]:
    usage = _anthropic_usage(answer)
    yield sse("message_start", {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": answer.model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 0}}})
    for index, block in enumerate(_anthropic_blocks(answer)):
        kind = block["type"]
        if kind == "thinking":
            start, deltas = {"type": "thinking", "thinking": "", "signature": ""}, [
                {"type": "thinking_delta", "thinking": piece} for piece in _pieces(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": ""})
        elif kind == "text":
            start, deltas = {"type": "text", "text": ""}, [
                {"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": piece}
                      for piece in _pieces(json.dumps(block["input"], ensure_ascii=False))]
        yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
        for delta in deltas:
            yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield sse("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": _anthropic_stop(answer), "stop_sequence": None,
                                          TOKENS_KEY: answer.tokens()},
                                "usage": {"output_tokens": usage["output_tokens"]}})
    yield sse("message_stop", {"type": "message_stop"})


# -- OpenAI Responses -------------------------------------------------------------

def _responses_items(answer: Answer) -> list[dict[str, Any]]:
    turn = answer.turn
    items: list[dict[str, Any]] = []
    if turn.reasoning:
        items.append({"type": "reasoning", "id": new_id("rs_"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": turn.reasoning}]})
    if turn.text:
        items.append({"type": "message", "id": new_id("msg_"), "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": turn.text, "annotations": []}]})
    for call, call_id in zip(turn.tool_calls, answer.call_ids):
        items.append({"type": "function_call", "id": new_id("fc_"), "call_id": call_id, "name": call.name,
                      "arguments": call.arguments_json(), "status": "completed"})
    return items


def responses_body(answer: Answer, response_id: str, created: int, request: dict[str, Any]) -> dict[str, Any]:
    incomplete = answer.finish_reason == "length"
    return {"id": response_id, "object": "response", "created_at": created, "model": answer.model,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
            "output": _responses_items(answer), "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools", []),
            "usage": {"input_tokens": len(answer.prompt_ids), "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": len(answer.completion_ids),
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": len(answer.prompt_ids) + len(answer.completion_ids)},
            TOKENS_KEY: answer.tokens()}


def responses_events(answer: Answer, response_id: str, request: dict[str, Any]) -> Iterator[bytes]:
    created = int(time.time())
    final = responses_body(answer, response_id, created, request)
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> bytes:
        return sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    shell = {key: value for key, value in final.items() if key not in ("output", "usage", TOKENS_KEY)}
    shell.update(status="in_progress", incomplete_details=None, output=[], usage=None)
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    for index, item in enumerate(final["output"]):
        kind, item_id = item["type"], item["id"]
        if kind == "message":
            text = item["content"][0]["text"]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part)
            for piece in _pieces(text):
                yield event("response.output_text.delta", item_id=item_id, output_index=index, content_index=0,
                            delta=piece, logprobs=[])
            yield event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                        text=text, logprobs=[])
            yield event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                        part={**part, "text": text})
        elif kind == "function_call":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
            for piece in _pieces(item["arguments"]):
                yield event("response.function_call_arguments.delta", item_id=item_id, output_index=index,
                            delta=piece)
            yield event("response.function_call_arguments.done", item_id=item_id, output_index=index,
                        arguments=item["arguments"])
        else:  # reasoning: announced and finished whole
            yield event("response.output_item.added", output_index=index, item={**item, "content": []})
        yield event("response.output_item.done", output_index=index, item=item)
    terminal = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(terminal, response=final)


# -- OpenAI Chat Completions (vLLM's own token fields) -------------------------------

def _chat_finish(answer: Answer) -> str:
    if answer.finish_reason == "length":
        return "length"
    return "tool_calls" if answer.turn.tool_calls else "stop"


def _chat_calls(answer: Answer) -> list[dict[str, Any]]:
    return [{"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}
            for call, call_id in zip(answer.turn.tool_calls, answer.call_ids)]


def _chat_logprobs(answer: Answer) -> dict[str, Any] | None:
    if answer.logprobs is None:
        return None
    return {"content": [{"token": f"token_id:{token}", "logprob": value, "bytes": None, "top_logprobs": []}
                        for token, value in zip(answer.completion_ids, answer.logprobs)]}


def _chat_usage(answer: Answer) -> dict[str, Any]:
    return {"prompt_tokens": len(answer.prompt_ids), "completion_tokens": len(answer.completion_ids),
            "total_tokens": len(answer.prompt_ids) + len(answer.completion_ids)}


def chat_body(answer: Answer, completion_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.turn.text or None}
    if answer.turn.reasoning:
        message["reasoning_content"] = answer.turn.reasoning
    if answer.turn.tool_calls:
        message["tool_calls"] = _chat_calls(answer)
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": answer.model,
            "choices": [{"index": 0, "message": message, "finish_reason": _chat_finish(answer),
                         "logprobs": _chat_logprobs(answer), "token_ids": answer.completion_ids}],
            "usage": _chat_usage(answer), "prompt_token_ids": answer.prompt_ids,
            TOKENS_KEY: {"policy_version": answer.policy_version}}


def chat_events(answer: Answer, completion_id: str, include_usage: bool) -> Iterator[bytes]:
    head = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": answer.model}

    def chunk(delta: dict[str, Any], **fields: Any) -> bytes:
        return sse(None, {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None, **fields}]})

    yield sse(None, {**head, "prompt_token_ids": answer.prompt_ids,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    for piece in _pieces(answer.turn.reasoning or ""):
        yield chunk({"reasoning_content": piece})
    for piece in _pieces(answer.turn.text):
        yield chunk({"content": piece})
    for index, call in enumerate(_chat_calls(answer)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, finish_reason=_chat_finish(answer), logprobs=_chat_logprobs(answer),
                token_ids=answer.completion_ids)
    if include_usage:
        yield sse(None, {**head, "choices": [], "usage": _chat_usage(answer)})
    yield b"data: [DONE]\n\n"
