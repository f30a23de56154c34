"""Token ids to text as they stream, without splitting a character or a word's leading space.

Byte-level BPE tokens can end mid-UTF-8 character, and some tokenizers
decode a token differently at the start of a sequence than after another
one. `Detokenizer` decodes the new ids together with those of the previous
piece (as vLLM's incremental detokenizer does): text is given out once its characters are
whole, and the pieces it gives out join to `tokenizer.decode(ids)`.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # the window's start
        self._read = 0  # ids up to here have been given out as text

    def add(self, ids: list[int]) -> str:
        """The text the new ids complete ("" while a character is still partial)."""
        self._ids.extend(ids)
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]

    def rest(self) -> str:
        """What is left when the stream ends (an unfinished character decodes as U+FFFD, as `decode` writes it)."""
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        self._read = len(self._ids)
        return after[len(before):]

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self._ids[start:end], skip_special_tokens=False) if end > start else ""
