"""Choosing tasks for RL: per-task pass rates (`forge-analyze pass-rates`) and `forge-convert --solve-rate MIN:MAX`.

The bundled example dataset (`analysis/example`, copied: reading may upgrade
it) holds graded outcomes of six tasks: `greet` passes 3 of 3, `summarise` 0
of 3, the other four some of their attempts (`list-files` 1 of 2 scored,
its third rollout an infra error, which is not an attempt). `two_policies` adds the
attempts of a second policy in two harnesses, so each scope keeps another task set.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forgerl import printer
from forgerl.analysis import connect
from forgerl.analysis.cli import main as analyze
from forgerl.analysis.pass_rates import rates_table, solved
from forgerl.converters.cli import main as convert
from forgerl.converters.solve_rate import pass_rates
from forgerl.runners import outcomes
from forgerl.schema.attempts import Scope, pass_rate_rows
from forgerl.schema.writer import DatasetWriter

EXAMPLE = Path(__file__).resolve().parents[1] / "analysis" / "example"
SOMETIMES = {"fix-calc", "list-files", "make-test-pass", "update-config"}


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("rates") / "example"
    shutil.copytree(EXAMPLE, copy)
    return copy


def rl_tasks(out: Path) -> set[str]:
    import ast
    rows = [r for f in sorted((out / "train").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return {ast.literal_eval(str(r["reward_model"]))["ground_truth"] for r in rows}


def test_pass_rates_view_counts_scored_attempts_per_task(example):
    rows = {r["task"]: r for r in pass_rate_rows(connect(example))}
    assert {t: (r["n"], r["passed"], solved(r["n"], r["passed"])) for t, r in rows.items()} == {
        "fix-calc": (3, 2, "sometimes"), "greet": (3, 3, "always"), "list-files": (2, 1, "sometimes"),
        "make-test-pass": (3, 2, "sometimes"), "summarise": (3, 0, "never"), "update-config": (3, 2, "sometimes")}
    assert rows["list-files"]["pass_rate"] == 0.5 and rows["greet"]["harness"] == "codex"


def test_forge_analyze_pass_rates_prints_the_table(example, capsys):
    assert analyze(["pass-rates", str(example), "--policy-version", "(none)"]) == 0
    out = capsys.readouterr().out
    assert "6 task rows: 1 never solved, 4 sometimes, 1 always" in out
    line = next(x for x in out.splitlines() if "list-files" in x)
    assert line.split() == ["list-files", "claude-code", "claude-sonnet-4-5",
                                                                 "(none)", "2", "1", "0.500", "0.500", "sometimes"]
    assert analyze(["pass-rates", str(example), "--policy-version", "v9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("forge-analyze: no scored attempts for harness any, model any, policy version v9 (harness / model "
                   "/ policy version with attempts: claude-code / claude-sonnet-4-5 / (none); codex / gpt-5 / (none))")


def test_solve_rate_keeps_the_tasks_solved_sometimes(example, tmp_path, capsys):
    everything, band = tmp_path / "all", tmp_path / "band"
    args = ["--to", "verl-rl", "--no-progress", "--val-fraction", "0"]
    assert convert([str(example), "--out", str(everything), *args]) == 0
    assert convert([str(example), "--out", str(band), *args, "--solve-rate", "0.01:0.99"]) == 0
    assert rl_tasks(everything) == SOMETIMES | {"greet", "summarise", ""}  # "": sessions with no task
    assert rl_tasks(band) == SOMETIMES
    only_half = tmp_path / "half"
    assert convert([str(example), "--out", str(only_half), *args, "--solve-rate", "0.5:0.5"]) == 0
    assert rl_tasks(only_half) == {"list-files"}


@pytest.mark.parametrize("value", ["0.9:0.1", "abc", "0.5", "-0.1:0.5", "0.2:1.5", ":"])
def test_a_bad_solve_rate_is_one_line(example, tmp_path, capsys, value):
    out = tmp_path / "out"
    assert convert([str(example), "--to", "verl-rl", "--out", str(out), "--no-progress", f"--solve-rate={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"forge-convert: --solve-rate expects MIN:MAX with 0 <= MIN <= MAX <= 1 (e.g. 0.1:0.9), "
                   f"got {value!r}")
    assert not out.exists()


# Attempts of a second policy (qwen3-8b at step-10), as a forge-run of it would add them: in opencode, and in
# claude-code, the harness of the example's recorded sessions. (task, harness, model, policy) -> passed per attempt.
QWEN = {("fix-calc", "opencode"): [True, True, True], ("summarise", "opencode"): [True, False],
        ("greet", "opencode"): [False, True, False], ("list-files", "opencode"): [False, False],
        ("update-config", "claude-code"): [True, False], ("fix-calc", "claude-code"): [False, False]}


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory) -> Path:
    """The example dataset plus qwen3-8b's graded attempts (outcome rows only: their sessions hold no calls)."""
    copy = tmp_path_factory.mktemp("scoped") / "example"
    shutil.copytree(EXAMPLE, copy)
    now = datetime.now(timezone.utc)
    with DatasetWriter(copy, source="runner") as w:
        for (task, harness), results in QWEN.items():
            for attempt, passed in enumerate(results):
                w.add_outcome({"session_id": f"qwen-{harness}-{task}-{attempt}", "task_id": task, "attempt": attempt,
                               "harness": harness, "model": "qwen3-8b", "policy_version": "step-10",
                               "status": "success" if passed else "failed", "reward": float(passed),
                               "passed": passed, "runner": "local", "t_start": now, "t_end": now})
        w.add_outcome({"session_id": "qwen-opencode-greet-infra", "task_id": "greet", "attempt": 9,
                       "harness": "opencode", "model": "qwen3-8b", "policy_version": "step-10",
                       "status": "infra_error", "runner": "local", "t_start": now, "t_end": now})
    return copy


