"""Tool-call formats: each parses what its model generates and renders back exactly through its real template.

The templates are the models' published ones, kept as test data (tests/fixtures/chat_templates/README.md
says where each comes from); Qwen3's is the offline Qwen3 tokenizer's own. A generated turn is what the
template writes for a reference assistant message after the generation prompt; parsing it must give the
reference calls, and rendering the parsed message must give the same text (so the same tokens).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from forgerl.schema.chat import to_chat_messages
from forgerl.schema.toolcalls import FORMATS, ToolCall, TurnParser, format_for_template, parse_generation

from serve_fixtures import TOKENIZER_DIR

TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "Run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"},
                                     "env": {"type": "object"}, "dry_run": {"type": "boolean"}}}}},
         {"type": "function", "function": {"name": "Read", "description": "Read a file", "parameters": {
             "type": "object", "properties": {"file_path": {"type": "string"}}}}}]
CALLS = (ToolCall("Bash", {"command": "ls -la\ncat 'a b'", "timeout": 5, "env": {"A": "ü"}, "dry_run": False}),
         ToolCall("Read", {"file_path": "/tmp/x"}))
# format -> (its template, what ends an assistant turn after the generated text)
FAMILIES = {"hermes": (None, "<|im_end|>\n"), "qwen3_coder": ("qwen3_coder.jinja", "<|im_end|>\n"),
            "glm45": ("glm45.jinja", "")}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def template(tok, name: str) -> str:
    file = FAMILIES[name][0]
    return tok.chat_template if file is None else (TEMPLATES / file).read_text()


def render(tok, name: str, messages: list[dict], prompt: bool = False) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, chat_template=template(tok, name),
                                   add_generation_prompt=prompt)


def generated(tok, name: str, reasoning: str | None, text: str, calls=CALLS) -> tuple[str, str, str]:
    """(generation prompt, the turn as the model writes it, the whole render) for a reference message."""
    message = {"role": "assistant", "content": text,
               "tool_calls": [{"id": f"c{n}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                              for n, c in enumerate(calls)]}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    user = [{"role": "user", "content": "go"}]
    prompt, full = render(tok, name, user, prompt=True), render(tok, name, user + [message])
    assert full.startswith(prompt)
    end = FAMILIES[name][1]
    assert full.endswith(end)
    return prompt, full[len(prompt):len(full) - len(end) if end else None], full


@pytest.mark.parametrize("name", FAMILIES)
def test_generated_calls_parse_and_render_back_exactly(tok, name):
    reasoning = None if name == "qwen3_coder" else "Look first."  # Qwen3-Coder does not reason
    prompt, said, full = generated(tok, name, reasoning, "Let me look.")
    turn = parse_generation(said, FORMATS[name], TOOLS)
    assert turn.tool_calls == CALLS and turn.text == "Let me look." and turn.reasoning == reasoning
    assert turn.malformed == 0
    again = render(tok, name, [{"role": "user", "content": "go"}] + to_chat_messages([turn.message(["c0", "c1"])]))
    assert again == full
    if name != "glm45":  # the Qwen tokenizer is these models' own: the render is the prompt's ids + the turn's
        assert tok.encode(again) == tok.encode(prompt) + tok.encode(said) + tok.encode(FAMILIES[name][1])


@pytest.mark.parametrize("name", FAMILIES)
def test_streamed_parse_equals_the_whole_parse(tok, name):
    """Fed one character at a time (tags cut anywhere), the parser says the same turn, in order."""
    said = generated(tok, name, None if name == "qwen3_coder" else "Two\n\nsteps.", "Let me look.\nThen read.")[1]
    parser = TurnParser(FORMATS[name], TOOLS)
    events = [event for char in said for event in parser.feed(char)] + parser.finish()
    assert parser.turn() == parse_generation(said, FORMATS[name], TOOLS)
    calls = [value for kind, value in events if kind == "call"]
    assert tuple(calls) == CALLS and "".join(v for k, v in events if k == "text") == "Let me look.\nThen read."
    kinds = [kind for kind, _ in events]
    assert kinds.index("call") > max(i for i, kind in enumerate(kinds) if kind == "text")


MALFORMED = {
    "hermes": ['<tool_call>\n{"name": "Bash", "arguments": {"command": }\n</tool_call>',
               '<tool_call>\n{"arguments": {}}\n</tool_call>'],
    "qwen3_coder": ["<tool_call>\n<function=Bash>\n<parameter=timeout>\nfive\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=Bash>\nstray words\n</function>\n</tool_call>"],
    "glm45": ["<tool_call>Bash\n<arg_key>timeout</arg_key>\n<arg_value>five</arg_value>\n</tool_call>",
              "<tool_call>\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"],
}


@pytest.mark.parametrize("name", FAMILIES)
def test_malformed_and_cut_off_calls_stay_text_and_are_counted(tok, name):
    fmt = FORMATS[name]
    for bad in MALFORMED[name]:
        turn = parse_generation("Trying.\n" + bad, fmt, TOOLS)
        assert turn.tool_calls == () and turn.text == "Trying.\n" + bad and turn.malformed == 1
    said = generated(tok, name, None, "")[1]
    cut = said[:said.index(fmt.call_close)]  # the token limit hit inside the first call
    turn = parse_generation(cut, fmt, TOOLS)
    assert turn.tool_calls == () and turn.malformed == 1 and fmt.call_open in turn.text


def test_formats_are_recognised_from_their_templates(tok):
    assert {name: format_for_template(template(tok, name)).name for name in FAMILIES} == {
        name: name for name in FAMILIES}
    with pytest.raises(ValueError, match="--tool-format"):
        format_for_template("{% for m in messages %}{{ m.content }}{% endfor %}")


def test_reasoning_opened_by_the_prompt_and_cut_reasoning():
    """A template that opens `<think>` in the generation prompt: the model writes only the close. A turn cut
    while reasoning keeps what it reasoned."""
    turn = parse_generation("Plan it.\n</think>\n\nDone.", FORMATS["hermes"])
    assert (turn.reasoning, turn.text) == ("Plan it.", "Done.")
    parser = TurnParser(FORMATS["hermes"], in_reasoning=True)
    events = parser.feed("Still thinking\n") + parser.finish()
    assert events == [("reasoning", ""), ("reasoning", "Still thinking")] and parser.turn().text == ""
