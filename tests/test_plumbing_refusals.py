"""Broken plumbing is refused, deterministically (issue 35): a template at serve time that is not the one the
policy was trained with, and rewards joined to sessions they were not earned in.

The faults are injected with the test-only shims of `tests/faults/plumbing.py`: a checkpoint folder whose
template was edited after training, and a real `forge-run` dataset (pi, two QwenClawBench tasks, a scripted
model) whose outcomes file is rewritten with rewards on the wrong sessions. The product is run as users run
it: `forge-record serve` and `forge-run` as processes, `forge-convert` through its CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forgerl.converters.cli import main as convert
from forgerl.schema.store import read_table
from forgerl.schema.templates import folder_template_sha256

from conftest import FORGE_RECORD, REPO, RecorderProcess
from convert_fixtures import TOKENIZER_DIR
from faults.plumbing import checkpoint, duplicate, edit_template, rewrite_outcomes, set_field, swap_sessions
from harness_checks import needs, sparql_script
from runner_fixtures import BENCH, NOVEL_ANSWER, NOVEL_SCORE, SPARQL_SCORE, SPARQL_TASK, NOVEL_TASK
from scripted_upstream import Request, Turn

FORGE_RUN = str(Path(sys.executable).with_name("forge-run"))
SAID = "You may call one or more functions to assist with the user query."


# ---------------------------------------------------------------- the template at serve time


@pytest.fixture
def trained(tmp_path) -> Path:
    """A checkpoint folder (tokenizer files + forgerl_policy.json) as training left it."""
    return checkpoint(TOKENIZER_DIR, tmp_path / "ckpt")


def serve(folder: Path, tmp_path: Path, *more: str) -> subprocess.CompletedProcess:
    """`forge-record serve --policy script:` with `--tokenizer folder`, expected to refuse before it listens."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["Done."]))
    return subprocess.run([FORGE_RECORD, "serve", "--policy", f"script:{script}", "--tokenizer", str(folder),
                           "--served-model", "m", "--listen", "127.0.0.1:0", "--out", str(tmp_path / "data"), *more],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.slow  # serve mode loads the tokenizer with transformers (~25 s)
def test_the_template_it_was_trained_with_is_served(trained, tmp_path):
    served = RecorderProcess(tmp_path / "data", None, "--policy", f"script:{tmp_path / 'turns.json'}",
                             "--tokenizer", str(trained), "--served-model", "m")
    (tmp_path / "turns.json").write_text(json.dumps(["Done."]))
    served.start()
    log = served.stop()
    assert "note:" not in log and "listening on" in log


def test_another_template_at_serve_time_is_refused(trained, tmp_path):
    trained_sha = folder_template_sha256(trained)
    edit_template(trained, SAID, "You may call functions.")
    served_sha = folder_template_sha256(trained)
    assert served_sha != trained_sha
    r = serve(trained, tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"forge-record: --tokenizer {trained}: serve mode would render chat template sha256 {served_sha} "
                        f"({trained / 'tokenizer_config.json'}) but the policy was trained with sha256 {trained_sha} "
                        f"({trained / 'forgerl_policy.json'} chat_template_sha256): serve it with the tokenizer it "
                        f"was trained with\n")
    assert not (tmp_path / "data").exists()


def test_a_policy_file_that_is_not_json_is_one_line(trained, tmp_path):
    (trained / "forgerl_policy.json").write_text("{ not json")
    r = serve(trained, tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"forge-record: --tokenizer {trained}: {trained}/forgerl_policy.json: "
                                                     "not JSON (") and r.stderr.count("\n") == 1


def test_forge_run_reports_the_refusal_before_any_rollout(trained, tmp_path):
    """forge-run starts the same serve mode: its one line is the recorder's, and no rollout runs."""
    edit_template(trained, SAID, "You may call functions.")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["Done."]))
    r = subprocess.run([FORGE_RUN, str(BENCH), "--task", NOVEL_TASK, "--harness", "pi", "--policy", f"script:{script}",
                        "--tokenizer", str(trained), "--served-model", "m", "--out", str(tmp_path / "data")],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"forge-run: --tokenizer {trained}: serve mode would render chat template sha256 ")
    assert "but the policy was trained with sha256" in last
    assert not list((tmp_path / "data").glob("outcomes/*.parquet"))