def _convert_rl(data: Path, out: Path, *extra: str) -> dict:
    args = [str(data), "--out", str(out), "--to", "verl-rl", "--no-progress", "--val-fraction", "0", *extra]
    assert convert(args) == 0
    return json.loads((out / "manifest.json").read_text())


def test_solve_rate_is_the_rate_of_the_scope_it_names(two_policies, tmp_path):
    band = ("--solve-rate", "0.01:0.99")
    # Default: each session's task rated in the session's own scope (claude-code / sonnet, codex / gpt-5):
    # qwen's attempts change nothing.
    own = _convert_rl(two_policies, tmp_path / "own", *band)
    assert rl_tasks(tmp_path / "own") == SOMETIMES
    assert own["dropped"] == {"task pass rate outside --solve-rate": 6,  # greet (always), summarise (never)
                              "no scored attempt of its task in the --solve-rate scope": 3}  # sessions with no task
    # The policy being trained, in the harness it trains in: summarise 1/2 and greet 1/3 (the infra error is no
    # attempt), not fix-calc (3/3) or list-files (0/2); the other tasks have no attempt there.
    qwen = _convert_rl(two_policies, tmp_path / "qwen", *band, "--solve-rate-harness", "opencode",
                       "--solve-rate-model", "qwen3-8b", "--solve-rate-policy", "step-10")
    assert rl_tasks(tmp_path / "qwen") == {"summarise", "greet"}
    assert qwen["options"]["filters"] == {"solve_rate": {"min": 0.01, "max": 0.99, "harness": "opencode",
                                                         "model": "qwen3-8b", "policy_version": "step-10"}}
    assert own["options"]["filters"]["solve_rate"]["harness"] is None  # each session's own
    assert qwen["dropped"] == {"task pass rate outside --solve-rate": 6,  # fix-calc, list-files: 3 sessions each
                               "no scored attempt of its task in the --solve-rate scope": 9}  # 2 tasks + 3 taskless
    # qwen in each session's own harness: claude-code sessions by claude-code attempts (update-config 1/2 kept,
    # fix-calc 0/2 not); the codex session of greet has no qwen attempt in codex.
    _convert_rl(two_policies, tmp_path / "same-harness", *band, "--solve-rate-model", "qwen3-8b",
                "--solve-rate-policy", "step-10")
    assert rl_tasks(tmp_path / "same-harness") == {"update-config"}


