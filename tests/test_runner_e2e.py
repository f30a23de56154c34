"""`forge-run` end to end: real harness CLIs (npm), real QwenClawBench tasks, a scripted model that does the work.

The scripted upstream performs two shipped tasks through each harness's own
shell tool: task_00067 (write a SPARQL file; one rollout in two writes the
perfect query, reward 1.0, the other falls into the task's trap, 14/15) and
task_00043 (graded on the transcript: the answer meets 3 of 8 checks). So the
rewards, the pass counts and pass@k / pass^k are known in advance, and they
can only come out right if the workspace, the transcript built from the
recorded calls and the grader all work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from forgerl.runners.policy import PolicyVersionSource
from forgerl.schema.records import decompress
from forgerl.schema.files import data_files
from forgerl.schema.store import read_table

from runner_fixtures import (BENCH, NOVEL_ANSWER, NOVEL_SCORE, NOVEL_TASK, SPARQL_SCORE, SPARQL_TASK, alternating_script,
                             task_script)

FORGE_RUN = str(Path(sys.executable).with_name("forge-run"))
pytestmark = pytest.mark.slow


def forge_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([FORGE_RUN, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_forge_run_grades_real_harness_rollouts(scripted, tmp_path, harness):
    up = scripted(alternating_script())
    out = tmp_path / "data"
    args = [str(BENCH), "--task", SPARQL_TASK, "--task", NOVEL_TASK, "--harness", harness, "--upstream", up.url,
            "--attempts", "2", "--parallel", "4", "--out", str(out)]
    r = forge_run(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "4 rollouts to run, 0 already finished" in r.stderr

    rows = read_table(out, "outcomes").to_pylist()
    assert len(rows) == 4 and {x["harness"] for x in rows} == {harness} and {x["runner"] for x in rows} == {"local"}
    sparql = sorted(x["reward"] for x in rows if x["task_id"] == SPARQL_TASK)
    assert sparql == [pytest.approx(SPARQL_SCORE), 1.0]
    novel = [x["reward"] for x in rows if x["task_id"] == NOVEL_TASK]
    assert novel == [pytest.approx(NOVEL_SCORE)] * 2
    assert sorted(x["status"] for x in rows) == ["failed", "failed", "failed", "success"]
    for x in rows:
        assert json.loads(x["graded"])["llm_judge"] == "not graded"
        extra = json.loads(x["extra"])
        assert extra["final_answer"] and extra["harness_transcript"], extra
        assert any("network namespace" in e for e in extra["enforced"]) or "not isolated" in str(extra["enforced"])
    flawed = next(x for x in rows if x["task_id"] == SPARQL_TASK and x["reward"] < 1)
    assert json.loads(flawed["scores"])["no_reviewer_name"] == 0.0 and len(json.loads(flawed["scores"])) == 15

    # pass@k / pass^k per task, from the analysis module's estimators
    # columns: n, passed, infra, mean reward, pass@1, pass@2, pass^2 (the pass rates table after it has 9)
    table = {cells[0]: cells for cells in map(str.split, r.stdout.splitlines()) if len(cells) == 8
             and cells[0].startswith("task_")}
    assert table[SPARQL_TASK][1:] == ["2", "1", "0", f"{(1 + SPARQL_SCORE) / 2:.3f}", "0.500", "1.000", "0.000"]
    assert table[NOVEL_TASK][1:] == ["2", "0", "0", f"{NOVEL_SCORE:.3f}", "0.000", "0.000", "0.000"]
    assert "not comparable with published QwenClawBench totals" in r.stdout

    # outcomes join the recorded calls on session_id
    con = duckdb.connect()
    joined = con.execute(
        f"SELECT o.task_id, count(c.call_id) FROM read_parquet({data_files(out, 'outcomes')!r}) o "
        f"JOIN read_parquet({data_files(out, 'calls')!r}) c USING (session_id) GROUP BY o.session_id, o.task_id"
    ).fetchall()
    assert len(joined) == 4
    assert all(n >= (2 if task == SPARQL_TASK else 1) for task, n in joined)

    # resumable: nothing left to do, nothing written twice
    again = forge_run(*args)
    assert again.returncode == 0 and "0 rollouts to run, 4 already finished" in again.stderr
    assert len(read_table(out, "outcomes")) == 4


def test_watch_reruns_per_policy_version_and_tags_calls(scripted, tmp_path):
    up = scripted(task_script)
    out, version = tmp_path / "data", tmp_path / "policy-version"
    version.write_text("step-100\n")

    def publish_next_version() -> None:  # what a trainer does once it has new weights
        deadline = time.time() + 240
        while time.time() < deadline:
            if (out / "forgerl.json").exists() and len(read_table(out, "outcomes")) >= 1:
                version.write_text("step-200\n")
                return
            time.sleep(0.2)

    threading.Thread(target=publish_next_version, daemon=True).start()
    r = forge_run(str(BENCH), "--task", NOVEL_TASK, "--harness", "claude-code", "--upstream", up.url, "--out", str(out),
                  "--watch", "--policy-version-from", str(version), "--watch-interval", "0.2", "--rounds", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    outcomes = read_table(out, "outcomes").to_pylist()
    assert sorted(x["policy_version"] for x in outcomes) == ["step-100", "step-200"]
    calls = read_table(out, "calls", ["session_id", "policy_version"]).to_pylist()
    by_session = {x["session_id"]: x["policy_version"] for x in outcomes}
    assert calls and all(c["policy_version"] == by_session[c["session_id"]] for c in calls)


def test_policy_version_from_the_served_models(scripted):
    up = scripted(task_script)
    assert PolicyVersionSource(up.url).current() == "scripted"


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    r = forge_run(str(tmp_path / "missing"), "--harness", "codex", "--upstream", "http://127.0.0.1:9", "--out",
                  str(tmp_path / "d"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such task file or folder" in r.stderr
    r = forge_run(str(BENCH), "--harness", "codex", "--upstream", "127.0.0.1:9", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "--upstream must be http(s)://" in r.stderr and "Traceback" not in r.stderr
    r = forge_run(str(BENCH), "--harness", "codex", "--upstream", "http://127.0.0.1:9", "--task", "nope",
                  "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "no such task: nope" in r.stderr
    (tmp_path / "rules").write_text("# ours\nACME-[0-9]+(\n")
    for rules, said in ((tmp_path / "rules", "bad redaction rule 'ACME-[0-9]+('"), (tmp_path / "none", "none")):
        r = forge_run(str(BENCH), "--harness", "codex", "--upstream", "http://127.0.0.1:9", "--task", NOVEL_TASK,
                      "--redact-rules", str(rules), "--out", str(tmp_path / "d"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()


def test_redact_rules_reach_the_recorder_and_the_outcomes(scripted, tmp_path):
    """The user's rules mask what they match wherever forge-run writes it: in the requests the recorder it
    started stored (the prompt) and in the outcome's final answer (the novel's title) and the harness's own
    transcript (both)."""
    prompt, title = b"back to writing", b"Borrowed Mind"
    up = scripted(task_script)
    out, rules = tmp_path / "data", tmp_path / "rules"
    rules.write_text("# the prompt's words and the book's working title\nback\\s+to\\s+writing\nBorrowed\\s+Mind\n")
    r = forge_run(str(BENCH), "--task", NOVEL_TASK, "--harness", "claude-code", "--upstream", up.url,
                  "--redact-rules", str(rules), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert any(prompt in e.body for e in up.log) and title.decode() in NOVEL_ANSWER  # there is something to mask
    [row] = read_table(out, "outcomes").to_pylist()
    extra = json.loads(row["extra"])
    assert "The [REDACTED]" in extra["final_answer"]
    assert "get [REDACTED]" in extra["harness_transcript"] and "The [REDACTED]" in extra["harness_transcript"]
    assert prompt not in row["extra"].encode() and title not in row["extra"].encode()
    requests = [decompress(c["request_raw"]) for c in read_table(out, "calls", ["request_raw"]).to_pylist()]
    assert any(b"get [REDACTED]" in body for body in requests) and not any(prompt in body for body in requests)


def test_policy_serve_mode_answers_the_harness_and_records_tokens(tmp_path):
    from serve_fixtures import TOKENIZER_DIR
    script = tmp_path / "turns.json"
    script.write_text(json.dumps([NOVEL_ANSWER]))
    out = tmp_path / "data"
    r = forge_run(str(BENCH), "--task", NOVEL_TASK, "--harness", "claude-code", "--policy", f"script:{script}",
                  "--tokenizer", str(TOKENIZER_DIR), "--served-model", "qwen3-policy", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    [outcome] = read_table(out, "outcomes").to_pylist()
    assert outcome["reward"] == pytest.approx(NOVEL_SCORE)
    calls = [c for c in read_table(out, "calls").to_pylist() if c["session_id"] == outcome["session_id"]
             and c["path"].startswith("/v1/messages") and "count_tokens" not in c["path"]]
    assert calls, "no model call was recorded"
    assert all(c["completion_token_ids"] and c["policy_version"] == "qwen3-policy" for c in calls), \
        [(c["path"], c["status"], c["error"]) for c in calls]
    bad = forge_run(str(BENCH), "--harness", "codex", "--policy", f"script:{script}", "--out", str(tmp_path / "d"))
    assert bad.returncode == 2 and "--policy needs --tokenizer DIR and --served-model NAME" in bad.stderr
