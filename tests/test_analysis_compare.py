"""Comparisons with uncertainty: the bootstrap against known distributions, and `compare` / `report --by` on two
policy versions recorded through `forge-record serve --policy-version`.

The recorded dataset plays tests/analysis_scenarios.py sessions on three
tasks, two attempts each, under policy v1 (labelled stage=early) and v2
(stage=late). The expected values below are worked out by hand from the
scenarios' hand labels (tests/analysis_fixtures.py) and the rewards here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from forgerl.analysis import connect
from forgerl.analysis.cli import main
from forgerl.analysis.compare import Side, compare, learning_curves, paired, percentile_interval, ratio, resample
from forgerl.analysis.learning import pass_rate_curves
from forgerl.analysis.tasksets import TaskSet
from forgerl.schema.writer import DatasetWriter

import analysis_fixtures as fixtures
import analysis_scenarios as scenarios
from conftest import RecorderProcess, session_calls
from scripted_upstream import ScriptedUpstream

FORGE_ANALYZE = str(Path(sys.executable).with_name("forge-analyze"))

# --- the interval code against known distributions --------------------------------------------------------------


def test_bernoulli_mean_interval_covers_at_the_nominal_rate():
    """Over 400 seeded samples of 80 Bernoulli(0.3) draws, the 95% bootstrap interval of the mean holds the true
    mean about 95% of the time (binomial sd of the rate: 1.1 points), and its bounds sit on the analytic Wald
    interval's: same centre, same width to within a few percent."""
    rng = np.random.default_rng(12345)
    p, n, covered, gaps = 0.3, 80, 0, []
    ones = np.ones(n)
    for seed in range(400):
        x = (rng.random(n) < p).astype(float)
        ci = percentile_interval(ratio(x, ones, resample(n, 2000, seed)), 0.95)
        covered += ci.low <= p <= ci.high
        mean, half = x.mean(), 1.959964 * math.sqrt(x.mean() * (1 - x.mean()) / n)
        gaps.append(max(abs(ci.low - (mean - half)), abs(ci.high - (mean + half))))
    assert 0.92 <= covered / 400 <= 0.975, covered
    assert np.median(gaps) < 0.015, np.median(gaps)


def test_paired_difference_interval_covers_the_true_difference():
    """Tasks whose difficulty varies, shared by both sides, and B passing each 0.1 more often: over 1000 seeded
    replicates the paired 90% interval of B - A holds 0.1 at about the nominal rate (sd of the rate: 0.95 points),
    its bounds sit on the analytic paired-difference normal interval's, and it is narrower than resampling the two
    sides independently."""
    rng = np.random.default_rng(7)
    tasks, covered, gaps, widths, unpaired = 60, 0, [], [], []
    ones = np.ones(tasks)
    for seed in range(1000):
        difficulty = rng.uniform(0.1, 0.8, tasks)
        a = (rng.random(tasks) < difficulty).astype(float)
        b = (rng.random(tasks) < difficulty + 0.1).astype(float)
        draws = resample(tasks, 1000, seed)
        va, vb, delta, _, _, ci = paired(a, ones, b, ones, draws, 0.9)
        assert (va, vb, delta) == pytest.approx((a.mean(), b.mean(), b.mean() - a.mean()))
        covered += ci.low <= 0.1 <= ci.high
        d = b - a
        half = 1.644854 * d.std(ddof=1) / math.sqrt(tasks)
        gaps.append(max(abs(ci.low - (d.mean() - half)), abs(ci.high - (d.mean() + half))))
        widths.append(ci.high - ci.low)
        if seed < 200:
            other = resample(tasks, 1000, seed + 10_000)
            ind = percentile_interval(ratio(b, ones, other) - ratio(a, ones, draws), 0.9)
            unpaired.append(ind.high - ind.low)
    assert 0.87 <= covered / 1000 <= 0.93, covered
    assert np.median(gaps) < 0.015, np.median(gaps)
    assert np.mean(widths[:200]) < 0.95 * np.mean(unpaired)


