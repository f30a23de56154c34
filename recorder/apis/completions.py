"""OpenAI legacy Completions (`POST /v1/completions`): the token-in / token-out door of vLLM and similar servers.

A prompt is raw text or token ids, not a conversation, so the input is ONE
"user" message whose parts are the prompts:

- a string prompt → a text part;
- a token-id prompt → an "other" part with extra `{"token_ids": [...]}` (a
  single one is also copied to `Exchange.prompt_token_ids`, until the
  response's own `prompt_token_ids` replace it);
- a single prompt (a string or one id list) carries the hint
  `single_prompt`; a batch (a list of strings or of id lists) has one part
  per prompt, in order.

The output is one assistant message (a text part) per choice. With
`echo: true` a choice's text starts with the prompt, as the server sent it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from forgerl.recorder.apis.answer import Answer, Frame, Pieces, chunks
from forgerl.recorder.apis.common import (HINTS, ChoiceStream, ChoiceWriter, Fragments, fill_from_choices,
                                          params_without, split_extra)
from forgerl.schema.messages import Exchange, Message, Part


class CompletionsCodec:
    name = "completions"

    def parse_request(self, body: dict[str, Any]) -> Exchange:
        exchange = Exchange(model_requested=body.get("model"))
        found = _prompts(body.get("prompt"))
        if found is not None:
            prompts, single = found
            parts = tuple(_prompt_part(prompt) for prompt in prompts)
            exchange.input = [Message("user", parts, {HINTS: {"single_prompt": True}} if single else None)]
            if single and not isinstance(prompts[0], str):
                exchange.prompt_token_ids = list(prompts[0])
        exchange.params = params_without(body, ["prompt"] if found is not None else [])
        return exchange

    def render_request(self, exchange: Exchange, blobs: Mapping[str, bytes]) -> dict[str, Any]:
        body = dict(exchange.params)
        if exchange.input:
            message = exchange.input[0]
            prompts = [part.text if part.type == "text" else (part.extra or {}).get("token_ids")
                       for part in message.parts]
            single = split_extra(message.extra)[1].get("single_prompt") and len(prompts) == 1
            body["prompt"] = prompts[0] if single else prompts
        return body

    def new_stream(self) -> CompletionsStream:
        return CompletionsStream()

    def parse_response(self, body: dict[str, Any], exchange: Exchange) -> None:
        fill_from_choices(body, exchange, _choice_message, _logprobs)

    def render_response(self, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of `parse_response`: the answer's text as a `text_completion` (it has no reasoning
        or tool calls to say)."""
        return _writer(answer, request).body(text=answer.turn.text)

    def render_stream(self, answer: Answer, request: Mapping[str, Any], pieces: Pieces = chunks) -> Iterator[Frame]:
        """The inverse of `CompletionsStream`."""
        writer = _writer(answer, request)
        for piece in pieces(answer.turn.text):
            yield writer.chunk(True, text=piece)
        yield from writer.end(text="")


def _writer(answer: Answer, request: Mapping[str, Any]) -> ChoiceWriter:
    logprobs = None
    if answer.completion_logprobs is not None:  # vLLM's form for token-id answers (return_tokens_as_token_ids)
        logprobs = {"tokens": [f"token_id:{token}" for token in answer.completion_token_ids or ()],
                    "token_logprobs": list(answer.completion_logprobs), "top_logprobs": None}
    return ChoiceWriter(answer, request, "cmpl-", ("text_completion", "text_completion"),
                        "length" if answer.truncated else "stop", logprobs, prompt_on_choice=True)


def _prompts(prompt: Any) -> tuple[list[str | list[int]], bool] | None:
    """(the prompts, whether one was sent bare), or None for a shape left in params."""
    if isinstance(prompt, str) or _is_token_ids(prompt):
        return [prompt], True
    if isinstance(prompt, list) and prompt and all(isinstance(entry, str) or _is_token_ids(entry) for entry in prompt):
        return prompt, False
    return None


def _is_token_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(entry, int) and not isinstance(entry, bool) for entry in value))


def _prompt_part(prompt: str | list[int]) -> Part:
    if isinstance(prompt, str):
        return Part("text", text=prompt)
    return Part("other", extra={"token_ids": list(prompt)})


def _choice_message(choice: dict[str, Any]) -> Message:
    text = choice.get("text")
    return Message("assistant", (Part("text", text=text),) if isinstance(text, str) else ())


def _logprobs(logprobs: Any) -> list[float] | None:
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    return values if isinstance(values, list) else None


class CompletionsStream(ChoiceStream):
    """Reassembles `text_completion` chunks: each choice's `text` deltas concatenate."""

    body_object = "text_completion"
    delta_key = "text"

    def __init__(self) -> None:
        super().__init__()
        self._text = Fragments()

    def feed_delta(self, index: int, delta: Any) -> None:
        self._text.add(index, delta)
        if isinstance(delta, str) and delta:
            self.first_token_seen = True

    def built_choice(self, index: int, fields: dict[str, Any]) -> dict[str, Any]:
        return {**fields, "text": self._text.get(index) or ""}


CODEC = CompletionsCodec()
