"""GLM-4.5 (Zhipu): `<think>` reasoning, the call's name then key/value element pairs.

    <think>REASONING</think>\\nTEXT\\n<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>

The template writes string values raw and anything else as JSON, so a value
is read by its parameter's schema type (`typed_value`).
"""

from __future__ import annotations

import re

from .base import Schemas, ToolCall, ToolCallFormat, read_elements

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLM45(ToolCallFormat):
    name = "glm45"

    def read_call(self, body: str, schemas: Schemas) -> ToolCall | None:
        head = body.split("<arg_key>", 1)[0]
        name = head.strip()
        if not name or "<" in name or "\n" in name:
            return None
        return read_elements(name, body[len(head):], _PAIR, schemas)

    def writes(self, chat_template: str) -> bool:
        return "<arg_key>" in chat_template and "<arg_value>" in chat_template


FORMAT = GLM45()