def test_interval_edges():
    assert percentile_interval(np.array([np.nan] * 6 + [1.0] * 4), 0.95) is None  # most replicates undefined
    ci = percentile_interval(np.array([np.nan] * 4 + list(range(6))), 0.5)
    assert (ci.low, ci.high) == (1.25, 3.75)
    assert math.isnan(ratio(np.zeros(3), np.zeros(3)))
    draws = resample(5, 10, 3)
    assert draws.shape == (10, 5) and (draws == resample(5, 10, 3)).all() and not (draws == resample(5, 10, 4)).all()


# --- two policy versions, recorded ------------------------------------------------------------------------------

# (policy version, task) -> [(scenario, reward) per attempt]
PLAYS = {
    ("v1", "t-fix"): [("cc-recover2", 0.5), ("cc-giveup-parallel", 0.0)],
    ("v1", "t-sum"): [("cc-giveup-parallel", 0.0), ("cc-giveup-parallel", 0.0)],
    ("v1", "t-greet"): [("codex-patch", 1.0), ("codex-patch", 0.0)],
    ("v2", "t-fix"): [("cc-verify", 1.0), ("cc-verify", 1.0)],
    ("v2", "t-sum"): [("cc-recover2", 1.0), ("cc-giveup-parallel", 0.0)],
    ("v2", "t-greet"): [("codex-patch", 1.0), ("codex-patch", 1.0)],
}
CALLS = {"cc-recover2": 6, "cc-giveup-parallel": 2, "codex-patch": 7, "cc-verify": 6}
# By hand from the scenarios' labels. v1: writes in recover2 (unverified) and 2 x codex-patch (verified) -> 2/3;
# episodes: recover2 1 recovered, 3 x giveup 1 given up, 2 x codex 1 recovered -> 3/6.
# v2: 2 x cc-verify + 2 x codex verified, recover2 not -> 4/5; episodes: recover2 1 rec, giveup 1 lost, codex 2 rec
# -> 3/4. pass@1 per task: v1 (0, 0, 1/2), v2 (1, 1/2, 1); pass@2: v1 (0, 0, 1), v2 (1, 1, 1); pass^2 v2 (1, 0, 1).
EXPECTED = {
    "verification_rate": (2 / 3, 4 / 5), "recovery_rate": (3 / 6, 3 / 4), "give_up_rate": (3 / 6, 1 / 4),
    "pass@1": (1 / 6, 5 / 6), "pass@2": (1 / 3, 1.0), "pass^1": (1 / 6, 5 / 6), "pass^2": (0.0, 2 / 3),
}


def _scenario(name: str) -> scenarios.Scenario:
    return next(s for s in scenarios.scenarios() if s.session == name)


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare") / "data"
    rows = []
    with ScriptedUpstream(scenarios.script) as up:
        for version, stage in (("v1", "early"), ("v2", "late")):
            rec = RecorderProcess(root, up.url, "--policy-version", version, "--labels",
                                  json.dumps({"stage": stage})).start()
            try:
                for (v, task), plays in PLAYS.items():
                    if v != version:
                        continue
                    for attempt, (name, reward) in enumerate(plays, 1):
                        session = f"{version}-{task}-a{attempt}"
                        scenarios.play(_scenario(name), rec.base(session))
                        session_calls(root, session, CALLS[name])
                        row = scenarios.outcome(_scenario(name), session, task, attempt, reward)
                        # v1's runner did not stamp the version: the sessions' calls carry it
                        rows.append({**row, "policy_version": version if version == "v2" else None})
            finally:
                rec.stop()
    with DatasetWriter(root, source="runner") as w:
        for row in rows:
            w.add_outcome(row)
    return root


