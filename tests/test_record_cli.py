"""`forge-record` verbs as a user runs them: run, ls, show, compact, delete, bad input, mitmdump -s."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from forgerl.errors import UserError
from forgerl.recorder.addon import Recorder
from forgerl.recorder.proxy import RecorderConfig, free_port, serve_forever
from forgerl.schema import files, store

from conftest import FORGE_RECORD, REPO, session_calls
from scripted_upstream import ToolCall, Turn, sequence
from verb_checks import assert_refused

CLIENT = textwrap.dedent("""
    import anthropic, openai
    a = anthropic.Anthropic(api_key="sk-ant-api03-clitestclitestclitest")
    r = a.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "run ls"}])
    o = openai.OpenAI(api_key="sk-proj-clitestclitestclitestclitest")
    o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    print("client done", r.content[-1].name)
""")


def forge(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([FORGE_RECORD, *args], capture_output=True, text=True, timeout=120, check=check)


def test_run_points_sdk_clients_at_the_recorder(scripted, tmp_path):
    up = scripted(sequence(Turn(text="listing", tool_calls=[ToolCall("Bash", {"command": "ls"})])))
    out = tmp_path / "data"
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    r = forge("run", "--out", str(out), "--session", "cli", "--upstream-anthropic", up.url,
              "--upstream-openai", up.url, "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    assert "client done Bash" in r.stdout
    assert "session cli" in r.stderr and "2 calls" in r.stderr and "Bash x2" in r.stderr
    rows = session_calls(out, "cli", 2)
    assert {row["api"] for row in rows} == {"anthropic", "chat"}
    assert [e.path for e in up.log] == ["/v1/messages", "/v1/chat/completions"]  # prefix stripped

    ls = forge("ls", str(out), check=True).stdout
    assert "cli" in ls and "2" in ls
    listed = json.loads(forge("ls", str(out), "--json", check=True).stdout)
    assert listed[0]["session_id"] == "cli" and listed[0]["calls"] == 2
    show = forge("show", str(out), "cli", check=True).stdout
    assert "-> Bash(" in show and "/v1/chat/completions" in show

    # A second recorder run writes files of its own: something to compact.
    r = forge("run", "--out", str(out), "--session", "cli2", "--upstream-anthropic", up.url,
              "--upstream-openai", up.url, "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    assert "merged" in forge("compact", str(out), check=True).stdout
    assert len(files.data_files(out, "calls")) == 1
    deleted = forge("delete", str(out), "cli", check=True).stdout
    assert "deleted session cli" in deleted
    assert set(store.read_table(out, "calls").column("session_id").to_pylist()) == {"cli2"}


def test_run_returns_the_commands_status(tmp_path):
    r = forge("run", "--out", str(tmp_path / "d"), "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert r.returncode == 3
    assert "no calls recorded" in r.stderr


def test_bad_input_is_one_clear_line(tmp_path):
    cases = [
        (("ls", str(tmp_path)), "not a forgerl dataset"),
        (("ls", str(tmp_path / "missing")), "no such directory"),
        (("show", str(tmp_path), "x"), "not a forgerl dataset"),
        (("compact", str(tmp_path / "missing")), "no such directory"),
        (("run", "--out", str(tmp_path / "d"), "--", "no-such-command-xyz"), "command not found"),
        (("run", "--out", str(tmp_path / "d")), "give the command"),
        (("serve", "--upstream", "ftp://x"), "upstream must be"),
        (("serve", "--listen", "nonsense"), "expected HOST:PORT"),
        (("serve", "--upstream", "http://127.0.0.1:9", "--redact-rules", str(tmp_path / "nope")), "No such file"),
    ]
    for args, message in cases:
        r = forge(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr, (args, r.stderr)
    with_data = tmp_path / "real"
    store.init_root(with_data)
    r = forge("show", str(with_data), "nobody")
    assert r.returncode == 2 and "no session 'nobody'" in r.stderr
    r = forge("delete", str(with_data), "nobody")
    assert r.returncode == 2 and "no session 'nobody'" in r.stderr
    assert not list(tmp_path.glob("d/*/*.parquet")), "a failed command left partial output"


def test_serve_refuses_an_address_it_cannot_listen_on_and_leaves_no_folder(tmp_path):
    out = tmp_path / "data"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for listen, message in ((f"127.0.0.1:{port}", f"cannot listen on 127.0.0.1:{port}: Address already in use"),
                                ("999.1.1.1:8787", "cannot listen on 999.1.1.1:8787: ")):
            assert_refused(forge("serve", "--upstream", "http://127.0.0.1:9", "--listen", listen, "--out", str(out)),
                           message)
            assert not out.exists()


def test_a_port_taken_once_mitmproxy_starts_is_a_user_error_and_no_folder(tmp_path):
    """The backstop behind the check above: mitmproxy's own startup error, said instead of "Error logged"."""
    out = tmp_path / "data"
    config = RecorderConfig(out=out, upstream_anthropic="http://127.0.0.1:9", upstream_openai="http://127.0.0.1:9")
    with socket.create_server((config.listen_host, config.listen_port)):  # taken after the config checked it
        with pytest.raises(UserError, match=f"failed to listen on 127.0.0.1:{config.listen_port}.*address already in use"):
            serve_forever(config)
    assert not out.exists()


def test_addon_options_errors_are_mitmproxy_options_errors(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    addon = Recorder()
    with taddons.context(addon) as tctx:
        for option, value, message in (("forge_labels", "[1]", "labels must be a JSON object"),
                                       ("forge_upstream_openai", "ftp://x", "upstream must be http"),
                                       ("forge_redact_rules", str(tmp_path / "nope"), "No such file"),
                                       ("forge_out", str(not_a_folder), str(not_a_folder))):
            with pytest.raises(exceptions.OptionsError, match=message):
                tctx.configure(addon, **{option: value})
        assert addon.writer is None


def test_addon_runs_under_plain_mitmdump(scripted, tmp_path):
    up = scripted()
    port = free_port()
    out = tmp_path / "data"
    mitmdump = shutil.which("mitmdump") or str(Path(sys.executable).with_name("mitmdump"))
    proc = subprocess.Popen([mitmdump, "-q", "-s", str(REPO / "recorder" / "addon.py"),
                             "--mode", f"reverse:{up.url}@127.0.0.1:{port}", "--set", f"forge_out={out}"])
    try:
        for _ in range(100):
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/s/plain/v1/chat/completions", timeout=5,
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert r.status_code == 200
        assert session_calls(out, "plain", 1)[0]["api"] == "chat"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
