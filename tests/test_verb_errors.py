"""Honest errors for every verb: bad input is one line and exit 2 with nothing left behind; a bug is a traceback.

`forge-record`, `forge-convert` and `forge-analyze` have their own bad-input
tests (test_record_cli.py, test_convert_bad_input.py, test_analysis.py); here
are the rest, as a user runs them, and the bug path of all five verbs through
their `main`.
"""

from __future__ import annotations

import importlib

import pytest

from forgerl.schema import store

from verb_checks import assert_bug, assert_refused, verb


def test_analyze_bad_threads(tmp_path):  # the rest of its bad input: test_analysis.py
    data = tmp_path / "data"
    store.init_root(data)
    assert_refused(verb("forge-analyze", "report", str(data), "--threads", "0"), "--threads must be at least 1")


def test_run_bad_input_creates_no_dataset(tmp_path):
    out = tmp_path / "out"
    tasks = tmp_path / "no-tasks"
    cases = [
        ((str(tasks), "--harness", "codex", "--upstream", "http://127.0.0.1:9"), "no such task file or folder"),
        ((str(tasks), "--harness", "codex"), "give one of --upstream"),
        ((str(tasks), "--harness", "codex", "--upstream", "ftp://x"), "--upstream must be http(s)"),
        ((str(tasks), "--harness", "codex", "--policy", "http://127.0.0.1:9"), "--policy needs --tokenizer"),
    ]
    for args, message in cases:
        assert_refused(verb("forge-run", *args, "--out", str(out)), message)
        assert not out.exists()


def test_run_recorder_refusing_its_input_is_one_line(tmp_path):
    """forge-run starts `forge-record serve` as a process of its own: what that refuses is forge-run's bad input."""
    task = tmp_path / "hello.toml"
    task.write_text('id = "hello"\nprompt = "Say hi."\n[grading]\n'
                    'code = """\ndef grade(transcript, workspace_path):\n    return {"ok": 1.0}\n"""\n')
    out = tmp_path / "out"
    assert_refused(verb("forge-run", str(task), "--harness", "codex", "--upstream", "http://", "--out", str(out)),
                   "upstream must be http(s)://HOST[:PORT][/prefix], got 'http://'")
    assert not out.exists()


def test_train_bad_input_leaves_no_run_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "not-tokens").mkdir()
    (tmp_path / "not-tokens" / "rows.parquet").write_text("not parquet")
    rl = ("rl", "--model", str(model), "--prompt-length", "1024", "--response-length", "512")
    cases = [  # run in tmp_path, so the default --out folders (forge-rl, forge-sft) would land there
        ((*rl, "--tasks", str(tmp_path / "no-tasks"), "--harness", "claude-code"), "no such task file or folder"),
        ((*rl, "--tasks", str(tmp_path), "--harness", "no-such-harness"), "unknown harness 'no-such-harness'"),
        (("rl", "--model", str(model), "--lengths-from", str(tmp_path / "not-tokens"), "--tasks", str(tmp_path),
          "--harness", "claude-code"), "--lengths-from"),
        (("sft", "--data", str(tmp_path / "no-shards"), "--model", str(model)), "--data: no such folder"),
    ]
    for args, message in cases:
        assert_refused(verb("forge-train", *args, cwd=tmp_path), message)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "not-tokens"], args


VERBS = [  # (the verb's cli module, an internal its main reaches, argv that reaches it)
    ("forgerl.recorder.cli", "forgerl.recorder.cli", "_dispatch", ["ls", "data"]),
    ("forgerl.converters.cli", "forgerl.converters.cli", "convert", ["data", "--to", "verl-sft", "--out", "o"]),
    ("forgerl.analysis.cli", "forgerl.analysis.cli", "connect", ["sql", "data", "SELECT 1"]),
    ("forgerl.runners.cli", "forgerl.runners.cli", "_run", ["tasks", "--harness", "codex", "--out", "o"]),
    ("forgerl.trainer.cli", "forgerl.trainer.sft", "main", ["sft", "--data", "d", "--model", "m"]),
]


@pytest.mark.parametrize("error", [RuntimeError, ValueError, OSError])
@pytest.mark.parametrize("cli, module, internal, argv", VERBS, ids=[v[0].split(".")[1] for v in VERBS])
def test_a_bug_is_a_traceback_and_exit_1(cli, module, internal, argv, error, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise error("internal failure 1234")

    monkeypatch.setattr(importlib.import_module(module), internal, broken)
    code = importlib.import_module(cli).main(argv)
    assert_bug(code, capsys.readouterr().err, f"{error.__name__}: internal failure 1234")
