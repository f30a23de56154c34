"""Token ids and loss masks for samples: engine ids verbatim, else the chat template.

Engine path (every call of the sample carries `prompt_token_ids` and
`completion_token_ids`): the ids the model really saw and wrote. A thread is
the first call's prompt + completion, then each later call's prompt suffix
(context, no loss) + completion (loss). A stored segment never holds a call
whose prompt does not extend the ids before it: the segmenter cuts there
(`token_break`, `forgerl.schema.segments`), so SFT rows, token rows and RL
samples are cut the same way.

Template path (`retokenized`): thread samples are rendered exactly as veRL's
`MultiTurnSFTDataset` does (each message on its own, system prompt stripped
from later ones, loss on assistant messages minus the generation prompt), and
`template_consistent` says whether that equals rendering the whole
conversation at once (veRL's sanity check). Per-call samples are the prompt
with the generation prompt, then the rest of the full render.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from forgerl.schema.chat import chat_tools, to_chat_messages

from .samples import Sample
from .tokenizer import PieceEncoder
from .vision import SampleImages, verl_content


@dataclass
class TokenSample:
    sample: Sample
    input_ids: list[int] | np.ndarray  # numpy from engine ids, lists from the template
    loss_mask: list[int] | np.ndarray
    logprobs: list[float | None] | np.ndarray | None  # NaN in an array = no logprob recorded
    retokenized: bool
    template_consistent: bool | None
    whole_ids: list[int] | None = None  # the whole-conversation render, kept when it differs


class Renderer:
    """The chat template with veRL's conventions, cached per distinct input."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self._text = lru_cache(maxsize=512)(self._render)  # keys and texts hold whole tool lists: bounded
        self.pieces = PieceEncoder(tokenizer.backend_tokenizer)
        empty = [{"role": "user", "content": ""}]
        one, two = self.ids(empty), self.ids(empty * 2)
        self.system_prompt = one[: len(one) - (len(two) - len(one))]
        self.generation_prompt = self.ids(empty, generation=True)[len(one):]

    def _render(self, key: str, generation: bool, enable_thinking: bool | None) -> str:
        messages, tools = json.loads(key)
        kwargs = dict(self.kwargs)
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation, **kwargs)

    def text(self, messages: list[dict], tools: list[dict] | None, generation: bool = False,
             enable_thinking: bool | None = None) -> str:
        key = json.dumps([messages, tools or None], ensure_ascii=False, separators=(",", ":"))  # key order kept
        return self._text(key, generation, enable_thinking)

    def ids(self, messages: list[dict], tools: list[dict] | None = None, generation: bool = False,
            enable_thinking: bool | None = None) -> list[int]:
        return self.encode([self.text(messages, tools, generation, enable_thinking)])[0]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [self.pieces.encode(text) for text in texts]


def has_engine_ids(sample: Sample) -> bool:
    return all(c.engine_ids is not None for c in sample.calls)


def engine_tokens(sample: Sample) -> TokenSample:
    """The recorded ids of the segment's calls, each later prompt's new tail as context.

    Ids, mask and logprobs are numpy arrays (NaN where no logprob was recorded): the ids are the
    engine's, so nothing here needs them as Python ints.
    """
    pieces: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    trained: list[bool] = []
    length = 0
    for call in sample.calls:
        prompt, completion = call.engine_ids
        if len(prompt) < length:
            raise RuntimeError(f"segment {sample.segment.segment_id}: call {call.row['call_id']}'s prompt is shorter "
                               "than the ids before it; the stored segment contradicts its token ids")
        new = prompt[length:]
        recorded = call.row.get("completion_logprobs")
        pieces += [new, completion]
        trained += [False, True]
        scores += [np.full(len(new), np.nan, np.float32),
                   recorded.astype(np.float32, copy=False) if recorded is not None and len(recorded) == len(completion)
                   else np.full(len(completion), np.nan, np.float32)]
        length += len(new) + len(completion)
    ids = np.concatenate(pieces).astype(np.int32, copy=False)
    mask = np.repeat(np.array(trained, np.int8), [len(p) for p in pieces])
    logprobs = np.concatenate(scores)
    return TokenSample(sample, ids, mask, None if np.isnan(logprobs).all() else logprobs, False, None)


def chat_of(sample: Sample) -> tuple[list[dict], list[tuple[int, int]]]:
    """The sample's chat dicts, and for each canonical message its [start, end) range among them."""
    chat: list[dict] = []
    ranges = []
    for message in sample.messages:
        start = len(chat)
        chat.extend(to_chat_messages([message], arguments="json"))
        ranges.append((start, len(chat)))
    return chat, ranges


