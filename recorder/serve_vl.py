"""Serve mode for image-bearing prompts: a generator on the VL policy's own chat endpoint.

Token-in generation (`/v1/completions` with prompt ids) cannot carry pixels, so the gateway hands a call whose
input holds images to `ChatGenerator` instead: the messages go to the policy's vLLM-protocol chat endpoint
(`ChatPolicy.chat`: `/v1/chat/completions` with `return_token_ids`) in OpenAI chat form, each image a data URL
in its place, the tools offered. vLLM renders the template and expands each image into its image tokens itself,
and returns the prompt ids it used and the completion ids; the gateway parses, writes and finishes that turn as
it does any other, and the recorder stores both id lists. The engine renders such a prompt afresh on every call:
it continues an earlier answer (one segment, one token sequence) only where its ids extend that answer's, and
`forge-convert`'s drift report says where a re-render of the recorded input differs from the ids the engine
used. Only an HTTP policy (`--policy URL`) has a chat endpoint.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from forgerl.schema.chat import image_parts, to_chat_messages
from forgerl.schema.messages import Exchange, Part

from .generate import Call, Prompt, PromptBuilder, Started
from .policy import ChatPolicy, Delta

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


class ChatGenerator:
    """The policy's chat endpoint renders the prompt (images and all) and generates; its ids are the prompt's."""

    def __init__(self, policy: ChatPolicy, prompts: PromptBuilder):
        self.policy = policy
        self.prompts = prompts

    async def start(self, call: Call) -> Started:
        prompt_ids, generation = await self.policy.chat(policy_messages(call.exchange), call.tools, call.sampling)
        prompt = Prompt(prompt_ids, self.prompts.continued(call.messages, call.tools, prompt_ids))
        return Started(prompt, _once(generation.delta()))


async def _once(delta: Delta) -> AsyncIterator[Delta]:
    yield delta
