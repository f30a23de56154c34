"""Loss spans are checked before training: each equals an assistant turn's content and ends in its end-of-turn token.

A mask shifted by one token, or one that covers a tool result, trains the
model on the wrong tokens while every loss still falls, so a torch engine
refuses such a shard before its first step. The turn markers come from the
tokenizer's own chat template (`ChatMarkers.of`), not from a list of known
models: the token opening every turn and the assistant header are the
generation prompt's, the end-of-turn token is what the template writes after
a message. A loss span must start right after an assistant header (any
generation prompt the template renders, e.g. Qwen3's with `enable_thinking`
off, which holds an empty `<think>` block: engine-path rows keep the generation
prompt as context) and end at that turn's end-of-turn token; template-path
rows, cut as veRL's `MultiTurnSFTDataset` cuts them, also train what the
template writes after it (Qwen's newline), and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from forgerl.errors import UserError

PROBE = "forgerl-probe"


class ShardError(UserError):
    """A shard whose loss spans are not the assistant turns: one line, exit 2."""


@dataclass(frozen=True)
class ChatMarkers:
    start: int  # the token opening every turn (`<|im_start|>`)
    end: int  # the end-of-turn token (`<|im_end|>`)
    after_end: tuple[int, ...]  # what the template renders after it (Qwen: "\n")
    headers: tuple[tuple[int, ...], ...]  # the generation prompts: a loss span starts right after one
    decode: Callable[[list[int]], str]

    @classmethod
    def of(cls, tokenizer: Any) -> ChatMarkers:
        """The markers of `tokenizer`'s chat template (a transformers tokenizer or the converters' `LocalTokenizer`)."""
        def encode(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        user = tokenizer.apply_chat_template([{"role": "user", "content": PROBE}], tokenize=False)
        after = encode(user.split(PROBE)[-1])
        headers = []
        for kwargs in ({}, {"enable_thinking": False}):
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROBE}], tokenize=False,
                                                   add_generation_prompt=True, **kwargs)
            header = encode(prompt[len(user):]) if prompt.startswith(user) else ()
            if header and header not in headers:
                headers.append(header)
        if not after or not headers or len({h[0] for h in headers}) != 1:
            raise ShardError("the tokenizer's chat template has no turn markers this check can find "
                             "(an end-of-turn token after a message and a generation prompt)")
        return cls(headers[0][0], after[0], after[1:], tuple(headers),
                   lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False))


def first_bad(ids: Any, mask: Any, markers: ChatMarkers) -> tuple[int, str] | None:
    """The first position where `mask` is not exactly the assistant turns' content, and why; None when it is."""
    ids, on = np.asarray(ids), np.asarray(mask) > 0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], on.astype(np.int8), [0]])))
    turns, ends = np.flatnonzero(ids == markers.start), np.flatnonzero(ids == markers.end)
    for a, b in zip(edges[::2].tolist(), edges[1::2].tolist()):
        k = int(np.searchsorted(turns, a)) - 1
        if k < 0:
            return a, "loss before the first turn"
        s = int(turns[k])
        if not any(s + len(h) == a and tuple(ids[s:a].tolist()) == h for h in markers.headers):
            return a, (f"loss starts inside the turn at position {s} ({markers.decode(ids[s:s + 4])!r}...), "
                       f"not where an assistant turn's content starts")
        j = int(np.searchsorted(ends, a))
        e = int(ends[j]) if j < len(ends) else len(ids)
        following = turns[k + 1] if k + 1 < len(turns) else len(ids)
        if following < e:
            return int(following), "loss runs into the next turn before its end-of-turn token"
        if e == len(ids):
            return a, "the assistant turn has no end-of-turn token"
        if b <= e:
            return b, "loss ends before the turn's end-of-turn token"
        tail = tuple(ids[e + 1:b].tolist())
        if tail and tail != markers.after_end:
            kept = len(markers.after_end) if tail[:len(markers.after_end)] == markers.after_end else 0
            return e + 1 + kept, "loss goes on past the turn's end-of-turn token"
    return None


def check_loss_spans(rows: Iterable[tuple[str, Any, Any]], markers: ChatMarkers) -> int:
    """Refuse the first row (`where`, ids, loss mask) whose loss spans are not its assistant turns; the rows
    checked."""
    n = 0
    for where, ids, mask in rows:
        bad = first_bad(ids, mask, markers)
        if bad is not None:
            position, why = bad
            raise ShardError(f"{where}: {why} (position {position}): loss must cover exactly the assistant turns, "
                             f"each ending in {markers.decode([markers.end])}; the shard is refused")
        n += 1
    return n
