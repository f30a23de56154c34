"""forge-convert on bad input: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forgerl.converters.cli import main
from forgerl.schema import files, store
from forgerl.schema.chat import chat_tools, image_refs, to_chat_messages
from forgerl.schema.messages import Message, Part

from convert_fixtures import chat_dataset, qwen_tokenizer  # noqa: F401 - chat_dataset is a fixture
from verb_checks import assert_refused, verb


@pytest.fixture
def dataset(chat_dataset: Path) -> Path:
    return chat_dataset


def refused(capsys, out: Path, *argv: str) -> str:
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))
    return err


def test_corrupt_parquet(dataset, tmp_path, capsys):
    bad = tmp_path / "corrupt"
    shutil.copytree(dataset, bad)
    victim = sorted((bad / "calls").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:200])
    assert "unreadable parquet" in refused(capsys, tmp_path / "o", str(bad), "--to", "verl-sft")


def test_newer_schema_version(dataset, tmp_path, capsys):
    bad = tmp_path / "newer"
    shutil.copytree(dataset, bad)
    manifest = json.loads((bad / files.MANIFEST).read_text())
    (bad / files.MANIFEST).write_text(json.dumps({**manifest, "schema_version": 99}))
    assert "schema version 99" in refused(capsys, tmp_path / "o", str(bad), "--to", "verl-sft")


def test_missing_tokenizer(dataset, tmp_path, capsys):
    err = refused(capsys, tmp_path / "o", str(dataset), "--to", "tokens", "--tokenizer", str(tmp_path / "nope"))
    assert "--tokenizer" in err
    assert "needs --tokenizer" in refused(capsys, tmp_path / "o", str(dataset), "--to", "tokens")


def test_empty_dataset_and_not_a_dataset(tmp_path, capsys):
    store.init_root(tmp_path / "empty")
    assert "no calls" in refused(capsys, tmp_path / "o", str(tmp_path / "empty"), "--to", "verl-sft")
    assert "not a forgerl dataset" in refused(capsys, tmp_path / "o", str(tmp_path), "--to", "verl-sft")


def test_unknown_target(dataset, tmp_path, capsys):
    assert "unknown --to" in refused(capsys, tmp_path / "o", str(dataset), "--to", "megatron")


def test_bad_memory_setting(dataset, tmp_path, capsys, monkeypatch):
    for value in ("lots", "512"):  # a size needs its unit
        monkeypatch.setenv("FORGE_CONVERT_MEMORY", value)
        assert "FORGE_CONVERT_MEMORY" in refused(capsys, tmp_path / "o", str(dataset), "--to", "verl-sft")


def test_the_console_script_refuses_in_one_line(dataset, tmp_path):
    out = tmp_path / "o"
    for args, message in (((str(dataset), "--to", "megatron"), "unknown --to 'megatron'"),
                          ((str(tmp_path), "--to", "verl-sft"), "not a forgerl dataset")):
        assert_refused(verb("forge-convert", *args, "--out", str(out), "--no-progress"), message)
        assert not out.exists() and not list(tmp_path.glob(".o.*"))


def test_failed_run_keeps_the_old_output(dataset, tmp_path, capsys):
    out = tmp_path / "o"
    assert main([str(dataset), "--to", "verl-rl", "--out", str(out), "--no-progress"]) == 0
    before = sorted(p.name for p in out.rglob("*"))
    assert main([str(dataset), "--to", "verl-rl", "--out", str(out), "--until", "2001-01-01", "--no-progress"]) == 2
    assert sorted(p.name for p in out.rglob("*")) == before


def test_chat_messages_for_templates():
    """schema/chat.py: tool results split out of user turns, images as placeholders, order kept."""
    messages = [
        Message("user", (Part("text", text="look"), Part("image", blob_hash="b1", media_type="image/png"))),
        Message("assistant", (Part("reasoning", text="hm"), Part("text", text="calling"),
                              Part("tool_call", tool_name="shot", call_id="c1", arguments='{"x": 1}'))),
        Message("user", (Part("tool_result", call_id="c1", content=(Part("image", blob_hash="b2"),)),
                         Part("text", text="next"))),
        Message("assistant", (Part("other", extra={"type": "web_search_call"}),)),
    ]
    chat = to_chat_messages(messages)
    assert chat == [
        {"role": "user", "content": "look<image>"},
        {"role": "assistant", "content": "calling", "reasoning_content": "hm",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "<image>"},
        {"role": "user", "content": "next"},
    ]
    assert to_chat_messages(messages, arguments="json")[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert image_refs(messages) == ["b1", "b2"]
    # a tool recorded before the codecs kept definitions whole: its nulls stand for keys not sent
    assert chat_tools([{"name": "shot", "description": None, "parameters": None}]) == [
        {"type": "function", "function": {"name": "shot"}}]
    tok = qwen_tokenizer()
    from forgerl.schema.chat import render_messages

    rendered = render_messages(tok, messages[:2], tools=[{"name": "shot", "description": "screenshot",
                                                          "parameters": {"type": "object"}}])
    assert rendered.ids == tok.apply_chat_template(to_chat_messages(messages[:2]), tools=chat_tools(
        [{"name": "shot", "description": "screenshot", "parameters": {"type": "object"}}]), tokenize=True,
        return_dict=False)
    assert '"arguments": {"x": 1}' in rendered.text and "<image>" in rendered.text
