"""Harness adapters: each points its harness at the recorder's session URL, in a private HOME, with no key on disk."""

from __future__ import annotations

import json
import tomllib

import pytest

from forgerl.runners.harnesses import HARNESSES, HarnessError, RunContext, get_harness

BASE = "http://127.0.0.1:8787"


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    (tmp_path / "home").mkdir()
    return RunContext("fix it", tmp_path / "ws", tmp_path / "home", BASE, "sess-1", "qwen3",
                      {"OPENAI_API_KEY": "sk-proj-userkeyuserkeyuserkey"})


def on_disk(home) -> str:
    return "".join(p.read_text() for p in home.rglob("*") if p.is_file())


def test_claude_code(ctx):
    argv, env = get_harness("claude-code").command("/bin/claude", ctx)
    assert argv[:3] == ["/bin/claude", "-p", "fix it"] and argv[-2:] == ["--model", "qwen3"]
    assert env["ANTHROPIC_BASE_URL"] == f"{BASE}/s/sess-1" and env["HOME"] == str(ctx.home)
    assert env["IS_SANDBOX"] == "1" and env["ANTHROPIC_API_KEY"] == "sk-ant-forgerl-placeholder"
    assert get_harness("claude-code").final_answer('{"type":"result","result":"Done."}\n', ctx) == "Done."


def test_codex(ctx):
    argv, env = get_harness("codex").command("/bin/codex", ctx)
    assert argv[0:2] == ["/bin/codex", "exec"] and argv[-1] == "fix it" and "-m" in argv
    assert f'base_url="{BASE}/s/sess-1/v1"' in " ".join(argv)
    assert env["CODEX_HOME"] == str(ctx.home / ".codex") and env["OPENAI_API_KEY"].startswith("sk-proj-user")
    (ctx.home / "last-message.txt").write_text("Done.\n")
    assert get_harness("codex").final_answer("", ctx) == "Done."


def test_openclaw_config_points_at_the_recorder(ctx):
    argv, env = get_harness("openclaw").command("/bin/openclaw", ctx)
    assert argv == ["/bin/openclaw", "agent", "--local", "--session-id", "sess-1", "--message", "fix it", "--json"]
    result = {"result": {"meta": {"run": [{"finalAssistantVisibleText": "Done."}]}}}
    assert get_harness("openclaw").final_answer(json.dumps(result, indent=2), ctx) == "Done."
    config = json.loads((ctx.home / ".openclaw" / "openclaw.json").read_text())
    provider = config["models"]["providers"]["forgerl"]
    assert provider["baseUrl"] == f"{BASE}/s/sess-1/v1" and provider["api"] == "openai-completions"
    assert config["agents"]["defaults"]["model"]["primary"] == "forgerl/qwen3"
    assert "userkey" not in on_disk(ctx.home) and env["OPENAI_API_KEY"].startswith("sk-proj-user")


def test_zeroclaw_config_points_at_the_recorder(ctx):
    argv, _ = get_harness("zeroclaw").command("/bin/zeroclaw", ctx)
    assert argv == ["/bin/zeroclaw", "agent", "-m", "fix it"]
    config = tomllib.loads((ctx.home / ".zeroclaw" / "config.toml").read_text())
    assert config == {"default_provider": f"custom:{BASE}/s/sess-1/v1", "default_model": "qwen3"}
    assert "userkey" not in on_disk(ctx.home)


def test_missing_cli_and_unknown_harness_say_where_they_looked(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(HarnessError, match="zeroclaw not found on PATH or in .*node_modules/.bin"):
        HARNESSES["zeroclaw"].find()
    with pytest.raises(HarnessError, match="unknown harness 'aider'; known: claude-code, codex"):
        get_harness("aider")