def test_compare_policy_versions_matches_hand_labels(versions):
    c = compare(connect(versions, materialize=True), Side("policy_version", "v1"), Side("policy_version", "v2"),
                resamples=4000, seed=1)
    assert c.tasks == ["t-fix", "t-greet", "t-sum"]
    rows = {r.metric: r for r in c.rows}
    assert [m for m in rows if m.startswith("pass")] == ["pass@1", "pass^1", "pass@2", "pass^2"]
    for metric, (a, b) in EXPECTED.items():
        r = rows[metric]
        assert (r.a, r.b, r.delta) == pytest.approx((a, b, b - a)), metric
        for point, ci in ((r.a, r.a_ci), (r.b, r.b_ci), (r.delta, r.delta_ci)):
            assert ci.low <= point <= ci.high, (metric, point, ci)
    # pass@1's per-task differences are (1, 1/2, 1/2): a resampled mean is 1/2 with probability (2/3)^3 and 1 with
    # (1/3)^3, both above 2.5%, so the 95% interval runs exactly from 1/2 to 1.
    assert (rows["pass@1"].delta_ci.low, rows["pass@1"].delta_ci.high) == pytest.approx((0.5, 1.0))
    again = compare(connect(versions), Side("policy_version", "v1"), Side("policy_version", "v2"),
                    resamples=4000, seed=1)
    assert [r.as_dict() for r in again.rows] == [r.as_dict() for r in c.rows]  # seeded: same intervals


def test_grouping_by_version_label_and_outcome(versions, capsys):
    con = connect(versions)
    assert con.execute("SELECT DISTINCT policy_version FROM session_info ORDER BY 1").fetchall() == [("v1",), ("v2",)]
    curve = {(r["harness"], r["policy_version"]): r for r in learning_curves(con)}
    assert set(curve) == {("claude-code", "v1"), ("claude-code", "v2"), ("codex", "v1"), ("codex", "v2")}
    # claude-code alone: v1 writes only in recover2 (unverified) -> 0; v2 2 x cc-verify of 3 -> 2/3
    assert curve[("claude-code", "v1")]["verification_rate"] == 0.0
    assert curve[("claude-code", "v2")]["verification_rate"] == pytest.approx(2 / 3)
    assert main(["report", str(versions), "--by", "stage"]) == 0  # in-process: the verb's own wrapper
    metrics, curves = capsys.readouterr().out.split("\n\n")  # the metrics, then pass rate per policy version
    lines = {line.split()[0]: line.split() for line in metrics.splitlines()[2:]}  # header, rule
    assert lines["early"][1] == "6" and lines["late"][1] == "6"
    assert lines["early"][10] == "17%" and lines["late"][10] == "83%"  # pass@1, as in EXPECTED
    # per harness and version (every task, one split): claude-code v1 passes 0 of 2 tasks' attempts, v2 3 of 4
    assert [line.split()[:7] for line in curves.splitlines()[3:]] == [
        ["claude-code", "all", "v1", "2", "4", "0", "0%"], ["claude-code", "all", "v2", "2", "4", "3", "75%"],
        ["codex", "all", "v1", "1", "2", "1", "50%"], ["codex", "all", "v2", "1", "2", "2", "100%"]]
    assert main(["report", str(versions), "--by", "status"]) == 0
    metrics = capsys.readouterr().out.split("\n\n")[0]
    assert {line.split()[0] for line in metrics.splitlines()[2:]} == {"failed", "success"}


def test_report_html_shows_what_changed(versions, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(versions), "--by", "policy_version", "--out", str(out)]) == 0
    metrics = capsys.readouterr().out.split("\n\n")[0]
    assert [line.split()[0] for line in metrics.splitlines()[2:]] == ["v1", "v2"]  # header, rule
    page = out.read_text()
    assert 'id="what-changed"' in page and 'id="changes"' in page and 'id="learning-curves"' in page
    assert 'id="pass-rates"' in page and 'id="pass-rate-curves"' in page
    changes = page.split('id="changes"')[1].split("</table>")[0]
    assert "<td>pass@1</td><td>17%</td>" in changes
    assert "<td>+67%</td><td>[50%, 100%]</td>" in changes
    assert page.count("<svg") == 5


@pytest.mark.slow
def test_what_changed_renders_in_headless_chromium(versions, tmp_path):
    """The section's table and learning-curve panels draw in a real browser, with no console errors."""
    from test_analysis_report import render

    page = tmp_path / "r.html"
    assert analyze("report", str(versions), "--out", str(page)).returncode == 0
    problems, plots = render(page, tmp_path / "r.png")
    assert problems == []
    assert [p["id"] for p in plots] == ["metric-bars", "pass-curves", "tool-kinds", "pass-rate-curves",
                                       "learning-curves"]
    for curves in plots[-2:]:
        assert curves["width"] > 300 and curves["height"] > 150 and curves["shapes"] > 20, curves


