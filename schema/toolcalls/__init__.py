"""Tool-call formats: parse what a policy generated into reasoning, text and tool calls.

One module per template family, each a `ToolCallFormat` (`base`): `hermes`
(Qwen2.5 / Qwen3 / Hermes `<tool_call>` JSON), `qwen3_coder` (Qwen3-Coder's
`<function=…><parameter=…>` XML), `glm45` (GLM-4.5's `<arg_key>/<arg_value>`
pairs). Adding a family is one module with a `FORMAT` and one line in
`FORMATS`. A format is chosen by name (`forge-record serve --tool-format`)
or recognised from the tokenizer's chat template (`format_for_template`).
`TurnParser` splits a turn as it streams; `parse_generation` a whole one,
through the same parser.
"""

from __future__ import annotations

from typing import Any

from . import glm45, hermes, qwen3_coder
from .base import ParsedTurn, ToolCall, ToolCallFormat, TurnParser, parse_text, tool_schemas

__all__ = ["FORMATS", "HERMES", "ParsedTurn", "ToolCall", "ToolCallFormat", "TurnParser", "format_for_template",
           "format_named", "parse_generation", "tool_schemas"]

HERMES = hermes.FORMAT

# Most specific first: Qwen3-Coder's template also writes `<tool_call>`.
FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (qwen3_coder.FORMAT, glm45.FORMAT, hermes.FORMAT)}


def format_for_template(chat_template: str | None) -> ToolCallFormat:
    """The format a chat template writes tool calls in; refuses templates it does not know."""
    for fmt in FORMATS.values():
        if chat_template and fmt.writes(chat_template):
            return fmt
    raise ValueError("the tokenizer's chat template has no known tool-call format (known: "
                     f"{', '.join(FORMATS)}); name one with --tool-format")


def format_named(name: str) -> ToolCallFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r} (known: {', '.join(FORMATS)})") from None


def parse_generation(text: str, fmt: ToolCallFormat = HERMES, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
    """Split one whole generated turn (without its end-of-turn token)."""
    return parse_text(text, fmt, tools)
