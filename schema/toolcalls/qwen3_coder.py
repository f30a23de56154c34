"""Qwen3-Coder: XML tool calls, one `<parameter=NAME>` element per argument.

    TEXT\\n\\n<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

The template writes string values raw and objects and lists as JSON, so a
value is read by its parameter's schema type (`typed_value`).
"""

from __future__ import annotations

import re

from .base import Schemas, ToolCall, ToolCallFormat, read_elements

_FUNCTION = re.compile(r"\n?<function=([^>\n]+)>\n(.*)</function>\n?", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n?", re.DOTALL)


class Qwen3Coder(ToolCallFormat):
    name = "qwen3_coder"

    def read_call(self, body: str, schemas: Schemas) -> ToolCall | None:
        function = _FUNCTION.fullmatch(body)
        if function is None:
            return None
        return read_elements(function.group(1), function.group(2), _PARAMETER, schemas)

    def writes(self, chat_template: str) -> bool:
        return "<function=" in chat_template and "<parameter=" in chat_template


FORMAT = Qwen3Coder()
