"""The converters' fast paths give what the slow ones give.

- `LocalTokenizer` renders chat templates in a sandbox of its own (dict keys read as attributes without
  a failed attribute lookup first, attribute checks decided once per type and name): the text, and the
  errors, must be transformers' `render_jinja_template`'s, for the real Qwen3 template and for a template
  that reads dict methods, missing keys and unsafe attributes.
- `DriftReport` names a difference from a window of ids around it when it can: the kinds it counts must
  be those the whole decode gives, on real per-turn vs whole renders and on pairs altered to differ in
  other ways (inside a tool call, at a turn separator, the same text split otherwise).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from jinja2.exceptions import SecurityError, TemplateError
from transformers.utils.chat_template_utils import render_jinja_template

from forgerl.converters import drift
from forgerl.converters.tokenizer import LocalTokenizer
from forgerl.converters.tokens import Renderer

from convert_fixtures import TOKENIZER_DIR

TOOLS = [{"type": "function", "function": {"name": "run_shell", "description": "Run a shell command",
                                           "parameters": {"type": "object", "properties": {
                                               "cmd": {"type": "string"}}, "required": ["cmd"]}}}]


def _conversation(k: int) -> list[dict]:
    chat = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": f"Task {k}: list files."}]
    for step in range(3):
        chat.append({"role": "assistant", "reasoning_content": f"step {step}: think about {k}",
                     "content": "" if step < 2 else "Done.",
                     "tool_calls": [{"id": f"c{step}", "type": "function", "function": {
                         "name": "run_shell", "arguments": json.dumps({"cmd": f"ls dir_{k}_{step}"})}}]})
        chat.append({"role": "tool", "tool_call_id": f"c{step}", "content": f"file_{step}.py\n"})
    chat.append({"role": "user", "content": "And now?"})
    chat.append({"role": "assistant", "reasoning_content": "last", "content": "All listed."})
    return chat


def _transformers(local: LocalTokenizer, template: str, chat: list[dict], **kwargs) -> str:
    rendered, _ = render_jinja_template(conversations=[chat], chat_template=template,
                                        **{**local.special_tokens_map, **kwargs})
    return rendered[0]


@pytest.fixture(scope="module")
def local() -> LocalTokenizer:
    return LocalTokenizer(Path(TOKENIZER_DIR))


def test_the_qwen3_template_renders_as_transformers_does(local):
    for k in range(3):
        chat = _conversation(k)
        for cut in range(1, len(chat) + 1):
            for kwargs in ({}, {"tools": TOOLS}, {"add_generation_prompt": True, "enable_thinking": False},
                           {"tools": TOOLS, "add_generation_prompt": True}):
                ours = local.apply_chat_template(chat[:cut], **kwargs)
                assert ours == _transformers(local, local.chat_template, chat[:cut], **kwargs), (k, cut, kwargs)


PROBE = ("{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ m.items is defined }}|{{ m.get('content') }}"
         "|{{ m.missing is defined }}|{{ m.keys()|list|length }}|{{ m.__class__ is defined }}]{% endfor %}"
         "{% if tools %}{{ tools|tojson }}{% endif %}")


def test_dict_attributes_missing_keys_and_unsafe_names_behave_as_in_transformers(local, tmp_path):
    chat = [{"role": "user", "content": "hi", "items": "a key named like a dict method", "get": "another"},
            {"role": "assistant", "content": "ok"}]
    local.chat_template = PROBE  # a template of this instance only
    local._template = None
    try:
        assert local.apply_chat_template(chat, tools=TOOLS) == _transformers(local, PROBE, chat, tools=TOOLS)
        unsafe = "{{ messages.__class__.__mro__ }}{{ messages.append(1) }}"
        local.chat_template, local._template = unsafe, None
        with pytest.raises(SecurityError):
            _transformers(local, unsafe, chat)
        with pytest.raises(SecurityError):
            local.apply_chat_template(chat)
        failing = "{{ raise_exception('no system') }}"
        local.chat_template, local._template = failing, None
        with pytest.raises(TemplateError, match="no system"):
            local.apply_chat_template(chat)
    finally:
        local.chat_template, local._template = LocalTokenizer(Path(TOKENIZER_DIR)).chat_template, None


def _pairs(renderer: Renderer) -> list[tuple[np.ndarray, np.ndarray]]:
    """(whole, per-turn) id pairs as verl_sanity sees them, and pairs altered to differ otherwise."""
    pairs = []
    for k in range(6):
        chat = _conversation(k)[: -2 if k % 2 else None]  # odd k: the tool loop last, its thinking kept whole
        whole = renderer.ids(chat, TOOLS)
        turns = np.concatenate([renderer.ids([m], TOOLS if i == 0 else None)[0 if i == 0 else
                                                                            len(renderer.system_prompt):]
                                for i, m in enumerate(chat)])
        pairs.append((whole, turns))
        spaced = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
            json.loads(c["function"]["arguments"]), indent=2)}} for c in m["tool_calls"]]} if "tool_calls" in m else m
                  for m in chat]
        pairs.append((whole, renderer.ids(spaced, TOOLS)))  # tool call JSON spaced otherwise
        separated = [{**m, "content": m["content"] + "\n"} if m["role"] == "tool" else m for m in chat]
        pairs.append((whole, renderer.ids(separated, TOOLS)))
        text = renderer.text(chat, TOOLS)
        at = text.index("Task")
        split = np.concatenate([renderer.encode(text[:at + 2]), renderer.encode(text[at + 2:])])
        pairs.append((whole, split))  # the same text, split otherwise
        other = whole.copy()
        other[len(other) // 2] = renderer.tokenizer.convert_tokens_to_ids("Hello")
        pairs.append((whole, other))
    return pairs


def test_a_window_names_the_kind_the_whole_decode_names(local):
    renderer = Renderer(local)
    pairs = _pairs(renderer)
    whole = drift.DriftReport(renderer)  # fewer than 20 examples: every difference decoded whole
    window = drift.DriftReport(renderer)
    window.examples = [{}] * 20  # examples full: a window first
    named = 0
    for n, (engine, rendered) in enumerate(pairs):
        whole.examples = []
        whole._record("verl_sanity", str(n), engine, rendered)
        window._record("verl_sanity", str(n), engine, rendered)
        assert window.where == whole.where, n
        kind = window._window_kind(engine, rendered)
        assert kind in (None, whole.examples[0]["kind"]), n
        named += kind is not None
    kinds = whole.where["verl_sanity"]
    assert {"stripped_think", "tool_call_json_spacing", "tokenization"} <= set(kinds), kinds
    assert sum(kinds.values()) == len(pairs) and named == kinds["stripped_think"] >= 6