def verl_style(renderer: Renderer, chat: list[dict], tools: list[dict] | None, enable_thinking: bool,
               trained_chat: set[int], images: SampleImages | None = None) -> tuple[list[int], list[int], list[int]]:
    """Ids and loss mask as veRL's MultiTurnSFTDataset builds them, and the whole render (its sanity check);
    with `images`, messages in veRL's image-content form and each image pad expanded as its processor does."""
    if images is not None:
        chat = verl_content(chat)
    texts = [renderer.text([m], tools if i == 0 else None, False, enable_thinking) for i, m in enumerate(chat)]
    texts.append(renderer.text(chat, tools, False, enable_thinking))
    encoded = renderer.encode(texts)
    whole = encoded.pop()
    if images is not None:
        counts = iter(images.counts)
        encoded = [images.expand(piece, counts) for piece in encoded]
        whole = images.expand(whole)
    ids: list[int] = []
    mask: list[int] = []
    sys_len, gen_len = len(renderer.system_prompt), len(renderer.generation_prompt)
    for i, (message, piece) in enumerate(zip(chat, encoded)):
        if i != 0 and message["role"] != "system":
            piece = piece[sys_len:]
        ids += piece
        if message["role"] == "assistant" and i in trained_chat:
            mask += [0] * min(gen_len, len(piece)) + [1] * max(0, len(piece) - gen_len)
        else:
            mask += [0] * len(piece)
    return ids, mask, whole


def template_tokens(renderer: Renderer, sample: Sample, images: SampleImages | None = None) -> TokenSample:
    """The template's ids; with `images` (a VL tokenizer's pad counts) image placeholders become pads."""
    chat, ranges = chat_of(sample)
    tools = chat_tools(sample.tools) or None
    thinking = sample.enable_thinking
    trained_chat = {j for i in sample.trained for j in range(*ranges[i])}
    if sample.mode == "thread":
        ids, mask, whole = verl_style(renderer, chat, tools, thinking, trained_chat, images)
        return TokenSample(sample, ids, mask, None, True, ids == whole, None if ids == whole else whole)
    first_out = min(sample.trained)
    shown = verl_content(chat) if images is not None else chat
    prompt = renderer.text(shown[: ranges[first_out][0]], tools, True, thinking)
    full = renderer.text(shown, tools, False, thinking)
    if full.startswith(prompt):
        prompt_ids, completion_ids, whole = renderer.encode([prompt, full[len(prompt):], full])
        if images is not None:
            counts = iter(images.counts)
            prompt_ids, completion_ids = images.expand(prompt_ids, counts), images.expand(completion_ids, counts)
            whole = images.expand(whole)
    else:  # the template renders the history differently once the answer follows: veRL's way, flagged
        ids, mask, whole = verl_style(renderer, chat, tools, thinking, trained_chat, images)
        return TokenSample(sample, ids, mask, None, True, ids == whole, None if ids == whole else whole)
    ids = prompt_ids + completion_ids
    return TokenSample(sample, ids, [0] * len(prompt_ids) + [1] * len(completion_ids), None, True,
                       ids == whole, None if ids == whole else whole)


def tokenize(renderer: Renderer | None, sample: Sample, prefer_engine: bool = True,
             images: SampleImages | None = None) -> TokenSample | None:
    """Engine ids when every call has them (and they are preferred), else the template; None without one."""
    if prefer_engine and has_engine_ids(sample):
        return engine_tokens(sample)
    return template_tokens(renderer, sample, images) if renderer is not None else None


def token_row(ts: TokenSample) -> dict[str, Any]:
    s = ts.sample
    prov = s.provenance()
    return {
        "sample_id": s.sample_id,
        **{k: prov[k] for k in ("session_id", "segment_id", "segment_index", "segment_reason", "parent_segment",
                                "parent_position", "mode", "harness", "model", "api", "policy_version",
                                "call_ids")},
        "input_ids": ts.input_ids,
        "loss_mask": ts.loss_mask,
        "response_mask": ts.loss_mask,
        "logprobs": ts.logprobs,
        "reward": s.session.reward,
        "retokenized": ts.retokenized,
        "template_consistent": ts.template_consistent,
        "images": s.images,
        "num_tokens": len(ts.input_ids),
        "num_turns": s.turns,
    }

