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

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from forgerl.schema.chat import chat_tools, to_chat_messages
from forgerl.schema.segments import joined_ids

from .samples import Sample
from .tokenizer import PieceEncoder
from .vision import SampleImages, verl_content


@dataclass
class TokenSample:
    sample: Sample
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # int8
    logprobs: np.ndarray | None  # float32, NaN = no logprob recorded
    retokenized: bool
    template_consistent: bool | None
    whole_ids: np.ndarray | None = None  # the whole-conversation render, kept when it differs


class Renderer:
    """The chat template with veRL's conventions, its output tokenized piece by piece (`PieceEncoder`).

    A message rendered on its own (veRL renders each turn so) is rendered and encoded once per run: a
    harness resends its system prompt and tool schemas in every session (Claude Code's are ~17k tokens),
    and segments that share history share its messages.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None,
                 alone_ids: int = 4 << 20):
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self.pieces = PieceEncoder(tokenizer.backend_tokenizer)
        # least recently used first, bounded by the ids held (int32: 16 MB by default)
        self._alone: OrderedDict[tuple[str, str, bool], np.ndarray] = OrderedDict()
        self._alone_size, self.alone_ids = 0, alone_ids
        self._tools: OrderedDict[int, tuple[list[dict], list[dict] | None, str]] = OrderedDict()
        empty = [{"role": "user", "content": ""}]
        one, two = self.ids(empty), self.ids(empty * 2)
        self.system_prompt = one[: len(one) - (len(two) - len(one))]
        self.generation_prompt = self.ids(empty, generation=True)[len(one):]

    def text(self, messages: list[dict], tools: list[dict] | None, generation: bool = False,
             enable_thinking: bool | None = None) -> str:
        kwargs = dict(self.kwargs)
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation, **kwargs)

    def ids(self, messages: list[dict], tools: list[dict] | None = None, generation: bool = False,
            enable_thinking: bool | None = None) -> np.ndarray:
        return self.encode(self.text(messages, tools, generation, enable_thinking))

    def encode(self, text: str) -> np.ndarray:
        return self.pieces.encode(text)

    def chat_tools(self, tools: list[dict[str, Any]]) -> tuple[list[dict] | None, str]:
        """`chat_tools` of a sample's tool list, and a key for its content, once per list: the source parses each
        distinct tools text once and hands out the same list (this holds it, so its id is not reused)."""
        hit = self._tools.get(id(tools))
        if hit is not None and hit[0] is tools:
            return hit[1], hit[2]
        shown = chat_tools(tools) or None
        self._tools[id(tools)] = (tools, shown, repr(shown))
        while len(self._tools) > 64:
            self._tools.popitem(last=False)
        return shown, self._tools[id(tools)][2]

    def alone(self, message: dict, tools: tuple[list[dict] | None, str], enable_thinking: bool) -> np.ndarray:
        """One message rendered on its own with `tools` (`chat_tools`' pair), as veRL renders each turn (read-only)."""
        key = (repr(message), tools[1], enable_thinking)  # repr: content, key order, types, at half json.dumps' cost
        ids = self._alone.get(key)
        if ids is not None:
            self._alone.move_to_end(key)
            return ids
        ids = self.ids([message], tools[0], False, enable_thinking)
        ids.flags.writeable = False
        if len(ids) <= self.alone_ids // 4:
            self._alone[key] = ids
            self._alone_size += len(ids)
            while self._alone_size > self.alone_ids:
                self._alone_size -= len(self._alone.popitem(last=False)[1])
        return ids


_NO_TOOLS: tuple[None, str] = (None, repr(None))


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
    joined = joined_ids(((call.row["call_id"], *call.engine_ids) for call in sample.calls), sample.segment.segment_id)
    for call, (new, completion) in zip(sample.calls, joined):
        recorded = call.row.get("completion_logprobs")
        pieces += [new, completion]
        trained += [False, True]
        scores += [np.full(len(new), np.nan, np.float32),
                   recorded.astype(np.float32, copy=False) if recorded is not None and len(recorded) == len(completion)
                   else np.full(len(completion), np.nan, np.float32)]
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


def verl_style(renderer: Renderer, chat: list[dict], tools: tuple[list[dict] | None, str], enable_thinking: bool,
               trained_chat: set[int], images: SampleImages | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids and loss mask as veRL's MultiTurnSFTDataset builds them, and the whole render (its sanity check);
    `tools` is `Renderer.chat_tools`' pair. With `images`, messages in veRL's image-content form and each
    image pad expanded as its processor does."""
    if images is not None:
        chat = verl_content(chat)
    encoded = [renderer.alone(m, tools if i == 0 else _NO_TOOLS, enable_thinking) for i, m in enumerate(chat)]
    whole = renderer.ids(chat, tools[0], False, enable_thinking)
    if images is not None:
        counts = iter(images.counts)
        encoded = [_expand(images, piece, counts) for piece in encoded]
        whole = _expand(images, whole)
    sys_len, gen_len = len(renderer.system_prompt), len(renderer.generation_prompt)
    pieces = [piece if i == 0 or message["role"] == "system" else piece[sys_len:]
              for i, (message, piece) in enumerate(zip(chat, encoded))]
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    mask = np.zeros(len(ids), np.int8)
    start = 0
    for i, (message, piece) in enumerate(zip(chat, pieces)):
        if message["role"] == "assistant" and i in trained_chat:
            mask[start + min(gen_len, len(piece)): start + len(piece)] = 1
        start += len(piece)
    return ids, mask, whole


def _expand(images: SampleImages, ids: np.ndarray, counts: Iterator[int] | None = None) -> np.ndarray:
    return np.asarray(images.expand(ids.tolist(), counts), np.int32)


def _rendered(sample: Sample, ids: np.ndarray, mask: np.ndarray, whole: np.ndarray) -> TokenSample:
    same = np.array_equal(ids, whole)
    return TokenSample(sample, ids, mask, None, True, same, None if same else whole)


def template_tokens(renderer: Renderer, sample: Sample, images: SampleImages | None = None) -> TokenSample:
    """The template's ids; with `images` (a VL tokenizer's pad counts) image placeholders become pads."""
    chat, ranges = chat_of(sample)
    tools = renderer.chat_tools(sample.tools)
    thinking = sample.enable_thinking
    trained_chat = {j for i in sample.trained for j in range(*ranges[i])}
    if sample.mode == "thread":
        return _rendered(sample, *verl_style(renderer, chat, tools, thinking, trained_chat, images))
    first_out = min(sample.trained)
    shown = verl_content(chat) if images is not None else chat
    prompt = renderer.text(shown[: ranges[first_out][0]], tools[0], True, thinking)
    full = renderer.text(shown, tools[0], False, thinking)
    if not full.startswith(prompt):  # the template renders the history otherwise once the answer follows:
        return _rendered(sample, *verl_style(renderer, chat, tools, thinking, trained_chat, images))  # veRL's way
    prompt_ids, completion_ids = renderer.encode(prompt), renderer.encode(full[len(prompt):])
    whole = renderer.encode(full)
    if images is not None:
        counts = iter(images.counts)
        prompt_ids, completion_ids = _expand(images, prompt_ids, counts), _expand(images, completion_ids, counts)
        whole = _expand(images, whole)
    mask = np.zeros(len(prompt_ids) + len(completion_ids), np.int8)
    mask[len(prompt_ids):] = 1
    return _rendered(sample, np.concatenate([prompt_ids, completion_ids]), mask, whole)


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

