"""Harness specs' commands: each points its harness at the recorder's session URL, in a private HOME, with no key on disk."""

from __future__ import annotations

import json
import tomllib

import pytest

from forgerl.harnesses import HARNESSES, HarnessError, RunContext, get_harness

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
    result = {"payloads": [{"text": "Done."}], "meta": {"finalAssistantVisibleText": "Done."}}
    assert get_harness("openclaw").final_answer("[plugins] loaded\n" + json.dumps(result, indent=2), ctx) == "Done."
    state = ctx.home / ".openclaw"
    assert env["OPENCLAW_STATE_DIR"] == str(state) and env["OPENCLAW_CONFIG_PATH"] == str(state / "openclaw.json")
    config = json.loads((state / "openclaw.json").read_text())
    provider = config["models"]["providers"]["forgerl"]
    assert provider["baseUrl"] == f"{BASE}/s/sess-1/v1" and provider["api"] == "openai-completions"
    assert provider["apiKey"] == "${OPENAI_API_KEY}"
    assert config["agents"]["defaults"] == {"model": {"primary": "forgerl/qwen3"}, "workspace": str(ctx.workspace),
                                            "skipBootstrap": True}
    assert config["memory"]["search"]["enabled"] is False and config["update"]["checkOnStart"] is False
    assert env["OPENCLAW_NO_AUTO_UPDATE"] == "1"
    assert "userkey" not in on_disk(ctx.home) and env["OPENAI_API_KEY"].startswith("sk-proj-user")


def test_openclaw_reads_its_sqlite_transcript(ctx):
    import sqlite3

    db = ctx.home / ".openclaw" / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE transcript_events (session_id TEXT, seq INTEGER, event_json TEXT, event_zstd BLOB)")
        con.executemany("INSERT INTO transcript_events VALUES (?, ?, ?, ?)", [
            ("s", 1, '{"type":"message","message":{"role":"assistant"}}', None), ("s", 2, None, b"zstd"),
            ("s", 0, '{"type":"session"}', None)])
    con.close()
    transcript = get_harness("openclaw").own_transcript(ctx)
    assert transcript == '{"type":"session"}\n{"type":"message","message":{"role":"assistant"}}'


def test_opencode_config_points_at_the_recorder(ctx):
    argv, env = get_harness("opencode").command("/bin/opencode", ctx)
    assert argv == ["/bin/opencode", "run", "--format", "json", "--title", "sess-1", "fix it"]
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["forgerl"]
    assert provider["npm"] == "@ai-sdk/openai-compatible" and provider["options"]["baseURL"] == f"{BASE}/s/sess-1/v1"
    assert provider["options"]["apiKey"] == "{env:OPENAI_API_KEY}" and list(provider["models"]) == ["qwen3"]
    assert config["model"] == "forgerl/qwen3" and config["permission"] == "allow"
    assert env["XDG_CONFIG_HOME"] == str(ctx.home / ".config") and env["PWD"] == str(ctx.workspace)
    assert {k: env[k] for k in env if k.startswith("OPENCODE_DISABLE_")} == {
        "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"}
    assert (ctx.home / ".config" / "opencode" / "node_modules").is_dir()
    assert "userkey" not in on_disk(ctx.home) and env["OPENAI_API_KEY"].startswith("sk-proj-user")
    events = [{"type": "text", "part": {"messageID": "m1", "text": "Looking."}},
              {"type": "tool_use", "part": {"messageID": "m1", "tool": "bash"}},
              {"type": "text", "part": {"messageID": "m2", "text": "Done: "}},
              {"type": "text", "part": {"messageID": "m2", "text": "42."}}]
    stdout = "\n".join(json.dumps(e) for e in events)
    assert get_harness("opencode").final_answer(stdout, ctx) == "Done: 42."
    assert get_harness("opencode").final_answer("", ctx) is None


def test_zeroclaw_config_points_at_the_recorder(ctx):
    argv, _ = get_harness("zeroclaw").command("/bin/zeroclaw", ctx)
    assert argv == ["/bin/zeroclaw", "agent", "-m", "fix it"]
    config = tomllib.loads((ctx.home / ".zeroclaw" / "config.toml").read_text())
    assert config == {"default_provider": f"custom:{BASE}/s/sess-1/v1", "default_model": "qwen3"}
    assert "userkey" not in on_disk(ctx.home)


def test_missing_cli_and_unknown_harness_say_where_they_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("FORGE_CONFIG", str(tmp_path / "tools.toml"))
    with pytest.raises(HarnessError, match=r"zeroclaw not found: looked in \$FORGE_ZEROCLAW, PATH, .*tools.toml"):
        HARNESSES["zeroclaw"].find()
    with pytest.raises(HarnessError, match="unknown harness 'aider'; known: browser-use, claude-code, codex"):
        get_harness("aider")
