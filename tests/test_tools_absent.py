"""Calls that hold tool calls while their request defined no tools (`calls.tools_absent`).

A plain HTTP client sends Chat Completions requests through a real recorder
to the scripted upstream: a tool loop whose requests carry no `tools` (as
Codex 0.171 does with its own default model), and the same loop with its
tools. The recorder flags the first as it writes; the converter counts them
and refuses training rows without definitions unless asked; the v2 -> v3
migration decides the same as the writer. And `forge-run` gives Codex a
model, with which it sends its tool definitions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forgerl.schema import files, store, tables
from forgerl.schema.migrations import upgrade

from conftest import session_calls
from harness_checks import forge_run, recording
from runner_fixtures import NOVEL_TASK, task_script
from scripted_upstream import ToolCall, Turn, last_user_text, saw_tool_result

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}


def loop_script(request) -> Turn:
    if last_user_text(request) == "Hi":
        return Turn(text="Hello.")
    if saw_tool_result(request):
        return Turn(text="Two files.")
    return Turn(text="Listing.", tool_calls=[ToolCall("bash", {"command": "ls"}, id="call_1")])


def tool_loop(url: str, tools: list[dict] | None) -> None:
    """A two-call tool loop, as a harness sends it; `tools` in the requests only when given."""
    extra = {"tools": tools} if tools else {}
    messages = [{"role": "user", "content": "List the files."}]
    with httpx.Client(timeout=30) as client:
        client.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages, **extra}).raise_for_status()
        messages += [{"role": "assistant", "content": "Listing.", "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}]
        client.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages, **extra}).raise_for_status()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("absent") / "data"
    with recording(loop_script, data) as rec:
        tool_loop(rec.base("bare"), None)
        tool_loop(rec.base("full"), [BASH])
        with httpx.Client(timeout=30) as client:  # no tools and no tool calls: nothing is missing
            client.post(f"{rec.base('chat')}/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "Hi"}]}).raise_for_status()
        session_calls(data, "bare", 2)
        session_calls(data, "full", 2)
        session_calls(data, "chat", 1)
    return data


def flags(data: Path) -> dict[str, list]:
    out: dict[str, list] = {}
    for row in sorted(store.read_table(data, "calls").to_pylist(), key=lambda r: (r["t_start"], r["seq"])):
        out.setdefault(row["session_id"], []).append(row["tools_absent"])
    return out


def test_the_recorder_flags_calls_as_it_writes_them(recorded):
    assert flags(recorded) == {"bare": [True, True], "full": [False, False], "chat": [False]}


def forge_convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("forge-convert")), *args, "--no-progress",
                           "--val-fraction", "0"], capture_output=True, text=True, timeout=300)


def test_the_converter_counts_and_refuses_unless_asked(recorded, tmp_path):
    refused = forge_convert(str(recorded), "--to", "verl-sft", "--out", str(tmp_path / "r"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "2 calls in 1 segments hold tool calls but their requests defined no tools" in refused.stderr
    assert "--allow-tools-absent" in refused.stderr and not (tmp_path / "r").exists()

    done = forge_convert(str(recorded), "--to", "verl-sft", "--out", str(tmp_path / "a"), "--allow-tools-absent")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["counts"]["tools_absent_calls"] == 2 and manifest["counts"]["tools_absent_segments"] == 1
    assert manifest["counts"]["rows_train"] == 3 and manifest["options"]["allow_tools_absent"]

    kept = forge_convert(str(recorded), "--to", "verl-sft", "--out", str(tmp_path / "k"), "--harness", "unknown",
                         "--since", "2000-01-01", "--min-turns", "2")
    assert kept.returncode == 2  # filters that keep the flagged session still refuse
    trajectories = forge_convert(str(recorded), "--to", "atif", "--out", str(tmp_path / "t"))
    assert trajectories.returncode == 0, trajectories.stderr
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["counts"]["tools_absent_calls"] == 2


def test_the_migration_decides_as_the_writer(recorded, tmp_path):
    """The recording turned back into a v2 dataset (no column, version 2) upgrades to the same flags."""
    root = tmp_path / "v2"
    root.mkdir()
    for table in tables.TABLES:
        (root / table).mkdir()
        for path in map(Path, files.data_files(recorded, table)):
            data = pq.read_table(path)
            if table == "calls":
                data = data.drop_columns(["tools_absent", "malformed_tool_calls"])
            files.atomic_write_table(root / table / path.name, data, table, 2)
    manifest = files.read_manifest(recorded)
    files.write_manifest(root, {**manifest, "schema_version": 2})
    assert pq.read_schema(files.data_files(root, "calls")[0]).names == tables.CALLS.names[:-2]
    upgraded = upgrade(root)
    assert upgraded["schema_version"] == 4 and upgraded["migrations"][-2:] == ["m003_tools_absent",
                                                                               "m004_malformed_tool_calls"]
    assert flags(root) == flags(recorded)
    assert pq.read_schema(files.data_files(root, "calls")[0]).field("tools_absent").type == pa.bool_()


@pytest.mark.slow
def test_forge_run_gives_codex_a_model_so_it_sends_its_tools(scripted, tmp_path):
    """Without --model forge-run passes the adapter's default (gpt-5.4): Codex then sends `tools`."""
    _, _, calls = forge_run(NOVEL_TASK, "codex", tmp_path / "data", "--upstream", scripted(task_script).url)
    (call,) = [c for c in calls if c["api"] == "responses"]
    assert call["model_requested"] == "gpt-5.4" and call["tools_absent"] is False
    sent = {t["name"] for t in json.loads(call["tools"])}
    assert {"exec_command", "write_stdin"} <= sent