def test_compare_cli(versions, capsys):
    r = analyze("compare", str(versions), "--a", "policy_version=v1", "--b", "policy_version=v2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tasks"] == ["t-fix", "t-greet", "t-sum"] and doc["seed"] == 0 and doc["resamples"] == 2000
    got = {m["metric"]: m for m in doc["metrics"]}
    assert got["recovery_rate"]["delta"] == pytest.approx(0.25) and len(got["recovery_rate"]["delta_ci"]) == 2
    assert main(["compare", str(versions), "--a", "stage=early", "--b", "stage=late"]) == 0
    out = capsys.readouterr().out
    assert "3 paired tasks" in out and "verify" in out and "pass^2" in out
    for args, message in [
        (("--a", "policy_version=v1", "--b", "colour=red"), "unknown --b column 'colour'; choose one of: harness"),
        (("--a", "policy_version", "--b", "policy_version=v2"), "--a 'policy_version': expected COLUMN=VALUE"),
        (("--a", "policy_version=v1", "--b", "policy_version=v9"), "no sessions have policy_version=v9"),
        (("--a", "policy_version=v1", "--b", "task=t-fix"), None),
        (("--a", "task=t-sum", "--b", "task=t-fix"), "share no task"),
        (("--a", "policy_version=v1", "--b", "policy_version=v2", "--confidence", "95"), "--confidence must be"),
    ]:
        code = main(["compare", str(versions), *args])  # in-process: the same wrapper as the installed verb
        out, err = capsys.readouterr()
        if message is None:
            assert code == 0 and "paired tasks" in out, err
            continue
        assert code == 2 and message in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and out == "", (args, out)


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FORGE_ANALYZE, *args], capture_output=True, text=True, timeout=120)


# --- learning curves and comparisons on held-out tasks (tests/analysis_fixtures.py record_learning) ---------------


@pytest.fixture(scope="module")
def learning(tmp_path_factory) -> tuple[Path, Path]:
    """Three policy versions, two harnesses, four train and four held-out tasks; and a file naming the held-out
    ones (plus an id the dataset never ran, which a task set may name)."""
    root = tmp_path_factory.mktemp("learning") / "data"
    fixtures.record_learning(root)
    ids = root.parent / "heldout.txt"
    ids.write_text("# held-out tasks\n" + "\n".join(fixtures.LEARN_HELDOUT) + "\nho-never-run\n")
    return root, ids


def _rates(points) -> dict[tuple[str, str, str], float]:
    return {(p.harness, p.split, p.policy_version): p.pass_rate for p in points}


def test_learning_curves_split_held_out_from_train(learning):
    root, ids = learning
    con = connect(root, materialize=True)
    held = TaskSet.from_options(str(ids), None)
    points = pass_rate_curves(con, held, resamples=4000, seed=1)
    # by hand (analysis_fixtures.LEARN_PASSES): train / held-out per harness and version
    expected = {("claude-code", "v0"): (0, 0), ("claude-code", "v1"): (1, 1 / 2), ("claude-code", "v2"): (1, 1),
                ("codex", "v0"): (1 / 4, 0), ("codex", "v1"): (1 / 2, 1 / 4), ("codex", "v2"): (3 / 4, 1 / 2)}
    assert _rates(points) == pytest.approx({(h, split, v): rates[i] for (h, v), rates in expected.items()
                                            for i, split in enumerate(("train", "held-out"))})
    # ordered by harness, held-out first, then version; four tasks of one attempt each per point
    assert [(p.harness, p.split, p.policy_version) for p in points][:4] == [
        ("claude-code", "held-out", "v0"), ("claude-code", "held-out", "v1"), ("claude-code", "held-out", "v2"),
        ("claude-code", "train", "v0")]
    assert {(p.tasks, p.attempts) for p in points} == {(4, 4)}
    ci = {(p.harness, p.split, p.policy_version): (p.interval.low, p.interval.high) for p in points}
    assert ci[("claude-code", "held-out", "v0")] == (0, 0) and ci[("claude-code", "held-out", "v2")] == (1, 1)
    # codex train v0 passes 1 of 4 tasks: a resampled mean is 0 with probability (3/4)^4 = 32% and 1 only with
    # 0.4%, 3/4 or more with 5%: the 95% interval runs from 0 to 3/4
    assert ci[("codex", "train", "v0")] == pytest.approx((0, 0.75))
    # without a task set the same attempts pool: claude-code v1 passes 6 of 8
    whole = _rates(pass_rate_curves(con))
    assert whole[("claude-code", "all", "v1")] == pytest.approx(0.75) and whole[("codex", "all", "v2")] == 0.625
    glob = _rates(pass_rate_curves(con, TaskSet.from_options(None, "ho-*")))
    assert glob == _rates(points)


