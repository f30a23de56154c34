"""Choosing tasks for RL: per-task pass rates (`forge-analyze pass-rates`) and `forge-convert --solve-rate MIN:MAX`.

The bundled example dataset (`analysis/example`, copied: reading may upgrade
it) holds graded outcomes of six tasks: `greet` passes 3 of 3, `summarise` 0
of 3, the other four some of their attempts (`list-files` 1 of 2 scored,
its third rollout an infra error, which is not an attempt).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forgerl.analysis import connect
from forgerl.analysis.cli import main as analyze
from forgerl.analysis.pass_rates import pass_rate_rows, solved
from forgerl.converters.cli import main as convert

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
    assert [c.strip() for c in line.strip("│ ").split("│")] == ["list-files", "claude-code", "(none)", "2", "1",
                                                                 "0.500", "0.500", "sometimes"]
    assert analyze(["pass-rates", str(example), "--policy-version", "v9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "forge-analyze: no scored attempts for policy version v9 and harness any (policy versions: (none))"


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
