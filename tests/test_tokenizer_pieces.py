"""PieceEncoder gives the tokenizer's own ids: cutting at added tokens and caching the pieces changes nothing.

The Qwen3 tokenizer (real tokenizer.json, real chat template) encodes whole
texts and the same texts piece by piece; the texts are chat renders with
tools, thinking and tool calls, and strings built to break a naive cut:
added tokens next to whitespace, combining marks, half-written tokens,
tokens back to back, and seeded random mixes of all of them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from forgerl.converters.tokenizer import LocalTokenizer, PieceEncoder

from convert_fixtures import TOKENIZER_DIR

TOOLS = [{"type": "function", "function": {"name": "run_shell", "description": "Run a shell command",
                                           "parameters": {"type": "object", "properties": {
                                               "cmd": {"type": "string"}}, "required": ["cmd"]}}}]
TRICKY = [
    "", " ", "\n", "<|im_end|>", " <|im_end|> ", "<|im_end|>\n\n", "\n\n<|im_start|>user\n",
    "<think>\u0301combining after a token</think>", "e\u0301<|im_end|>\u0301", "<|im_sta", "<|im_start|<|im_end|>",
    "<tool_call><tool_call></tool_call></tool_call>", "   <think>   \n  </think>  ", "<|endoftext|><|endoftext|>",
    "日本語のテキスト<|im_end|>中文", "emoji 🧪<tool_response>{\"ok\": true}</tool_response>", "\t<|fim_prefix|>x",
    "a" * 5000 + "<|im_end|>" + "b " * 3000,
]


def _renders(local: LocalTokenizer) -> list[str]:
    history = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "List the files."}]
    texts = []
    for k in range(4):
        texts.append(local.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True))
        history.append({"role": "assistant", "reasoning_content": f"step {k}: think\n\nmore",
                        "content": "" if k < 3 else "Done.",
                        "tool_calls": [{"type": "function", "function": {
                            "name": "run_shell", "arguments": json.dumps({"cmd": f"ls -la dir_{k}"})}}]})
        history.append({"role": "tool", "content": f"file_{k}.py\n  <not a token>\n"})
        texts.append(local.apply_chat_template(history, tools=TOOLS))
    return texts


def _fuzz(backend: Tokenizer, count: int) -> list[str]:
    rng = random.Random(7)
    added = [t.content for t in backend.get_added_tokens_decoder().values()]
    snippets = [" ", "\n", "  \n ", "word", " word", "\u0301", "é", "{\"k\": 1}", "<", ">", "|", "日本", "🧪", "\t"]
    return ["".join(rng.choice(added if rng.random() < 0.3 else snippets) for _ in range(rng.randint(1, 40)))
            for _ in range(count)]


def test_pieces_give_the_tokenizers_ids():
    local = LocalTokenizer(Path(TOKENIZER_DIR))
    backend = local.backend_tokenizer
    encoder = PieceEncoder(backend, budget_chars=20_000)  # small: pieces are evicted too
    texts = _renders(local) + TRICKY + _fuzz(backend, 600)
    assert "<|im_end|>" in encoder.token_ids and "<think>" in encoder.token_ids
    for _ in range(2):  # the second pass is served from the piece cache
        for text in texts:
            assert encoder.encode(text).tolist() == backend.encode(text, add_special_tokens=False).ids, repr(text[:200])
    assert encoder.hits > 0 and encoder._chars <= 20_000


def test_added_tokens_that_strip_are_not_cut_on():
    backend = Tokenizer.from_file(str(Path(TOKENIZER_DIR) / "tokenizer.json"))
    backend.add_tokens([AddedToken("<strip>", lstrip=True, rstrip=True), AddedToken("<norm>", normalized=True)])
    encoder = PieceEncoder(backend)
    assert "<strip>" not in encoder.token_ids and "<norm>" not in encoder.token_ids
    for text in ("a  <strip>  b", "x<norm>y <|im_end|>  <strip>\n", "<strip><|im_start|><norm>"):
        assert encoder.encode(text).tolist() == backend.encode(text, add_special_tokens=False).ids
