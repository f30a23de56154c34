"""The drift report: where the chat template disagrees with the tokens the engine used.

Three checks, each counted with where the first difference sits:

- `prompt_rerender`: a call's engine `prompt_token_ids` vs rendering its input
  with the template (+ generation prompt): does the template reproduce what
  the engine was fed?
- `history_rerender`: for a call continuing a thread, the previous call's
  prompt + completion (what the model really saw and wrote) vs the start of
  the template's rendering of this call's input: what re-rendering history
  loses (Qwen3 strips `<think>` before the last user turn, separators).
- `verl_sanity`: template-rendered samples whose per-message rendering
  (veRL's MultiTurnSFTDataset, what `tokens` writes) differs from rendering
  the whole conversation at once ("engine" = whole, "rendered" = per message).

Kinds: `stripped_think`, `tool_call_json_spacing`, `turn_separator`,
`tokenization` (same text, other split), `other`.

Re-rendering is the template's (and veRL's) whole cost, so by default
(`sample`) the prompt and history checks run on a deterministic sample of
segments: the first `SAMPLE_FIRST` with engine ids, then one in
`SAMPLE_EVERY` by a hash of the segment id. A rate over a sample estimates the
dataset's; `last` checks every segment's last call, `all` every call.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any

import numpy as np

from forgerl.schema.chat import chat_tools, image_parts, to_chat_messages

from .source import Call
from .tokens import Renderer, TokenSample
from .vision import ImagePads, SampleImages, verl_content

_EXAMPLES = 20
_WINDOW = 40
_WINDOW_IDS = 64  # ids decoded either side of the first differing one, before decoding both whole
SAMPLE_FIRST = 2
SAMPLE_EVERY = 64
MODES = ("sample", "last", "all", "off")
_SPACE = re.compile(r"\s+")


def _first_diff(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids two arrays share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def classify(engine: str, rendered: str) -> tuple[str, int]:
    """What kind of difference two renderings of one conversation have, and where (a character offset)."""
    if engine == rendered:
        return "tokenization", 0
    at = _first_diff(engine, rendered)
    near = engine[max(0, at - _WINDOW): at + _WINDOW] + "\x00" + rendered[max(0, at - _WINDOW): at + _WINDOW]
    if "<think>" in near or "</think>" in near:
        return "stripped_think", at
    open_at, close_at = engine.rfind("<tool_call>", 0, at + 1), engine.rfind("</tool_call>", 0, at + 1)
    if open_at > close_at:
        e_end, r_end = engine.find("</tool_call>", at), rendered.find("</tool_call>", at)
        if e_end > 0 and r_end > 0 and _SPACE.sub("", engine[open_at:e_end]) == _SPACE.sub("", rendered[open_at:r_end]):
            return "tool_call_json_spacing", at
    if "<|image_pad|>" in near or "<|vision_end|>" in near:  # an image's pad count: the engine's processor resized it
        return "image_tokens", at                                # otherwise than veRL's path counts it
    rest_e, rest_r = engine[at: at + 2], rendered[at: at + 2]
    if "<|im" in near[_WINDOW - 5: _WINDOW + 12] or (rest_e[:1].isspace() or rest_r[:1].isspace()):
        return "turn_separator", at
    return "other", at


def _in_sample(segment_id: str) -> bool:
    return int.from_bytes(hashlib.blake2b(segment_id.encode(), digest_size=8).digest(), "big") % SAMPLE_EVERY == 0


class DriftReport:
    def __init__(self, renderer: Renderer | None, mode: str = "sample", pads: ImagePads | None = None):
        self.renderer, self.mode, self.pads = renderer, mode, pads
        self.segments = self.segments_checked = 0
        self.checks: dict[str, Counter] = {name: Counter() for name in
                                           ("prompt_rerender", "history_rerender", "verl_sanity")}
        self.where: dict[str, Counter] = {name: Counter() for name in self.checks}
        self.thread_breaks = 0
        self.examples: list[dict[str, Any]] = []

    def _record(self, check: str, ref: str, engine_ids: np.ndarray, rendered_ids: np.ndarray) -> None:
        counts = self.checks[check]
        counts["checked"] += 1
        if np.array_equal(engine_ids, rendered_ids):
            return
        counts["differ"] += 1
        if len(self.examples) >= _EXAMPLES:  # no example to show: a window around the difference may name it
            kind = self._window_kind(engine_ids, rendered_ids)
            if kind is not None:
                self.where[check][kind] += 1
                return
        decode = self.renderer.tokenizer.decode
        engine, rendered = decode(engine_ids.tolist()), decode(rendered_ids.tolist())
        kind, at = classify(engine, rendered)
        self.where[check][kind] += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append({"check": check, "ref": ref, "kind": kind, "char": at,
                                  "engine": engine[max(0, at - _WINDOW): at + _WINDOW],
                                  "rendered": rendered[max(0, at - _WINDOW): at + _WINDOW]})

    def _window_kind(self, engine_ids: np.ndarray, rendered_ids: np.ndarray) -> str | None:
        """`stripped_think` when the tokens around the first differing id already show it, else None.

        Decoding both conversations whole cost more than the rest of a template run (a Claude Code-sized
        one is ~18k tokens, the first difference past its ~16k of tool schemas). A difference inside the
        window, with `classify`'s context on both sides of it, is where the whole texts first differ, so a
        `<think>` tag near it is one there too. Other kinds look further (back to an open `<tool_call>`,
        or equal texts), so they take the whole decode.
        """
        at_id = _common_prefix(engine_ids, rendered_ids)
        start, end = max(0, at_id - _WINDOW_IDS), at_id + _WINDOW_IDS
        decode = self.renderer.tokenizer.decode
        engine, rendered = decode(engine_ids[start:end].tolist()), decode(rendered_ids[start:end].tolist())
        kind, at = classify(engine, rendered)
        # where a side was cut short, the difference must lie well before the cut (a cut can make one up)
        whole_after = all(end >= len(ids) or at + _WINDOW <= len(text)
                          for ids, text in ((engine_ids, engine), (rendered_ids, rendered)))
        return kind if kind == "stripped_think" and whole_after else None

    def check_segment(self, segment_id: str, calls: list[Call], enable_thinking: bool,
                      before: Call | None = None) -> None:
        """Prompt and history checks over one segment's calls (in order), if the mode picks the segment.

        Except in `all` mode only the segment's last call is re-rendered: its prompt holds the whole
        history, so it sees every drift the earlier ones would, at one render per segment.
        """
        if self.renderer is None or self.mode == "off" or not any(c.engine_ids is not None for c in calls):
            return
        self.segments += 1
        if self.mode == "sample" and self.segments > SAMPLE_FIRST and not _in_sample(segment_id):
            return
        self.segments_checked += 1
        every = self.mode == "all"
        previous: Call | None = before if before is not None and before.engine_ids is not None else None
        last = len(calls) - 1
        for n, call in enumerate(calls):
            if call.engine_ids is None:
                previous = None
                continue
            if not every and n != last:
                previous = call
                continue
            rendered = self._render_prompt(call, enable_thinking)
            if rendered is None:
                previous = None
                continue
            self._record("prompt_rerender", call.row["call_id"], call.engine_ids[0], rendered)
            if previous is not None:
                seen = np.concatenate(previous.engine_ids)
                self._record("history_rerender", call.row["call_id"], seen, rendered[: len(seen)])
            previous = call

    def _render_prompt(self, call: Call, enable_thinking: bool) -> np.ndarray | None:
        """The call's input as the template renders it for generation; with images, each image expanded into
        its pads (None when images cannot be counted: no VL tokenizer, or no size recorded)."""
        chat = to_chat_messages(call.input, arguments="json")
        images = image_parts(call.input)
        if images and (self.pads is None or not all(p.width and p.height for p in images)):
            return None
        if images:
            chat = verl_content(chat)
        rendered = self.renderer.ids(chat, chat_tools(call.tools) or None, True, enable_thinking)
        if not images:
            return rendered
        counts = tuple(self.pads.count(p.width, p.height) for p in images)
        return np.asarray(SampleImages(self.pads, counts).expand(rendered.tolist()), np.int32)

    def note_tokens(self, ts: TokenSample) -> None:
        if ts.template_consistent is not None and self.renderer is not None:
            whole = ts.input_ids if ts.whole_ids is None else ts.whole_ids
            self._record("verl_sanity", ts.sample.sample_id, whole, ts.input_ids)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, counts in self.checks.items():
            checked, differ = counts["checked"], counts["differ"]
            out[name] = {"checked": checked, "differ": differ,
                         "rate": round(differ / checked, 4) if checked else None, "where": dict(self.where[name])}
        out["thread_breaks"] = self.thread_breaks
        out["sampling"] = {"mode": self.mode, "segments_with_engine_ids": self.segments,
                           "segments_checked": self.segments_checked,
                           **({"first": SAMPLE_FIRST, "then_one_in": SAMPLE_EVERY} if self.mode == "sample" else {})}
        out["examples"] = self.examples
        return out

