"""Loading the tokenizer: a light local one when possible, transformers' AutoTokenizer otherwise.

`AutoTokenizer` imports torch and most of transformers (10-20 s here), which
dominates short conversions. A local tokenizer directory (tokenizer.json +
tokenizer_config.json with a chat template) needs only the `tokenizers`
library and transformers' chat-template environment (its Jinja extensions,
filters and globals), so `LocalTokenizer` gives the same text and ids as
`apply_chat_template` (the tests check it against veRL, which uses
AutoTokenizer, and against transformers' renderer) at a fraction of the
start-up cost, and renders in half the time (`_compile`). The compiled
template is kept on disk (`_from_string`), as Python keeps a module's code.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import re
import sys
import tempfile
from array import array
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from forgerl.errors import UserError
from forgerl.schema.messages import canonical_json
from forgerl.schema.templates import chat_template

_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerError(UserError):
    """The tokenizer cannot be loaded or has no chat template."""


class LocalTokenizer:
    """The parts of a transformers tokenizer the converters use, from a local directory."""

    def __init__(self, directory: Path):
        # The core install has no torch by design: transformers' "PyTorch was not found" advice is noise here.
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        from tokenizers import Tokenizer
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self._compile_base = _compile_jinja_template  # imported with the tokenizer (~0.4 s), run on first use
        config = json.loads((directory / "tokenizer_config.json").read_text())
        self.chat_template = chat_template(directory)
        self.source = (directory / "tokenizer.json").read_bytes()
        self.backend_tokenizer = Tokenizer.from_str(self.source.decode("utf-8"))
        self.special_tokens_map = {k: v.get("content") if isinstance(v, dict) else v
                                   for k in _SPECIAL if (v := config.get(k)) is not None}
        self.eos_token = self.special_tokens_map.get("eos_token")
        self._template: Any = None  # compiled on first use

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None, tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """What transformers' `render_jinja_template` renders for one conversation of dicts (tools as JSON
        schemas, no documents, no continued final message)."""
        if tokenize:
            raise ValueError("LocalTokenizer renders text; encode it with encode()")
        if self._template is None:
            self._template = _compile(self._compile_base(""), self.chat_template)
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     **{**self.special_tokens_map, **kwargs})

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.backend_tokenizer.token_to_id(token)


_DICT_ATTRIBUTES = frozenset(dir(dict))  # what `getattr` finds on a plain dict before its keys


def _compile(base: Any, chat_template: str) -> Any:
    """The template in the environment of `base` (transformers' compiled chat template: its extensions,
    filters and globals), with a sandbox that decides each attribute once per (type, name), not on every read."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Sandbox(ImmutableSandboxedEnvironment):
        """The same answers, faster: chat templates read message keys as attributes (`message.content`), which
        the sandbox looks for as an attribute of the dict first, failing with an exception each time, and it
        checks every attribute it returns although the checks look at its name and the object's type alone.
        Between them that was half a render."""

        def __init__(self, **options: Any):
            super().__init__(**options)
            self.verdicts: dict[tuple[type, str], bool] = {}

        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    pass
            return super().getattr(obj, attribute)

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            key = (type(obj), attr)
            safe = self.verdicts.get(key)
            if safe is None:
                safe = self.verdicts[key] = super().is_safe_attribute(obj, attr, value)
            return safe

    base = base.environment
    env = Sandbox(trim_blocks=base.trim_blocks, lstrip_blocks=base.lstrip_blocks,
                  extensions=[type(e) for e in base.extensions.values()])
    env.filters.update(base.filters)
    env.globals.update(base.globals)
    return _from_string(env, chat_template)


_CODE_VERSION = "1"  # of what `_from_string` keeps on disk


