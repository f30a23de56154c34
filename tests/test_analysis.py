"""Behaviour views against hand-labelled sessions recorded through `forge-record serve`, and pass@k by brute force."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from forgerl.analysis import VIEWS, connect, kinds
from forgerl.analysis.reliability import pass_at_k, pass_pow_k
from forgerl.schema.store import init_root
from forgerl.schema.writer import DatasetWriter

from analysis_fixtures import EXPECTED, EXPECTED_PASS_K, record_fixtures
from conftest import REPO

FORGE_ANALYZE = str(Path(sys.executable).with_name("forge-analyze"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("analysis") / "data"
    record_fixtures(root)
    return root


def metrics(root: Path) -> dict[str, dict]:
    con = connect(root)
    cur = con.execute("SELECT * FROM session_metrics")
    names = [d[0] for d in cur.description]
    return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}


@pytest.mark.parametrize("session", sorted(EXPECTED))
def test_session_metrics_match_hand_labels(dataset, session):
    got = metrics(dataset)[session]
    for key, want in EXPECTED[session].items():
        if isinstance(want, float):
            assert got[key] == pytest.approx(want), (session, key, got[key], want)
        else:
            assert got[key] == want, (session, key, got[key], want)


def test_tool_calls_carry_kinds_targets_and_checks(dataset):
    con = connect(dataset)
    rows = con.execute("SELECT turn, pos, tool_name, kind, target, check_kind FROM tool_calls "
                       "WHERE session_id = 'codex-patch' ORDER BY step").fetchall()
    assert rows == [
        (1, 1, "update_plan", "plan", "update_plan", None),
        (2, 1, "apply_patch", "write", "hello.py", None),
        (3, 1, "exec_command", "shell", "python hello.py", "run"),
        (4, 1, "apply_patch", "write", "hello.py", None),
        (5, 1, "exec_command", "shell", "python hello.py", "run"),
        (6, 1, "update_plan", "plan", "update_plan", None),
    ]
    parallel = con.execute("SELECT turn, list(pos ORDER BY pos), list(target ORDER BY pos) FROM tool_calls "
                           "WHERE session_id = 'cc-giveup-parallel' GROUP BY turn").fetchall()
    assert parallel == [(1, [1, 2, 3], ["/w/missing.txt", "TODO", "*.py"])]
    failed = con.execute("SELECT tool_call_id, is_error, exit_code, failed FROM tool_results "
                         "WHERE session_id = 'cc-recover2' ORDER BY tool_call_id").fetchall()
    assert failed == [("toolu_r1", True, 1, True), ("toolu_r2", False, 1, True), ("toolu_r3", False, None, False),
                      ("toolu_r4", False, None, False), ("toolu_r5", False, None, False)]
    reasons = con.execute("SELECT session_id, harness_reason FROM user_turns WHERE written_by = 'harness' "
                          "ORDER BY 1").fetchall()
    assert reasons == [("cc-subagent", "subagent_prompt"), ("cc-verify", "system_reminder"),
                       ("codex-patch", "environment")]


def test_pass_k_view_matches_labels(dataset):
    con = connect(dataset)
    got = {(t, k): (a, p) for t, k, a, p in con.execute("SELECT task, k, pass_at_k, pass_pow_k FROM pass_k").fetchall()}
    assert got.keys() == EXPECTED_PASS_K.keys()
    for key, want in EXPECTED_PASS_K.items():
        assert got[key] == pytest.approx(want), key


def _brute(outcomes: list[bool], k: int) -> tuple[float, float]:
    subsets = list(itertools.combinations(outcomes, k))
    return (sum(any(s) for s in subsets) / len(subsets), sum(all(s) for s in subsets) / len(subsets))


def test_pass_at_k_against_brute_force(tmp_path):
    rng = random.Random(7)
    tables = {f"t{i}": [rng.random() < rng.random() for _ in range(rng.randint(1, 9))] for i in range(25)}
    now = datetime.now(timezone.utc)
    with DatasetWriter(tmp_path, source="runner") as w:
        for task, results in tables.items():
            for attempt, passed in enumerate(results):
                w.add_outcome({"session_id": f"{task}-{attempt}", "task_id": task, "attempt": attempt, "harness": "h",
                               "model": "m", "status": "success" if passed else "failed",
                               "reward": 1.0 if passed else 0.0, "passed": passed, "t_start": now, "t_end": now})
            w.add_outcome({"session_id": f"{task}-infra", "task_id": task, "attempt": 99, "harness": "h",
                           "model": "m", "status": "infra_error", "t_start": now, "t_end": now})
    view = {(t, k): (a, p) for t, k, a, p in
            connect(tmp_path).execute("SELECT task, k, pass_at_k, pass_pow_k FROM pass_k").fetchall()}
    assert len(view) == sum(len(r) for r in tables.values())  # k = 1..n, infra errors not counted
    for task, results in tables.items():
        n, c = len(results), sum(results)
        for k in range(1, n + 1):
            want = _brute(results, k)
            assert (pass_at_k(n, c, k), pass_pow_k(n, c, k)) == pytest.approx(want)
            assert view[(task, k)] == pytest.approx(want), (task, k)


def test_empty_dataset_has_every_view(tmp_path):
    init_root(tmp_path)
    con = connect(tmp_path)
    for view in VIEWS:
        assert con.execute(f"SELECT count(*) FROM {view.name}").fetchone() == (0,), view.name
    r = analyze("report", str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert r.returncode == 0 and "(no sessions)" in r.stdout and "Warning" not in r.stderr, r.stderr
    assert (tmp_path / "r.html").read_text().count("<svg") == 3


def test_kind_table_and_docs_cover_every_name():
    assert set(kinds.TOOL_KINDS.values()) <= set(kinds.KINDS)
    readme = (REPO / "analysis" / "README.md").read_text()
    for view in VIEWS:
        assert f"`{view.name}`" in readme, f"{view.name} is not documented in analysis/README.md"
    for name in kinds.CHECK_COMMANDS:
        assert f"`{name}`" in readme


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FORGE_ANALYZE, *args], capture_output=True, text=True, timeout=120)


def test_report_and_sql_verbs(dataset, tmp_path):
    out = tmp_path / "report.html"
    r = analyze("report", str(dataset), "--by", "harness", "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["harness", "sessions", "turns"]
    codex = next(line.split() for line in lines if line.startswith("codex"))
    assert codex[1:5] == ["1", "7", "100%", "1.00"]
    page = out.read_text()
    assert page.count("<svg") == 3 and "<script" not in page and "http" not in page.split("<svg")[0]
    for by in ("model", "task"):
        r = analyze("report", str(dataset), "--by", by)
        assert r.returncode == 0 and r.stdout.startswith(by), r.stderr
    r = analyze("sql", str(dataset), "SELECT session_id, turns FROM session_metrics ORDER BY 1", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert {"session_id": "cc-verify", "turns": 6} in __import__("json").loads(r.stdout)
    r = analyze("sql", str(dataset), "SELECT kind, count(*) AS n FROM tool_calls GROUP BY 1 ORDER BY 1",
                "--format", "csv")
    # by hand: shell = 1 + 3 + 1 (Claude) + 2 (Codex); write = 1 + 2 + 2; plan = 2 + 3 + 2
    assert r.stdout.splitlines() == ["kind,n", "plan,7", "read,2", "search,3", "shell,7", "subagent,1", "write,5"]
    r = analyze("sql", str(dataset), "SELECT 1 AS one")
    assert r.stdout.splitlines() == ["one", "───", "  1"]  # a number, right-aligned


def test_bad_input_is_one_clear_line(dataset, tmp_path):
    out = tmp_path / "never.html"
    cases = [
        (("report", str(tmp_path)), "not a forgerl dataset"),
        (("report", str(tmp_path / "missing")), "no such directory"),
        (("report", str(dataset), "--by", "colour", "--out", str(out)), "unknown --by column 'colour'"),
        (("report", str(dataset), "--out", str(tmp_path / "no" / "r.html")), "no such directory"),
        (("sql", str(dataset), "SELECT nope FROM calls"), "SQL error"),
        (("sql", str(dataset), "SELEC 1"), "SQL error"),
        (("sql", str(dataset), "SELECT 1", "--format", "xml"), "unknown --format"),
        (("sql", str(tmp_path), "SELECT 1"), "not a forgerl dataset"),
    ]
    for args, message in cases:
        r = analyze(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == "", (args, r.stdout)
    assert not out.exists()