def test_compare_per_harness_on_held_out_tasks(learning, capsys):
    root, ids = learning
    base = ["compare", str(root), "--a", "policy_version=v0", "--b", "policy_version=v1", "--per", "harness"]
    r = analyze(*base, "--task-ids", str(ids), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["per"] == "harness" and doc["skipped"] == []
    groups = {g["harness"]: g for g in doc["groups"]}
    assert list(groups) == ["claude-code", "codex"]
    for harness, (a, b) in {"claude-code": (0, 0.5), "codex": (0, 0.25)}.items():
        g = groups[harness]
        assert g["tasks"] == list(fixtures.LEARN_HELDOUT) and g["where"] == [f"harness={harness}"]
        pass1 = next(m for m in g["metrics"] if m["metric"] == "pass@1")
        assert (pass1["a"], pass1["b"], pass1["delta"]) == pytest.approx((a, b, b - a))
    # claude-code's held-out differences are (1, 1, 0, 0): a resampled mean is 0 or 1 with 1/16 each, so the 95%
    # interval is [0, 1]
    pass1 = next(m for m in groups["claude-code"]["metrics"] if m["metric"] == "pass@1")
    assert pass1["delta_ci"] == pytest.approx([0.0, 1.0])
    # every task: claude-code's v1 passes 6 of 8, not 2 of 4 -- the filter is what changes the numbers
    assert main([*base, "--json"]) == 0
    whole = {g["harness"]: g for g in json.loads(capsys.readouterr().out)["groups"]}
    assert len(whole["claude-code"]["tasks"]) == 8
    assert next(m for m in whole["claude-code"]["metrics"] if m["metric"] == "pass@1")["delta"] == 0.75
    assert main([*base, "--task-glob", "ho-*"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pass@1 per harness on tasks matching 'ho-*': policy_version=v0 (A)")
    assert out[3].split() == ["claude-code", "4", "0%", "[0%,", "0%]", "50%", "[0%,", "100%]", "+50%", "[0%,", "100%]"]
    assert out[4].split()[:2] == ["codex", "4"] and len(out) == 5
    # a harness on which one side has no sessions is left out and named under the table
    assert main(["compare", str(root), "--a", "policy_version=v1", "--b", "harness=codex", "--per", "harness",
                 "--task-ids", str(ids)]) == 0
    out = capsys.readouterr().out
    assert "harness=claude-code: no sessions have harness=codex and harness=claude-code" in out


def test_report_prints_and_draws_learning_curves(learning, tmp_path, capsys):
    root, ids = learning
    page = tmp_path / "r.html"
    assert main(["report", str(root), "--task-ids", str(ids), "--out", str(page)]) == 0
    out = capsys.readouterr().out
    curves = out.split("\n\n")[1].splitlines()
    assert curves[0].startswith("pass rate per policy version") and "held-out = the 5 tasks of" in curves[0]
    rows = [line.split() for line in curves[3:]]
    assert [r[:3] for r in rows[:3]] == [["claude-code", "held-out", "v0"], ["claude-code", "held-out", "v1"],
                                         ["claude-code", "held-out", "v2"]]
    assert rows[1][3:7] == ["4", "4", "2", "50%"] and rows[4][3:7] == ["4", "4", "4", "100%"]  # train v1
    html = page.read_text()
    table = html.split('id="pass-rates"')[1].split("</table>")[0]
    assert "".join(f"<td>{v}</td>" for v in ("codex", "train", "v0", 4, 4, 1, "25%", "[0%, 75%]")) in table
    assert 'id="pass-rate-curves"' in html and html.count("<svg") == 5
    # "what changed" (v0 against v2) runs on the held-out tasks: claude-code and codex pass 6 of 8 there
    changes = html.split('id="changes"')[1].split("</table>")[0]
    assert "<td>pass@1</td><td>0%</td><td>[0%, 0%]</td><td>75%</td>" in changes and "<td>+75%</td>" in changes
    # no task set: one "all" split, and what changed runs on all 8 tasks (v2 passes 13 of 16, v0 1 of 16)
    assert main(["report", str(root), "--out", str(page)]) == 0
    assert {line.split()[1] for line in capsys.readouterr().out.split("\n\n")[1].splitlines()[3:]} == {"all"}
    changes = page.read_text().split('id="changes"')[1].split("</table>")[0]
    assert "<td>pass@1</td><td>6%</td>" in changes and "<td>81%</td>" in changes


def test_bad_task_sets_are_one_line_errors(learning, tmp_path, capsys):
    root, ids = learning
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    (tmp_path / "other.txt").write_text("fix-calc\ngreet\n")
    page = tmp_path / "r.html"
    compare_args = ["compare", str(root), "--a", "policy_version=v0", "--b", "policy_version=v1"]
    for args, message in [
        (["--task-ids", str(tmp_path / "missing.txt")], "cannot read it (No such file or directory)"),
        (["--task-ids", str(tmp_path)], "cannot read it (Is a directory)"),
        (["--task-ids", str(tmp_path / "empty.txt")], "no task ids in it (one a line)"),
        (["--task-ids", str(tmp_path / "other.txt")], "none of the dataset's 8 graded tasks is in the 2 tasks of"),
        (["--task-glob", "nope-*"], "none of the dataset's 8 graded tasks is in tasks matching 'nope-*'"),
        (["--task-glob", " "], "--task-glob: empty pattern"),
        (["--task-ids", str(ids), "--task-glob", "ho-*"], "give --task-ids or --task-glob, not both"),
    ]:
        for verb in (["report", str(root), "--out", str(page)], compare_args, [*compare_args, "--per", "harness"]):
            code = main([*verb, *args])
            out, err = capsys.readouterr()
            assert code == 2 and message in err, (verb, args, err)
            assert len(err.strip().splitlines()) == 1 and out == "" and not page.exists(), (verb, args, out)
    assert main([*compare_args, "--per", "colour"]) == 2
    assert "unknown --per column 'colour'" in capsys.readouterr().err
    # a side no harness has: nothing to pair anywhere
    assert main(["compare", str(root), "--a", "policy_version=v0", "--b", "policy_version=v9", "--per", "harness",
                 "--task-ids", str(ids)]) == 2
    assert "no harness has both sides to pair: harness=claude-code: no sessions have policy_version=v9 and " \
           "harness=claude-code on the 5 tasks of" in capsys.readouterr().err


@pytest.mark.slow
def test_held_out_curves_render_in_headless_chromium(learning, tmp_path):
    """The pass-rate table and its two panels (held-out, train) draw in a real browser, with no console errors."""
    from test_analysis_report import render

    root, ids = learning
    page = tmp_path / "r.html"
    assert analyze("report", str(root), "--task-ids", str(ids), "--out", str(page)).returncode == 0
    problems, plots = render(page, tmp_path / "r.png")
    assert problems == []
    curves = next(p for p in plots if p["id"] == "pass-rate-curves")
    assert curves["width"] > 600 and curves["height"] > 200 and curves["shapes"] > 30, curves
    svg = page.read_text().split('id="pass-rate-curves"')[1]
    assert "<!-- held-out tasks -->" in svg and "<!-- train tasks -->" in svg  # the panels' titles, as matplotlib marks
