"""Qwen2.5 / Qwen3 / Hermes: `<think>` reasoning, and one JSON object per `<tool_call>` block.

    <think>\\nREASONING\\n</think>\\n\\nTEXT\\n<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>
"""

from __future__ import annotations

import json

from .base import Schemas, ToolCall, ToolCallFormat


class Hermes(ToolCallFormat):
    name = "hermes"

    def read_call(self, body: str, schemas: Schemas) -> ToolCall | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models emit the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(value["name"], arguments)

    def writes(self, chat_template: str) -> bool:
        return self.call_open in chat_template and '"arguments"' in chat_template


FORMAT = Hermes()
