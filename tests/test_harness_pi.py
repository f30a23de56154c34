"""pi 0.73.1 (npm `@mariozechner/pi-coding-agent`, pinned) end to end: record, convert, analyse, forge-run,
serve.

One recording per module (`forge-record run -- pi -p ... --model qwen3`
against the scripted upstream: write, read, answer) feeds the record and
convert tests. pi speaks Chat Completions here (a custom
`openai-completions` provider the launcher writes). Every run has its
proxies aimed at a trap (harness_checks.ProxyTrap), so a request to
anywhere but the recorder fails the test.
"""

from __future__ import annotations

import json

import pytest

from forgerl.harnesses import RunContext, get_harness

from harness_checks import files_holding, graded_sparql, needs, sparql_script
from qwen_pi_fixtures import (PROOF, check_atif_and_analysis, check_recorded, check_served_loop, check_sft, proof_loop,
                              record_loop)
from scripted_upstream import ToolCall

pytestmark = pytest.mark.slow
KEY = "sk-proj-pipipipipipipipipipipipi5678"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    script = proof_loop(ToolCall("write", {"path": "proof.txt", "content": PROOF}),
                         ToolCall("read", {"path": "proof.txt"}))
    # `--provider openai` is the user's: the launcher swaps in its own provider, keeping the model name
    cmd = [str(needs("pi")), "-p", "--mode", "json", "--provider", "openai", "--model", "qwen3",
           "Write proof.txt, then read it back."]
    return record_loop(cmd, tmp_path_factory.mktemp("pi"), "pi", script, KEY)


def test_record_tool_loop(recorded):
    calls = check_recorded(recorded, "pi", ("write", "read"), KEY)
    assert {c["model_requested"] for c in calls} == {"qwen3"}
    assert {t["name"] for t in json.loads(calls[0]["tools"])} == {"read", "bash", "edit", "write"}
    # the provider lived in the run's scratch dir; pi's own transcript stays where pi keeps it
    agent = recorded["base"] / "home" / ".pi" / "agent"
    assert not (agent / "models.json").exists()
    assert list((agent / "sessions").glob("*/*.jsonl")), "no pi transcript"


def test_tokens_and_verl_sft(recorded, tmp_path):
    check_sft(recorded["data"], tmp_path, "pi", "pi", ("write", "read"))


def test_atif_and_analysis(recorded, tmp_path):
    check_atif_and_analysis(recorded["data"], tmp_path, "pi", "pi", ("write", "read"))


def test_forge_run_grades_a_qwenclawbench_task(scripted, tmp_path):
    _, extra, _ = graded_sparql("pi", scripted(sparql_script("bash")).url, tmp_path / "data", "--model", "qwen3")
    assert '"toolName":"bash"' in extra["harness_transcript"]


def test_served_by_the_policy(tmp_path):
    needs("pi")
    check_served_loop(tmp_path, "pi", "bash")


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
    assert not files_holding(KEY[8:], ctx.home)


def test_launcher_keeps_the_model_name(tmp_path):
    """`forge-record run -- pi ...`: the user's provider gives way to the recorder's; the model id stays whole."""
    from forgerl.harnesses import get_harness

    for given, model in ((["--provider", "openai", "--model", "openai/gpt-4o"], "gpt-4o"),
                         (["--model", "Qwen/Qwen3-8B"], "Qwen/Qwen3-8B"), (["--model=forgerl/qwen3"], "qwen3")):
        aimed = get_harness("pi").launch(["pi", "-p", *given, "hi"], "http://127.0.0.1:8787", "s1", tmp_path / model.replace("/", "_"))
        assert aimed.argv == ["pi", "-p", "hi", "--provider", "forgerl", "--model", model]
        models = json.loads((tmp_path / model.replace("/", "_") / "pi-agent" / "models.json").read_text())
        assert models["providers"]["forgerl"]["models"] == [{"id": model}]
    assert aimed.env["PI_CODING_AGENT_DIR"].startswith(str(tmp_path)) and aimed.env["PI_OFFLINE"] == "1"
