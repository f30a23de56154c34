"""Serve mode for image-bearing prompts: a VL policy's own chat endpoint renders them.

Token-in generation (`/v1/completions` with prompt ids) cannot carry pixels, so a call whose input holds
images goes to the policy's vLLM-protocol chat endpoint instead (`/v1/chat/completions`, with
`return_token_ids`): the messages in OpenAI chat form, each image a data URL in its place, the tools
offered. vLLM renders the template and expands each image into its image tokens itself, and returns the
prompt ids it used and the completion ids; the gateway parses the completion as it parses any other
(`TurnParser`), the codec writes the answer in the harness's API, and the recorder stores both id lists.
The engine renders such a prompt afresh on every call: it continues an earlier answer (one segment,
one token sequence) only where its ids extend that answer's, and `forge-convert`'s drift report says
where a re-render of the recorded input differs from the ids the engine used. Only an HTTP policy
(`--policy URL`) has a chat endpoint.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import aiohttp
from aiohttp import web

from forgerl.schema.chat import chat_tools, image_parts, to_chat_messages
from forgerl.schema.messages import Exchange, Part, Usage
from forgerl.schema.toolcalls import ParsedTurn, TurnParser

from .apis.answer import Answer, new_id
from .detokenize import Detokenizer
from .policy import Delta, Generation, PolicyError, Sampling
from .serve import Prompt, PromptBuilder, Turn, _error, _prefix_keys, _send, _streamed

_MARK = "\x00forgerl-image\x00"  # stands for an image while the chat messages are built


def has_images(exchange: Exchange) -> bool:
    return bool(image_parts(exchange.input))


def _image_item(part: Part, blobs: dict[str, bytes]) -> dict[str, Any]:
    data = blobs.get(part.blob_hash or "")
    url = f"data:{part.media_type};base64,{base64.b64encode(data).decode()}" if data else part.url
    return {"type": "image_url", "image_url": {"url": url}}


def policy_messages(exchange: Exchange) -> list[dict[str, Any]]:
    """The chat messages with each image an `image_url` item in its place (text around it as text items)."""
    images = iter(_image_item(part, exchange.blobs) for part in image_parts(exchange.input))
    out = []
    for message in to_chat_messages(exchange.input, image_placeholder=_MARK):
        content = message.get("content")
        if isinstance(content, str) and _MARK in content:
            items: list[dict[str, Any]] = []
            for n, piece in enumerate(content.split(_MARK)):
                if n:
                    items.append(next(images))
                if piece:
                    items.append({"type": "text", "text": piece})
            message = {**message, "content": items}
        out.append(message)
    return out


async def chat_generate(url: str, served_model: str, messages: list[dict[str, Any]],
                        tools: list[dict[str, Any]] | None, sampling: Sampling) -> tuple[list[int], Generation]:
    """One chat completion from a vLLM-protocol server: (prompt ids, generation)."""
    body = {"model": served_model, "messages": messages, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "logprobs": True,
            "return_token_ids": True, "skip_special_tokens": False, **sampling.extra}
    if tools:
        body["tools"] = tools
    try:
        async with aiohttp.ClientSession() as session, \
                session.post(f"{url.rstrip('/')}/v1/chat/completions", json=body) as response:
            data = await response.json(content_type=None)
            if response.status != 200:
                raise PolicyError(f"policy chat endpoint answered {response.status}: {str(data)[:300]}")
    except (aiohttp.ClientError, ValueError) as e:
        raise PolicyError(f"policy chat endpoint {url}: {e}") from e
    choice = (data.get("choices") or [{}])[0]
    prompt_ids, token_ids = data.get("prompt_token_ids"), choice.get("token_ids")
    if not isinstance(prompt_ids, list) or not isinstance(token_ids, list):
        raise PolicyError(f"policy chat endpoint {url} returned no token ids (vLLM's return_token_ids)")
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = [entry["logprob"] for entry in content] if content and len(content) == len(token_ids) else None
    return prompt_ids, Generation(token_ids, logprobs, choice.get("finish_reason"))


def _continues(prompts: PromptBuilder, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               prompt_ids: list[int]) -> str | None:
    """The earlier answer this prompt continues: its history repeats that answer's conversation and the
    engine's ids extend that answer's ids (the engine rendered the prompt itself, so both are checked)."""
    keys = _prefix_keys(messages, tools)
    for k in range(len(messages), 0, -1):
        known = prompts._known.get(keys[k])
        if known is not None:
            ids, answer_id = known
            return answer_id if prompt_ids[:len(ids)] == ids else None
    return None


async def answer(gateway: Any, request: web.Request, codec: Any, exchange: Exchange,
                 body: dict[str, Any]) -> web.StreamResponse:
    """The gateway's answer to an image-bearing call (`PolicyGateway` hands such calls here)."""
    url = getattr(gateway.policy, "url", None)
    if url is None:
        return _error(400, "this call holds images: serve mode sends them to a vLLM-protocol chat endpoint, "
                           "which needs --policy URL")
    messages, tools = to_chat_messages(exchange.input), chat_tools(exchange.tools) or None
    sampling = gateway._sampling(exchange.params)
    try:
        prompt_ids, generation = await chat_generate(url, gateway.served_model, policy_messages(exchange), tools,
                                                     sampling)
    except PolicyError as e:
        return _error(502, str(e))
    head = Answer(id=new_id(), model=exchange.model_requested or gateway.served_model, turn=ParsedTurn(None, "", ()),
                  call_ids=(), usage=Usage(input_tokens=len(prompt_ids), output_tokens=0, cache_read_tokens=0,
                                           cache_write_tokens=0),
                  created=int(time.time()), prompt_token_ids=prompt_ids)
    turn = Turn(head, messages, tools, Prompt(prompt_ids, _continues(gateway.prompts, messages, tools, prompt_ids)),
                sampling,
                "toolu_" if codec.name == "anthropic" else "call_",
                TurnParser(gateway.fmt, tools, in_reasoning=gateway._opens_reasoning(prompt_ids)),
                Detokenizer(gateway.tokenizer), gateway.prompts.eos_id)
    events = turn.add(Delta(generation.token_ids, generation.logprobs, generation.finish_reason))
    if not _streamed(codec, request.path, body):
        return web.json_response(codec.render_response(gateway._finish(turn), body), headers=turn.prompt.headers())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **turn.prompt.headers()})
    await response.prepare(request)
    writer = codec.stream_writer(turn.head, body)
    frames = writer.start() + turn.tell(writer, events) + turn.tell(writer, turn.end())
    await _send(response, frames + writer.finish(gateway._finish(turn)))
    await response.write_eof()
    return response