@pytest.mark.slow  # serve mode loads the tokenizer with transformers (~25 s)
def test_a_folder_that_names_no_trained_template_is_served_with_a_note(tmp_path):
    served = RecorderProcess(tmp_path / "data", None, "--policy", f"script:{tmp_path / 'turns.json'}",
                             "--tokenizer", str(TOKENIZER_DIR), "--served-model", "m")
    (tmp_path / "turns.json").write_text(json.dumps(["Done."]))
    served.start()
    log = served.stop()
    assert (f"forge-record: note: {TOKENIZER_DIR} has no forgerl_policy.json naming the policy's chat_template_sha256: "
            f"serving with its chat template (sha256 {folder_template_sha256(TOKENIZER_DIR)}) unchecked") in log


@pytest.mark.slow  # the graded forge-run (~25 s, once)
def test_the_shard_manifest_records_the_template_it_rendered(graded, tmp_path):
    manifest = convert_tokens(graded, tmp_path / "shards")
    assert manifest["tokenizer"]["chat_template_sha256"] == folder_template_sha256(TOKENIZER_DIR)
    edited = checkpoint(TOKENIZER_DIR, tmp_path / "edited")
    edit_template(edited, SAID, "You may call functions.")
    other = convert_tokens(graded, tmp_path / "other", tokenizer=edited)
    assert other["tokenizer"]["chat_template_sha256"] == folder_template_sha256(edited) \
        != manifest["tokenizer"]["chat_template_sha256"]


# ---------------------------------------------------------------- rewards joined to sessions