def _from_string(env: Any, source: str) -> Any:
    """`env.from_string(source)`, with the compiled code kept on disk between runs, as Python keeps a module's.
    Jinja's compile is ~15 ms for a chat template and every run paid it; loading the code takes under 1 ms.
    The key holds everything the code depends on: the source, the environment's syntax options and
    extensions, and the Jinja and Python versions. A cache that cannot be read or written is compiled past."""
    import jinja2

    options = [getattr(env, name) for name in (
        "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
        "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
        "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized")]
    key = hashlib.sha256(json.dumps([_CODE_VERSION, source, options, repr(env.autoescape), sorted(env.extensions),
                                     jinja2.__version__, sys.version]).encode()).hexdigest()
    path = Path(os.path.expanduser(os.environ.get("XDG_CACHE_HOME") or "~/.cache")) / "forgerl" / "templates" / key
    try:
        code = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        code = env.compile(source)  # a bad template raises here, as from_string does
        _keep(path, marshal.dumps(code))
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def _keep(path: Path, data: bytes) -> None:
    """`data` to `path` whole (written aside, then renamed), or nothing: a cache that cannot be written is not one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
            f.write(data)
        try:
            os.replace(f.name, path)
        except OSError:
            os.unlink(f.name)
    except OSError:
        pass


class PieceEncoder:
    """`encode` with the text between added tokens cached, piece by piece.

    The tokenizer cuts its input at added tokens before it normalises or pre-tokenises anything, so a
    text's ids are its pieces' ids in a row, and chat renders share most pieces: the system prompt with
    the tool schemas (Claude Code's are ~16k tokens, the same in every session), and earlier turns. Only
    added tokens that match exactly (no strip, no single-word, not normalised) are cut on; any others stay
    inside a piece and the tokenizer handles them there, as it would in the whole text. The cache holds
    pieces of up to `budget_chars` of text in all (8M by default, some 50 MB with their ids).
    """

    def __init__(self, backend: Any, budget_chars: int = 8 << 20):
        exact = [t.content for t in backend.get_added_tokens_decoder().values()
                 if not (t.lstrip or t.rstrip or t.single_word or t.normalized)]
        self.backend = backend
        self.token_ids = {token: backend.token_to_id(token) for token in exact}
        longest_first = sorted(exact, key=len, reverse=True)  # leftmost-longest, as the tokenizer matches
        self.cut = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if exact else None
        # least recently used first; bounded by the pieces' text (ids as int32: a tuple of ints is ~9x larger)
        self._cache: OrderedDict[str, array] = OrderedDict()
        self._chars, self.budget_chars, self.hits = 0, budget_chars, 0

    def _piece(self, text: str) -> array:
        ids = self._cache.get(text)
        if ids is not None:
            self._cache.move_to_end(text)
            self.hits += 1
            return ids
        ids = array("i", self.backend.encode(text, add_special_tokens=False).ids)
        if len(text) <= self.budget_chars // 4:
            self._cache[text] = ids
            self._chars += len(text)
            while self._chars > self.budget_chars:
                self._chars -= len(self._cache.popitem(last=False)[0])
        return ids

    def encode(self, text: str) -> np.ndarray:
        """The text's ids (int32), as the tokenizer's `encode` without special tokens gives them."""
        if self.cut is None:
            return np.array(self._piece(text), np.int32)
        ids = array("i")
        for i, piece in enumerate(self.cut.split(text)):
            if i % 2:
                ids.append(self.token_ids[piece])
            elif piece:
                ids.extend(self._piece(piece))
        return np.frombuffer(ids, np.int32)


@lru_cache(maxsize=4)
def load_tokenizer(name: str) -> Any:
    """A tokenizer with a chat template, from a local directory or an (offline-cached) hub name (read once)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    path = Path(name)
    if (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file():
        try:
            tokenizer: Any = LocalTokenizer(path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on a bad file
            raise TokenizerError(f"--tokenizer {name}: cannot load: {str(e).splitlines()[0]}") from None
    else:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        try:
            tokenizer = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"--tokenizer {name}: cannot load: {str(e).splitlines()[0]}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerError(f"--tokenizer {name}: the tokenizer has no chat template")
    return tokenizer


def tokenizer_hash(tokenizer: Any) -> str:
    """sha256 over the tokenizer (tokenizer.json, or the vocabulary) and the chat template."""
    h = hashlib.sha256()
    if isinstance(tokenizer, LocalTokenizer):
        h.update(tokenizer.source)
    else:
        h.update(canonical_json(sorted(tokenizer.get_vocab().items())).encode())
    h.update((tokenizer.chat_template or "").encode())
    return h.hexdigest()
