"""LocalRunner confinement: timeouts, crashes, escaping children, network and memory limits, clean-up.

The agent here is a Python snippet run like any harness (`PythonHarness`), so
each test can misbehave on purpose; the recorder and the upstream are real.
Each snippet first calls the model once (`CALL_MODEL`): a rollout with no
recorded call is an infra error (tests/test_handshake.py).
"""

from __future__ import annotations

import json
import socket
import uuid

import pyarrow as pa
import pytest

from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig
from forgerl.runners import grading
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import Rollout
from forgerl.runners.sandbox import can_unshare, own_memory_cgroup
from forgerl.runners.loader import load_tasks
from forgerl.schema.store import read_table
from forgerl.schema.writer import DatasetWriter

from runner_fixtures import CALL_MODEL, PythonHarness, cgroups_left, rollout_dirs, rollout_processes, toml_task
from scripted_upstream import ScriptedUpstream

GRADE_FILE = """
p = ws / "out.json"
return json.loads(p.read_text()) if p.exists() else {"wrote": 0.0}
""".replace("return", "import json\nreturn", 1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    with ScriptedUpstream() as up, BackgroundRecorder(RecorderConfig(out=root / "data", upstream_anthropic=up.url,
                                                                     upstream_openai=up.url)) as rec:
        yield root, up, rec


def run(stack, code: str, *, isolate: bool = True, timeout_s: float = 30, memory_mb: int = 1024, grader=GRADE_FILE,
        retries: int = 0):
    root, _, rec = stack
    name = f"t{uuid.uuid4().hex[:6]}"
    [task] = load_tasks(toml_task(root / "tasks" / name, name, grader, timeout_s=timeout_s, memory_mb=memory_mb))
    work = root / "work" / name
    work.mkdir(parents=True)
    runner = LocalRunner(PythonHarness(code=CALL_MODEL + code), rec.config.url, root / "data", retries=retries,
                         isolate_network=isolate, workdir=work)
    with DatasetWriter(root / "data", source="runner") as writer:
        [outcome] = runner.run([Rollout(task, 0)], writer)
    assert rollout_dirs(work) == set(), "the rollout's temp dir was left behind"
    assert cgroups_left(outcome) == [], "the rollout's cgroup was left behind"
    return outcome, task


def write_scores(scores: dict) -> str:
    return f"import json, pathlib; pathlib.Path('out.json').write_text(json.dumps({scores!r}))\n"


def test_success_is_graded_and_written(stack):
    outcome, task = run(stack, write_scores({"a": 1.0, "b": 1.0}) + "print('all done')")
    assert outcome.status == "success" and outcome.error is None
    row = outcome.row()
    assert row["reward"] == 1.0 and row["passed"] is True and json.loads(row["scores"]) == {"a": 1.0, "b": 1.0}
    assert outcome.extra["final_answer"] == "all done"
    assert own_memory_cgroup() is None or "(cgroup forgerl-" in " ".join(outcome.extra["enforced"])
    root = stack[0]
    rows = [r for r in read_table(root / "data", "outcomes").to_pylist() if r["task_id"] == task.id]
    assert [(r["status"], r["reward"], r["session_id"]) for r in rows] == [("success", 1.0, outcome.session)]
    assert pa.default_memory_pool().backend_name == "system"  # not mimalloc's heap per runner thread


def test_workspace_holds_the_task_files_and_nothing_is_shared(stack):
    code = ("import os, pathlib; s = pathlib.Path('in/seed.txt').read_text()\n"
            + "home = os.environ['HOME']; ok = float(s == 'seed\\n' and home.endswith('/home') and os.getcwd() != home)\n"
            + "import json; pathlib.Path('out.json').write_text(json.dumps({'seed': ok}))\n")
    outcome, _ = run(stack, code)
    assert outcome.status == "success", outcome.extra


def test_harness_exiting_non_zero_is_a_graded_failure(stack):
    outcome, _ = run(stack, write_scores({"a": 1.0, "b": 0.0}) + "raise SystemExit(3)")
    assert outcome.status == "failed" and outcome.error == "harness exited with status 3"
    assert outcome.row()["reward"] == 0.5 and outcome.extra["returncode"] == 3


def test_hanging_harness_times_out_keeps_its_reward_and_leaves_nothing(stack):
    marker = f"forgerl-hang-{uuid.uuid4().hex[:8]}"
    code = (write_scores({"started": 1.0, "finished": 0.0})
            + f"import subprocess, time; subprocess.Popen(['python3', '-c', 'import time; time.sleep(300) # {marker}'])\n"
            + f"time.sleep(300)  # {marker}")
    outcome, _ = run(stack, code, timeout_s=3)
    assert outcome.status == "timeout" and outcome.row()["reward"] == 0.5
    assert outcome.extra["seconds"] < 15
    assert rollout_processes(marker) == []


@pytest.mark.parametrize("isolate, memory_mb", [(True, 1024), (False, 1024), (False, 0)],
                         ids=["namespaces", "no-namespaces", "no-namespaces-no-cgroup"])
def test_a_child_that_escapes_the_process_group_is_killed(stack, isolate, memory_mb):
    marker = f"forgerl-orphan-{uuid.uuid4().hex[:8]}"
    code = (write_scores({"a": 1.0})
            + "import subprocess\n"
            + f"subprocess.Popen(['python3', '-c', 'import os, time; os.setsid(); time.sleep(300) # {marker}'],"
            + " start_new_session=True)\n")
    outcome, _ = run(stack, code, isolate=isolate, memory_mb=memory_mb)
    assert outcome.status == "success"
    assert rollout_processes(marker) == [], "a child outlived its rollout"
    if memory_mb == 0:
        assert not any("memory" in e for e in outcome.extra["enforced"])


@pytest.mark.parametrize("isolate", [True, False], ids=["namespaces", "no-namespaces"])
def test_a_grade_that_reads_files_alone_is_run_by_the_jail_once_nothing_of_the_harness_is_left(stack, isolate,
                                                                                                monkeypatch):
    """No grade process of its own (3-4 ms of CPU a rollout), and nothing the harness left running (here a daemon
    in a session of its own) is there to change the workspace under the grade: it is killed first."""
    monkeypatch.setattr(grading, "fork_grade", lambda *a, **k: pytest.fail("graded in a process of its own"))
    marker = f"forgerl-daemon-{uuid.uuid4().hex[:8]}"  # its pid is its own PID namespace's: found by command line
    code = ("import subprocess\n"
            f"subprocess.Popen(['python3', '-c', 'import time; time.sleep(300) # {marker}'], start_new_session=True)\n")
    grader = ("found = 0.0\n"
              "for p in Path('/proc').iterdir():\n"
              "    try:\n"
              f"        found += {marker.encode()!r} in (p / 'cmdline').read_bytes()\n"
              "    except OSError:\n"
              "        pass\n"
              "return {'daemon_gone': float(not found)}")
    outcome, _ = run(stack, code, isolate=isolate, grader=grader)
    assert outcome.status == "success" and outcome.scores == {"daemon_gone": 1.0}, (outcome.error, outcome.scores)


def test_a_grade_that_fails_in_the_jail_is_an_infra_error(stack):
    outcome, _ = run(stack, "", grader="raise KeyError('boom')")
    assert outcome.status == "infra_error" and "grade() failed: KeyError: 'boom'" in outcome.error


@pytest.mark.skipif(not can_unshare(), reason="no network namespaces on this machine (see runners/README.md)")
def test_network_namespace_reaches_the_recorder_and_nothing_else(stack):
    _, up, _ = stack
    port = int(up.url.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # this machine's outward address
        s.connect(("10.255.255.255", 1))
        host_ip = s.getsockname()[0]
    code = f"""
import json, os, pathlib, socket, urllib.request
base, session = os.environ["FORGE_BASE_URL"], os.environ["FORGE_SESSION_ID"]
def refused(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return 0.0
    except OSError:
        return 1.0
def dns_says_no_such_name():  # asked raw, as musl-based harnesses (Codex) do: an answer, not a timeout
    ns = next(line.split()[1] for line in open("/etc/resolv.conf") if line.startswith("nameserver"))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1)
    s.sendto(bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001"), (ns, 53))
    reply = s.recv(512)
    return float(reply[:2] == bytes.fromhex("abcd") and reply[3] & 0x0F == 3)
def sees_only_itself():  # PID 1 of a PID namespace with its own /proc: no process of forgerl's in sight
    return float(os.getpid() == 1 and [p for p in os.listdir("/proc") if p.isdigit()] == ["1"])
with urllib.request.urlopen(f"{{base}}/s/{{session}}/v1/models", timeout=10) as r:
    recorder = float(r.status == 200 and b"data" in r.read())
scores = {{"recorder": recorder, "upstream_direct": refused("127.0.0.1", {port}),
          "host": refused("{host_ip}", {port}), "internet": refused("1.1.1.1", 443), "dns": dns_says_no_such_name(),
          "own_proc": sees_only_itself()}}
pathlib.Path("out.json").write_text(json.dumps(scores))
"""
    outcome, _ = run(stack, code)
    assert json.loads(outcome.row()["scores"]) == {"recorder": 1.0, "upstream_direct": 1.0, "host": 1.0,
                                                   "internet": 1.0, "dns": 1.0, "own_proc": 1.0}
    assert any("network namespace" in e for e in outcome.extra["enforced"])


def test_memory_limit_kills_a_hog(stack):
    outcome, _ = run(stack, write_scores({"a": 1.0}) + "hog = bytearray(600 * 1024 * 1024)\nhog[::4096] = b'x' * len(hog[::4096])",
                     memory_mb=128)
    if not any("memory" in e for e in outcome.extra["enforced"]):
        pytest.skip("no writable memory cgroup on this machine")
    assert outcome.status == "failed" and outcome.extra["returncode"] == 137


def test_infra_failure_is_retried_then_recorded_unscored(stack):
    root, _, rec = stack
    [task] = load_tasks(toml_task(root / "tasks" / "infra", "infra", "return {'a': 1.0}"))
    (root / "tasks" / "infra" / "seed.txt").unlink()  # the workspace cannot be prepared
    work = root / "work" / "infra"
    work.mkdir(parents=True)
    runner = LocalRunner(PythonHarness(code="pass"), rec.config.url, root / "data", retries=2, workdir=work)
    with DatasetWriter(root / "data", source="runner") as writer:
        [outcome] = runner.run([Rollout(task, 0)], writer)
    assert outcome.status == "infra_error" and outcome.extra["tries"] == 3
    assert outcome.error.count("workspace setup failed") == 3
    row = outcome.row()
    assert row["reward"] is None and row["passed"] is None and row["scores"] is None
    assert rollout_dirs(work) == set()