def two_tasks(request: Request) -> Turn:
    """task_00067 through pi's bash tool (14 of 15 checks), task_00043 answered in text (3 of 8)."""
    return sparql_script("bash")(request) if "SPARQL" in str(request.body) else Turn(text=NOVEL_ANSWER)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Path:
    """A real forge-run dataset: pi, one rollout of each of two tasks, policy version v0, graded."""
    from scripted_upstream import ScriptedUpstream

    needs("pi")
    out = tmp_path_factory.mktemp("graded") / "data"
    version = out.parent / "version"
    version.write_text("v0\n")
    with ScriptedUpstream(two_tasks) as up:
        r = subprocess.run([FORGE_RUN, str(BENCH), "--task", SPARQL_TASK, "--task", NOVEL_TASK, "--harness", "pi",
                            "--model", "qwen3", "--upstream", up.url, "--watch", "--rounds", "1",
                            "--policy-version-from", str(version), "--parallel", "2", "--out", str(out)],
                           capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {o["task_id"]: o for o in read_table(out, "outcomes").to_pylist()}
    assert {t: (pytest.approx(o["reward"]), o["policy_version"]) for t, o in rows.items()} == {
        SPARQL_TASK: (SPARQL_SCORE, "v0"), NOVEL_TASK: (NOVEL_SCORE, "v0")}
    assert {c["policy_version"] for c in read_table(out, "calls", ["policy_version"]).to_pylist()} == {"v0"}
    return out


def convert_tokens(data: Path, out: Path, tokenizer: Path = TOKENIZER_DIR) -> dict:
    assert convert([str(data), "--to", "tokens", "--tokenizer", str(tokenizer), "--out", str(out), "--no-progress",
                    "--val-fraction", "0"]) == 0
    return json.loads((out / "manifest.json").read_text())


def faulty(graded: Path, where: Path, change) -> Path:
    copy = where / "data"
    shutil.copytree(graded, copy)
    rewrite_outcomes(copy, change)
    return copy


def refused(data: Path, out: Path, capsys) -> str:
    """forge-convert's one line refusing `data`, after checking it exits 2 and writes nothing."""
    capsys.readouterr()
    assert convert([str(data), "--to", "tokens", "--tokenizer", str(TOKENIZER_DIR), "--out", str(out),
                    "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    return err.strip()


@pytest.mark.slow  # the graded forge-run (~25 s, once)
def test_each_reward_joins_exactly_its_own_session(graded, tmp_path):
    manifest = convert_tokens(graded, tmp_path / "shards")
    assert manifest["joins"] == {"outcome_rows": 2, "repeated_rows": 0, "joined": 2, "outcomes_without_session": 0,
                                 "rollouts_without_outcome": 0, "several_outcomes": 0, "task_disagrees": 0,
                                 "harness_disagrees": 0, "policy_version_disagrees": 0}
    outcomes = {o["session_id"]: o["reward"] for o in read_table(graded, "outcomes").to_pylist()}
    rows = [r for f in sorted((tmp_path / "shards" / "train").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert rows and {r["session_id"]: r["reward"] for r in rows} == outcomes


@pytest.mark.slow  # the graded forge-run (~25 s, once)
def test_rewards_swapped_between_two_tasks_rollouts_are_refused(graded, tmp_path, capsys):
    data = faulty(graded, tmp_path, swap_sessions(0, 1))
    err = refused(data, tmp_path / "shards", capsys)
    (first, _), (_, task) = sorted((o["session_id"], o["task_id"]) for o in read_table(graded, "outcomes").to_pylist())
    assert err == ("forge-convert: rewards cannot be joined to exactly their sessions' rows: outcomes whose task or "
                   f"attempt is not the one their session is named for: 2, e.g. the outcome of {task} attempt 0 is "
                   f"joined to session {first} (outcome rows 2, joined 0, without a session 0, rollouts without an "
                   "outcome 0); fix or remove those outcome rows (forge-record delete)")


@pytest.mark.slow  # the graded forge-run (~25 s, once)
def test_a_second_outcome_for_one_session_is_refused(graded, tmp_path, capsys):
    data = faulty(graded, tmp_path, duplicate(0, reward=1.0, status="success", passed=True, attempt=1))
    err = refused(data, tmp_path / "shards", capsys)
    assert ": sessions with several outcomes: 1, e.g. session " in err
    assert "(outcome rows 3, joined 1, " in err


@pytest.mark.slow  # the graded forge-run (~25 s, once)
@pytest.mark.parametrize("field, value, kind", [
    ("harness", "claude-code", "outcomes whose harness is not their session's: 1, e.g. session {s}: outcome "
                               "claude-code, calls pi"),
    ("policy_version", "v1", "outcomes whose policy version is not their session's calls': 1, e.g. session {s}: "
                             "outcome v1, calls v0"),
])
def test_an_outcome_that_disagrees_with_its_sessions_calls_is_refused(graded, tmp_path, capsys, field, value, kind):
    data = faulty(graded, tmp_path, set_field(1, **{field: value}))
    session = sorted(o["session_id"] for o in read_table(graded, "outcomes").to_pylist())[1]
    err = refused(data, tmp_path / "shards", capsys)
    assert f"rows: {kind.format(s=session)} (outcome rows 2, joined 1, " in err


@pytest.mark.slow  # the graded forge-run (~25 s, once)
def test_what_a_runner_legitimately_leaves_is_counted_not_refused(graded, tmp_path):
    """A row written twice counts once; a retried try's session has no outcome; an outcome whose session never
    reached the model (an infra error) joins no row."""
    def change(rows):
        rows = sorted(rows, key=lambda r: r["session_id"])
        never = {**rows[1], "session_id": f"{rows[1]['task_id'][:48]}-a0-0123abcd", "status": "infra_error", "reward": None,
                 "passed": None}
        return [rows[0], rows[0], never]
    manifest = convert_tokens(faulty(graded, tmp_path, change), tmp_path / "shards")
    assert manifest["joins"] == {"outcome_rows": 3, "repeated_rows": 1, "joined": 1, "outcomes_without_session": 1,
                                 "rollouts_without_outcome": 1, "several_outcomes": 0, "task_disagrees": 0,
                                 "harness_disagrees": 0, "policy_version_disagrees": 0}


def test_the_bundled_example_refuses_a_second_outcome_on_a_session(tmp_path, capsys):
    """Without a forge-run: the bundled example's recorded sessions, one of them graded twice (once as a codex
    rollout, which its calls are not)."""
    data = faulty(REPO / "analysis" / "example", tmp_path, duplicate(0, attempt=9, reward=1.0))
    err = refused(data, tmp_path / "shards", capsys)
    assert err.startswith("forge-convert: rewards cannot be joined to exactly their sessions' rows: sessions with "
                          "several outcomes: 1, e.g. session cc-errors-out-a1: list-files attempt 1, list-files attempt 9 "
                          "(outcome rows 19, joined 17, ")
    data = faulty(REPO / "analysis" / "example", tmp_path / "harness", set_field(0, harness="codex"))
    err = refused(data, tmp_path / "shards", capsys)
    assert ("outcomes whose harness is not their session's: 1, e.g. session cc-errors-out-a1: outcome codex, calls "
            "claude-code (outcome rows 18, joined 17, ") in err
