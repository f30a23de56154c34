"""GLM-4.5 (Zhipu): `<think>` reasoning, the call's name then key/value element pairs.

    <think>REASONING</think>\\nTEXT\\n<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>

The template writes string values raw and anything else as JSON, so a value
is read by its parameter's schema type (`typed_value`).
"""

from __future__ import annotations

import re

from .base import Schemas, ToolCall, ToolCallFormat, typed_value

_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLM45(ToolCallFormat):
    name = "glm45"

    def read_call(self, body: str, schemas: Schemas) -> ToolCall | None:
        name, _, rest = body.partition("<arg_key>")
        name = name.strip()
        if not name or "<" in name or "\n" in name:
            return None
        rest = body[len(body) - len(rest) - len("<arg_key>"):] if _ else ""
        properties = schemas.get(name, {})
        arguments = {}
        at = 0
        for pair in _PAIR.finditer(rest):
            if pair.start() != at:
                return None
            ok, value = typed_value(pair.group(2), properties.get(pair.group(1)))
            if not ok:
                return None
            arguments[pair.group(1)] = value
            at = pair.end()
        if rest[at:].strip():
            return None
        return ToolCall(name, arguments)

    def writes(self, chat_template: str) -> bool:
        return "<arg_key>" in chat_template and "<arg_value>" in chat_template


FORMAT = GLM45()
