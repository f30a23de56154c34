"""examples/learn.py, the loop of `make demo-learn` (issue 35).

Fast: a non-empty --out is refused in one line. Slow: the CI-sized loop
(`--small`: pi, two train and two held-out tasks, two SFT steps) runs every
stage through the real verbs, harness and vLLM: the plumbing, not the learning
targets (`make demo-learn` measures those; bench/README.md has its figures).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from forgerl.schema.store import read_table

from conftest import REPO

LEARN = REPO / "examples" / "learn.py"


def learn(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LEARN), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_refuses_a_non_empty_out_without_fresh(tmp_path):
    (tmp_path / "keep.txt").write_text("an earlier run")
    r = learn("--small", "--out", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"learn.py: {tmp_path} is not empty: give --fresh to replace it, "
                                             "or another --out"]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert (tmp_path / "keep.txt").read_text() == "an earlier run"


@pytest.mark.slow
def test_small_loop_runs_every_stage(tmp_path):
    out = tmp_path / "learn-out"
    (out / "stale").mkdir(parents=True)
    r = learn("--small", "--fresh", "--out", str(out))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert not (out / "stale").exists()

    outcomes = read_table(out / "data", "outcomes").to_pylist()
    by_version = Counter((o["policy_version"], o["task_id"].split("-")[1]) for o in outcomes)
    assert by_version == {("teacher", "train"): 4, ("v0", "heldout"): 2, ("v1", "heldout"): 2,
                          ("replay", "heldout"): 2}, by_version
    assert all(o["reward"] == 1.0 for o in outcomes if o["policy_version"] == "teacher")
    calls = read_table(out / "data", "calls").to_pylist()
    assert {c["policy_version"] for c in calls} == {"teacher", "v0", "v1", "replay"}
    served = [c for c in calls if c["policy_version"] in ("v0", "v1")]
    assert served and all(c["completion_token_ids"] for c in served), "vLLM's ids must be recorded"

    manifest = json.loads((out / "shards" / "manifest.json").read_text())
    assert manifest["counts"]["retokenized"] == 2 and manifest["counts"]["engine_ids"] == 2, manifest["counts"]
    policy = {v: json.loads((out / "ckpt" / v / "forgerl_policy.json").read_text()) for v in ("v0", "v1")}
    assert (policy["v0"]["steps"], policy["v1"]["steps"], policy["v1"]["parent"]) == (0, 2, "v0")

    assert (out / "report.html").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["record teacher", "convert", "sft v0", "sft v1", "eval v0",
                                                      "eval v1", "check-serve v1", "replay baseline",
                                                      "compare + report"]
    assert all(s["seconds"] > 0 and s["peak_mb"] > 0 for s in summary["stages"])
    served = summary["check_serve"]  # check-serve's last line: vLLM's logprobs on v1's calls vs the checkpoint's
    assert served.startswith("calls ") and float(served.split("max_abs ")[1].split()[0]) <= 1e-3, served
    assert set(summary["heldout"]) == {"pi"} and summary["heldout"]["pi"]["tasks"] == 2
    assert {t["target"].split(" ")[0] for t in summary["targets"]} == {"v0", "v1"}
    for table in ("held-out pass@1", "targets", "stages:"):
        assert table in r.stdout, r.stdout
    assert "pass@1" in r.stdout.split("learn: compare + report ...")[1], "the compare table must be printed"
