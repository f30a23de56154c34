"""Serve mode records, per call, the call-shaped text its tool-call format could not read (it stays text),
and `forge-analyze` shows it in the `turns` view: a served call with a malformed `<tool_call>` counts 1,
over Anthropic (streamed and not), Responses and Chat (streamed)."""

from __future__ import annotations

import json

import anthropic
import openai

from forgerl.analysis import connect

from conftest import RecorderProcess, session_calls
from serve_fixtures import TOKENIZER_DIR

BROKEN = 'Let me run it. <tool_call>\n{"name": "Bash", "arguments": {oops}}\n</tool_call>'
GOOD = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'


def test_a_malformed_call_is_counted_on_the_recorded_call_and_in_the_turns_view(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([BROKEN, GOOD, BROKEN, BROKEN]))
    data = tmp_path / "data"
    proc = RecorderProcess(data, None, "--policy", f"script:{script}", "--tokenizer", str(TOKENIZER_DIR),
                           "--served-model", "tiny").start()
    try:
        client = anthropic.Anthropic(base_url=proc.base("a"), api_key="sk-ant-api03-servetestservetest")
        with client.messages.stream(model="claude-x", max_tokens=200,
                                    messages=[{"role": "user", "content": "go"}]) as stream:
            broken = stream.get_final_message()
        good = client.messages.create(model="claude-x", max_tokens=200, messages=[{"role": "user", "content": "go"}])
        responses = openai.OpenAI(base_url=proc.base("o") + "/v1", api_key="sk-proj-servetestservetestserve")
        answered = responses.responses.create(model="gpt-x", input="go")
        chunks = list(responses.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "go"}],
                                                        stream=True))
    finally:
        proc.stop()
    assert [b.type for b in broken.content] == ["text"] and "<tool_call>" in broken.content[0].text
    assert [b.type for b in good.content] == ["tool_use"]
    assert "<tool_call>" in answered.output_text
    assert "<tool_call>" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    calls = session_calls(data, "a", 2) + session_calls(data, "o", 2)
    assert [(c["api"], c["malformed_tool_calls"]) for c in calls] == [("anthropic", 1), ("anthropic", 0),
                                                                      ("responses", 1), ("chat", 1)]
    rows = connect(data).sql("SELECT session_id, model, sum(malformed_tool_calls) AS malformed, count(*) AS turns "
                             "FROM turns GROUP BY ALL ORDER BY session_id").fetchall()
    assert rows == [("a", "claude-x", 1, 2), ("o", "gpt-x", 2, 2)]