def test_the_converter_reads_the_rates_forge_analyze_prints(two_policies, capsys):
    assert analyze(["pass-rates", str(two_policies), "--harness", "opencode", "--model", "qwen3-8b"]) == 0
    printed = {}
    for line in capsys.readouterr().out.splitlines():
        cells = line.split()
        if len(cells) == 9 and cells[1] == "opencode":
            printed[cells[0]] = (cells[2], cells[3], int(cells[4]), int(cells[5]), cells[6])
    assert printed == {"fix-calc": ("qwen3-8b", "step-10", 3, 3, "1.000"),
                       "greet": ("qwen3-8b", "step-10", 3, 1, "0.333"),
                       "list-files": ("qwen3-8b", "step-10", 2, 0, "0.000"),
                       "summarise": ("qwen3-8b", "step-10", 2, 1, "0.500")}
    read = pass_rates(two_policies, Scope(harness="opencode", model="qwen3-8b"))
    assert {task: f"{rate:.3f}" for (task, *_), rate in read.rates.items()} == {t: v[4] for t, v in printed.items()}
    # A scope part left open is the session's own: cc-verify-a1's policy version is (none), qwen has none such.
    qwen = Scope(harness="opencode", model="qwen3-8b", policy_version="step-10")
    assert read.rate("cc-verify-a1", "greet", qwen) == pytest.approx(1 / 3)
    assert read.rate("cc-verify-a1", "greet", Scope(harness="opencode", model="qwen3-8b")) is None
    # Per (task, harness, model, policy version): the view keeps the two policies in claude-code apart.
    rows = pass_rate_rows(connect(two_policies), Scope(harness="claude-code"))
    fix_calc = {(r["model"], r["policy_version"]): (r["n"], r["passed"]) for r in rows if r["task"] == "fix-calc"}
    assert fix_calc == {("claude-sonnet-4-5", "(none)"): (3, 2), ("qwen3-8b", "step-10"): (2, 0)}


@pytest.mark.parametrize(("extra", "message"), [
    (["--solve-rate", "0.1:0.9", "--solve-rate-model", "llama"],
     "--solve-rate: no scored attempts for harness any, model llama, policy version any (harness / model / policy "
     "version with attempts: claude-code / claude-sonnet-4-5 / (none); claude-code / qwen3-8b / step-10; codex / "
     "gpt-5 / (none); opencode / qwen3-8b / step-10)"),
    (["--solve-rate-harness", "opencode"],
     "--solve-rate-harness, --solve-rate-model and --solve-rate-policy need --solve-rate"),
])
def test_a_scope_without_attempts_is_one_line(two_policies, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert convert([str(two_policies), "--to", "verl-rl", "--out", str(out), "--no-progress", *extra]) == 2
    assert capsys.readouterr().err.strip() == f"forge-convert: {message}"
    assert not out.exists()


def test_forge_runs_closing_table_counts_what_the_view_counts(two_policies, capsys):
    table = outcomes.pass_table(outcomes.outcome_rows(two_policies, "opencode", "qwen3-8b", "step-10"), 3)
    closing = outcomes.rate_rows(table, "opencode", "step-10")
    view = pass_rate_rows(connect(two_policies), Scope(harness="opencode", model="qwen3-8b", policy_version="step-10"))
    assert closing == [{k: r[k] for k in closing[0]} for r in view]
    printer.show(rates_table(closing, "closing"))
    line = next(x for x in capsys.readouterr().out.splitlines() if "greet" in x)
    assert line.split() == ["greet", "opencode", "qwen3-8b", "step-10", "3", "1", "0.333", "0.333", "sometimes"]


def test_a_rerun_with_another_model_is_not_finished(two_policies):
    """forge-run skips the attempts already graded for its harness, model and policy version only."""
    done = outcomes.finished(two_policies, "opencode", "qwen3-8b", "step-10")
    assert ("greet", 0) in done and ("greet", 9) not in done  # attempt 9 was an infra error
    assert outcomes.finished(two_policies, "opencode", "qwen3-32b", "step-10") == set()
