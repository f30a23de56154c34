"""pi 0.73.1 (npm `@mariozechner/pi-coding-agent`, pinned) end to end: record, convert, forge-run, serve.

One recording per module (`forge-record run -- pi -p ... --model qwen3`
against the scripted upstream: write, read, answer) feeds the record and
convert tests. pi speaks Chat Completions here (a custom
`openai-completions` provider the launcher writes). Every run has its
proxies aimed at a trap (qwen_pi_fixtures.ProxyTrap), so a request to
anywhere but the recorder fails the test.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from forgerl.runners.harnesses import RunContext, get_harness

from conftest import session_calls
from convert_fixtures import TOKENIZER_DIR
from qwen_pi_fixtures import (ANSWER, PROOF, ProxyTrap, check_served, check_sft, files_holding, forge_run_sparql,
                              loop_script, serve_turns, sparql_script, tool_names)
from runner_fixtures import SPARQL_SCORE
from scripted_upstream import ScriptedUpstream, ToolCall
from test_harnesses import needs, run_recorded, tool_exchange

pytestmark = pytest.mark.slow
KEY = "sk-proj-pipipipipipipipipipipipi5678"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    pi = needs("pi")
    base = tmp_path_factory.mktemp("pi")
    script = loop_script(ToolCall("write", {"path": "proof.txt", "content": PROOF}),
                         ToolCall("read", {"path": "proof.txt"}))
    trap = ProxyTrap()
    try:
        with ScriptedUpstream(script) as up:
            r = run_recorded(base, "pi", up.url, [str(pi), "-p", "--mode", "json", "--provider", "openai",
                                                  "--model", "qwen3", "Write proof.txt, then read it back."],
                             {"OPENAI_API_KEY": KEY, **trap.env()})
    finally:
        trap.close()
    return {"run": r, "base": base, "data": base / "data", "hits": trap.hits}


def test_record_tool_loop(recorded):
    r, base = recorded["run"], recorded["base"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert recorded["hits"] == [], "pi reached past the recorder"
    assert get_harness("pi").final_answer(r.stdout, RunContext("", base, base, "", "pi")) == ANSWER
    assert (base / "work" / "proof.txt").read_text() == PROOF
    calls = [c for c in session_calls(recorded["data"], "pi", 3) if c["api"] == "chat"]
    assert len(calls) == 3 and all(c["complete"] and c["error"] is None and c["streamed"] for c in calls)
    assert all(c["path"] == "/v1/chat/completions" for c in calls)
    assert {c["model_requested"] for c in calls} == {"qwen3"}
    assert tool_names(calls) == ["write", "read"]
    _, result = tool_exchange(recorded["data"], "pi", calls[1:], "read")
    assert "forgerl proof" in json.dumps(result), result
    assert {t["name"] for t in json.loads(calls[0]["tools"])} == {"read", "bash", "edit", "write"}
    assert "session pi (pi)" in r.stderr and "write x1" in r.stderr
    assert not files_holding([base], KEY[8:]), "the API key reached the disk"
    # the provider lived in the run's scratch dir; pi's own transcript stays where pi keeps it
    assert not (base / "home" / ".pi" / "agent" / "models.json").exists()
    assert list((base / "home" / ".pi" / "agent" / "sessions").glob("*/*.jsonl")), "no pi transcript"


def test_tokens_and_verl_sft(recorded, tmp_path):
    check_sft(recorded["data"], tmp_path, "pi", "pi", ("write", "read"))


def test_forge_run_grades_a_qwenclawbench_task(scripted, tmp_path):
    up = scripted(sparql_script("bash"))
    outcome = forge_run_sparql(up.url, tmp_path / "data", "pi")
    assert outcome["harness"] == "pi" and outcome["reward"] == pytest.approx(SPARQL_SCORE)
    extra = json.loads(outcome["extra"])
    assert extra["final_answer"] == "Wrote query_output.sparql."
    assert '"toolName":"bash"' in extra["harness_transcript"]


PI_TURNS = ['I\'ll write the file.\n<tool_call>\n{"name": "bash", "arguments": {"command": '
            '"echo forgerl > proof.txt"}}\n</tool_call>', "<think>\nIt worked.\n</think>\n\nDone."]


def test_served_by_the_policy(tmp_path):
    needs("pi")
    trap = ProxyTrap()
    try:
        r, calls = serve_turns(tmp_path, "pi", PI_TURNS, trap)
    finally:
        trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert trap.hits == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    ctx = RunContext("", tmp_path / "work", tmp_path / "home", "", "sv")
    assert get_harness("pi").final_answer(r.stdout, ctx) == "Done."
    check_served(calls, PI_TURNS, AutoTokenizer.from_pretrained(TOKENIZER_DIR))


def test_adapter_points_at_the_recorder(tmp_path):
    ctx = RunContext("fix it", tmp_path / "ws", tmp_path / "home", "http://127.0.0.1:8787", "s1", "qwen3",
                     {"OPENAI_API_KEY": KEY})
    argv, env = get_harness("pi").command("/bin/pi", ctx)
    assert argv == ["/bin/pi", "-p", "--mode", "json", "--provider", "forgerl", "--model", "qwen3", "fix it"]
    models = json.loads((ctx.home / ".pi" / "agent" / "models.json").read_text())
    provider = models["providers"]["forgerl"]
    assert provider["baseUrl"] == "http://127.0.0.1:8787/s/s1/v1" and provider["api"] == "openai-completions"
    assert provider["apiKey"] == "OPENAI_API_KEY" and provider["models"] == [{"id": "qwen3"}]
    assert env["OPENAI_API_KEY"] == KEY and env["PI_OFFLINE"] == "1" and env["PI_TELEMETRY"] == "0"
    assert not files_holding([ctx.home], KEY[8:])
