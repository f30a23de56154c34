"""Harbor task directories on the local runner: the agent, then the task's own tests/test.sh in the same jail.

The tasks are Harbor tasks written for these tests (`tests/fixtures/harbor/`):
`hello` (reward.txt, 1 or 0), `checks-json` (reward.json with one key per
check), `slow-verifier` (runs past its 2 s timeout) and `guarded` (writes a
reward only on success). The agent is a Python snippet run like any harness
(`PythonHarness`), or Claude Code driven by a scripted model through its own
Bash tool where it matters that a real harness does it (a pass, and an
attempted reward preemption). Recorder and upstream are real.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig
from forgerl.harnesses import get_harness
from forgerl.runners.kinds import harbor
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import Rollout
from forgerl.runners.sandbox import can_unshare
from forgerl.runners.loader import load_tasks
from forgerl.runners.tasks import TaskError
from forgerl.schema.writer import DatasetWriter

from runner_fixtures import CALL_MODEL, PythonHarness, rollout_dirs, rollout_processes, shell_call
from scripted_upstream import Request, ScriptedUpstream, Turn, saw_tool_result

HARBOR = Path(__file__).parent / "fixtures" / "harbor"
pytestmark = pytest.mark.skipif(not can_unshare(), reason="Harbor tasks need the jail's namespaces")


def commands(request: Request) -> Turn:
    """The model behind Claude Code: the shell command the task's prompt asks for, then a final answer."""
    if saw_tool_result(request):
        return Turn(text="Done.")
    if "hello.txt" in str(request.body):
        return Turn(text="Writing it.", tool_calls=[shell_call(request, "echo hello > hello.txt")])
    if "tally service" in str(request.body):
        mark = "curl -s -X POST http://127.0.0.1:9301/add"
        return Turn(text="Marking it.", tool_calls=[shell_call(request, f"{mark} && {mark} && {mark}")])
    # the guarded task: not solved, but a reward of 1 planted everywhere the agent can reach
    plant = ("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
             "echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
             "echo 1 > \"$HOME/../logs-verifier/reward.txt\" 2>/dev/null; "
             "echo 'echo 1 > /logs/verifier/reward.txt' > \"$HOME/../tests/test.sh\" 2>/dev/null; "
             "(sleep 4; echo 1 > /logs/verifier/reward.txt) > /dev/null 2>&1 & "
             "echo unsolved > answer.txt")
    return Turn(text="Planting a reward.", tool_calls=[shell_call(request, plant)])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor")
    with ScriptedUpstream(commands) as up, BackgroundRecorder(
            RecorderConfig(out=root / "data", upstream_anthropic=up.url, upstream_openai=up.url)) as rec:
        yield root, rec


def run(stack, task_name: str, harness, *, attempts: int = 1, parallel: int = 1):
    root, rec = stack
    [task] = load_tasks(HARBOR / task_name)
    work = root / "work" / uuid.uuid4().hex[:6]
    work.mkdir(parents=True)
    runner = LocalRunner(harness, rec.config.url, root / "data", parallel=parallel, retries=0, workdir=work)
    with DatasetWriter(root / "data", source="runner") as writer:
        outcomes = runner.run([Rollout(task, a) for a in range(attempts)], writer)
    assert rollout_dirs(work) == set(), "a rollout's temp dir was left behind"
    return outcomes


def agent(code: str) -> PythonHarness:
    return PythonHarness(code=CALL_MODEL + code)


def test_task_toml_loads_as_harbor_reads_it():
    task = harbor.load_task(HARBOR / "hello")
    assert (task.id, task.timeout_s, task.verifier_timeout_s, task.memory_mb) == ("hello", 60.0, 60.0, 1024)
    assert task.verifier_env == {"EXPECTED": "hello"} and task.allow_internet is False and task.cpus == 1
    assert task.prompt.startswith("Create the file `hello.txt`") and task.workdir == "/app"
    assert task.env == {"GREETING": "hello"} and [(f.source.name, f.dest) for f in task.files] == [
        ("seed.txt", "seed.txt")]
    assert task.not_honoured == ("FROM ubuntu:24.04",
                                 "RUN apt-get update && apt-get install -y --no-install-recommends curl")
    assert harbor.load_task(HARBOR / "checks-json").memory_mb == 1024  # the deprecated memory = "1G"
    slow = harbor.load_task(HARBOR / "slow-verifier")
    assert slow.docker_image == "ghcr.io/example/slow-verifier:1" and slow.memory_mb == harbor.MEMORY_MB
    assert sorted(t.id for t in load_tasks(HARBOR)) == ["checks-json", "guarded", "hello", "slow-verifier", "tally"]
    [tally] = harbor.load_task(HARBOR / "tally").services
    assert (tally.name, tally.port, tally.health_path, tally.state_paths) == ("tally", 9301, "/health", ("/state",))
    assert tally.argv[1:] == ("services/tally.py", "--port", "9301") and tally.cwd == str((HARBOR / "tally").resolve())


def test_a_task_without_its_verifier_is_a_task_error(tmp_path):
    shutil.copytree(HARBOR / "hello", tmp_path / "broken")
    (tmp_path / "broken" / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match="no tests/test.sh"):
        load_tasks(tmp_path / "broken")
    (tmp_path / "broken" / "task.toml").write_text("[agent\n")
    with pytest.raises(TaskError, match="task.toml"):
        load_tasks(tmp_path / "broken")


def test_the_built_image_is_named_by_its_environment():
    task = harbor.load_task(HARBOR / "hello")
    name = harbor.built_image(task, "registry.local:5000/")
    assert name.startswith("registry.local:5000/harbor-hello:")
    assert name == harbor.built_image(task, "registry.local:5000")
    assert harbor.built_image(harbor.load_task(HARBOR / "slow-verifier"), "r") == "ghcr.io/example/slow-verifier:1"


@pytest.mark.slow
def test_a_real_harness_passes_and_the_outcome_says_what_ran_on_the_host(stack):
    [outcome] = run(stack, "hello", get_harness("claude-code"))
    assert outcome.status == "success", (outcome.error, outcome.extra.get("stderr_tail"), outcome.extra.get("verifier"))
    row = outcome.row()
    assert row["reward"] == 1.0 and json.loads(row["scores"]) == {"reward": 1.0}
    assert outcome.extra["environment"] == "host"
    assert outcome.extra["dockerfile_not_honoured"][0] == "FROM ubuntu:24.04"
    assert outcome.extra["verifier"] == {"returncode": 0, "timed_out": False, "error": None, "output_tail": None}
    assert any("mount namespace: /app" in e for e in outcome.extra["enforced"])


def test_a_failing_verifier_scores_zero(stack):
    [outcome] = run(stack, "hello", agent("open('hello.txt', 'w').write('goodbye')\n"))
    assert outcome.status == "failed" and outcome.row()["reward"] == 0.0 and outcome.scores == {"reward": 0.0}


def test_a_json_reward_keeps_every_numeric_key(stack):
    [outcome] = run(stack, "checks-json", agent("open('answer.txt', 'w').write('41')\n"))
    assert outcome.scores == {"reward": 0.5, "file_exists": 1.0, "answer_is_42": 0.0}  # "note" is not a number
    assert outcome.status == "failed" and outcome.row()["reward"] == 0.5


def test_a_verifier_past_its_timeout_scores_zero_and_leaves_nothing(stack):
    [outcome] = run(stack, "slow-verifier", agent(""))
    assert outcome.status == "failed" and outcome.scores == {"reward": 0.0}
    assert outcome.extra["verifier"]["timed_out"] is True and "ran past its 2 s" in outcome.extra["verifier"]["error"]
    assert outcome.extra["verifier"]["output_tail"] == "started\n"
    assert outcome.extra["docker_image_not_used"] == "ghcr.io/example/slow-verifier:1"
    assert outcome.extra["seconds"] < 30 and rollout_processes("sleep 60") == []


def test_an_agent_past_its_timeout_is_still_verified(stack, tmp_path):
    task_dir = tmp_path / "hello-2s"
    shutil.copytree(HARBOR / "hello", task_dir)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec = 60.0", "[agent]\ntimeout_sec = 2.0"))
    root, rec = stack
    [task] = load_tasks(task_dir)
    runner = LocalRunner(agent("open('hello.txt', 'w').write('hello')\nimport time; time.sleep(60)\n"),
                         rec.config.url, root / "data", retries=0)
    with DatasetWriter(root / "data", source="runner") as writer:
        [outcome] = runner.run([Rollout(task, 0)], writer)
    assert outcome.status == "timeout" and outcome.row()["reward"] == 1.0  # the agent's work counts, as in Harbor
    assert outcome.extra["verifier"]["error"] is None and outcome.extra["seconds"] < 30


def test_parallel_rollouts_each_have_their_own_working_dir_tests_and_logs(stack):
    # attempt 0 writes the right word, attempt 1 a wrong one, both at once; each verifier sees only its own /app
    code = ("import os, time\n"
            "word = 'hello' if '-a0-' in os.environ['FORGE_SESSION_ID'] else 'nope'\n"
            "open('/app/hello.txt', 'w').write(word)\n"
            "try:\n"  # the harness runs as another uid (runners/harness_user.py): the verifier's folder is not its
            "    open('/logs/verifier/reward.txt', 'w').write('1')\n"
            "    raise SystemExit('wrote a reward')\n"
            "except PermissionError:\n"
            "    pass\n"
            "time.sleep(1.5)\n"
            "assert open('/app/hello.txt').read() == word and os.listdir('/tests') == []\n"
            "try:\n"  # the machine's own folders are read-only (its /tmp is not)
            "    open('/etc/forgerl-planted', 'w')\n"
            "    raise SystemExit('wrote into /etc')\n"
            "except OSError as e:\n"
            "    assert e.errno == 30, e\n"  # EROFS
            "import tempfile; tempfile.mkstemp(prefix='forgerl-harbor-scratch-', dir='/tmp')\n")
    outcomes = run(stack, "hello", agent(code), attempts=2, parallel=2)
    by_attempt = {o.rollout.attempt: o for o in outcomes}
    assert by_attempt[0].status == "success" and by_attempt[0].extra["returncode"] == 0
    assert by_attempt[1].status == "failed" and by_attempt[1].row()["reward"] == 0.0


@pytest.mark.slow
def test_an_agent_cannot_write_the_reward_ahead_of_the_verifier(stack):
    [outcome] = run(stack, "guarded", get_harness("claude-code"))
    # The agent wrote reward 1 into /logs/verifier (and the host folder behind it, and a late writer); the
    # verifier, finding the task unsolved, wrote none: under Harbor's shared folder the planted 1 would stand.
    assert outcome.extra["final_answer"] == "Done.", outcome.extra.get("stderr_tail")
    assert outcome.scores == {"reward": 0.0} and outcome.status == "failed"
    assert "wrote no reward" in outcome.extra["verifier"]["error"]
    assert rollout_processes("sleep 4") == []


# Marks the tally service (attempt 0: three times, attempt 1: twice), then leaves a process behind that serves
# port 9302 and, a second later, marks the tally once more: neither may outlive the agent.
TALLY_AGENT = """
import os, subprocess, sys, urllib.request
def mark():
    urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:9301/add", method="POST", data=b""), timeout=5)
for _ in range(3 if "-a0-" in os.environ["FORGE_SESSION_ID"] else 2):
    mark()
LEFT = '''
import socket, time, urllib.request
server = socket.create_server(("127.0.0.1", 9302))
time.sleep(1)
urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:9301/add", method="POST", data=b""), timeout=5)
while True:
    server.accept()[0].close()
'''
subprocess.Popen([sys.executable, "-c", LEFT], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


def test_services_stay_up_through_the_verifier_and_the_agents_processes_do_not(stack):
    """Two rollouts at once, each with its own tally service on port 9301: the verifier reads the service's state
    after the agent, and finds neither the process the agent left serving port 9302 nor its late mark."""
    outcomes = run(stack, "tally", agent(TALLY_AGENT), attempts=2, parallel=2)
    by_attempt = {o.rollout.attempt: o for o in outcomes}
    solved, short = by_attempt[0], by_attempt[1]
    assert solved.status == "success", (solved.error, solved.extra.get("verifier"), solved.extra.get("stderr_tail"))
    assert solved.scores == {"service_up": 1.0, "three_marks": 1.0, "no_impostor": 1.0, "reward": 1.0}
    assert short.status == "failed" and short.scores == {"service_up": 1.0, "three_marks": 0.0, "no_impostor": 1.0,
                                                         "reward": 0.0}
    for outcome in outcomes:  # the state was read once more after the verifier, the service still up
        assert outcome.extra["services_read"] == {"tally": ["/state"]} and "services_unread" not in outcome.extra
        assert any("services in the rollout's network namespace: tally" in e for e in outcome.extra["enforced"])
    assert rollout_processes("socket.create_server") == []


def test_no_namespaces_is_an_infra_error_with_the_reason(stack):
    root, rec = stack
    [task] = load_tasks(HARBOR / "hello")
    runner = LocalRunner(agent(""), rec.config.url, root / "data", retries=0, isolate_network=False)
    with DatasetWriter(root / "data", source="runner") as writer:
        [outcome] = runner.run([Rollout(task, 0)], writer)
    assert outcome.status == "infra_error" and "needs a mount and a PID namespace" in outcome.error
    assert "network isolation is off" in outcome.error


def in_image_task(folder: Path) -> Path:
    """A Harbor task whose image's working directory is `folder/image-app` (made here, as its image would hold it)."""
    task = folder / "in-image"
    shutil.copytree(HARBOR / "hello", task)
    app = folder / "image-app"
    app.mkdir()
    (app / "from-the-image.txt").write_text("built in\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM ubuntu:24.04\nWORKDIR {app}\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n[ \"$(cat hello.txt)\" = hello ] && [ -f from-the-image.txt ] && [ \"$PWD\" = " + str(app)
        + " ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
    return task


def test_kubernetes_pods_run_in_the_task_image(tmp_path):
    from kubernetes import client

    from forgerl.runners.kubernetes import FORGERL_MOUNT, KubernetesRunner

    runner = KubernetesRunner(get_harness("claude-code"), "http://recorder:8787", client.ApiClient(),
                              image="forgerl/rollout:1", image_registry="registry.local:5000")
    [slow] = load_tasks(HARBOR / "slow-verifier")
    pod = runner.pod_manifest(Rollout(slow, 0), "s-1")
    [container], [init] = pod["spec"]["containers"], pod["spec"]["initContainers"]
    assert container["image"] == "ghcr.io/example/slow-verifier:1" and init["image"] == "forgerl/rollout:1"
    assert container["command"][0] == f"{FORGERL_MOUNT}/bin/python3" and init["command"][0] == "cp"
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]
    [hello] = load_tasks(HARBOR / "hello")
    built = runner.pod_manifest(Rollout(hello, 0), "s-2")["spec"]["containers"][0]["image"]
    assert built == harbor.built_image(hello, "registry.local:5000")
    runner.image_registry = ""
    with pytest.raises(TaskError, match="--image-registry"):
        runner.pod_manifest(Rollout(hello, 0), "s-3")


@pytest.mark.slow
def test_the_pod_entry_runs_a_harbor_task_in_its_image(stack, tmp_path):
    from forgerl.runners.pod import run_pod

    root, rec = stack
    task = in_image_task(tmp_path)
    env = {"FORGE_TASKS": str(task), "FORGE_TASK_ID": "in-image", "FORGE_HARNESS": "claude-code",
           "FORGE_RECORDER_URL": rec.config.url, "FORGE_SESSION_ID": f"in-image-{uuid.uuid4().hex[:6]}",
           "FORGE_DATASET": str(root / "data"), "FORGE_WORKDIR": str(tmp_path / "work"), "PATH": os.environ["PATH"]}
    result = run_pod(env)
    assert result["status"] == "graded" and result["scores"] == {"reward": 1.0}, result
    assert result["environment"] == "image" and result["verifier"]["error"] is None
    assert (tmp_path / "image-app" / "hello.txt").read_text().strip() == "hello"  # the image's own folder


@pytest.mark.slow
def test_the_pod_entry_keeps_a_harbor_tasks_service_up_for_its_verifier(stack, tmp_path):
    """The tally task in its image, through the pod entry and Claude Code (its Bash tool marks the tally three
    times): the service, started by the pod's jail, answers the verifier."""
    from forgerl.runners.pod import run_pod

    root, rec = stack
    task = tmp_path / "tally"
    shutil.copytree(HARBOR / "tally", task)
    (tmp_path / "image-app").mkdir()
    (task / "environment" / "Dockerfile").write_text(f"FROM python:3.12-slim\nWORKDIR {tmp_path / 'image-app'}\n")
    env = {"FORGE_TASKS": str(task), "FORGE_TASK_ID": "tally", "FORGE_HARNESS": "claude-code",
           "FORGE_RECORDER_URL": rec.config.url, "FORGE_SESSION_ID": f"tally-{uuid.uuid4().hex[:6]}",
           "FORGE_DATASET": str(root / "data"), "FORGE_WORKDIR": str(tmp_path / "work"), "PATH": os.environ["PATH"]}
    result = run_pod(env)
    assert result["status"] == "graded", result
    assert result["scores"] == {"service_up": 1.0, "three_marks": 1.0, "no_impostor": 1.0, "reward": 1.0}, result
    assert result["environment"] == "image" and result["services_read"] == {"tally": ["/state"]}


@pytest.mark.slow
def test_forge_run_runs_a_harbor_folder_and_closes_with_the_pass_rates(scripted, tmp_path):
    import subprocess
    import sys

    up = scripted(commands)
    forge_run = str(Path(sys.executable).with_name("forge-run"))
    r = subprocess.run([forge_run, str(HARBOR), "--task", "hello", "--task", "checks-json", "--harness", "claude-code",
                        "--upstream", up.url, "--attempts", "1", "--parallel", "2", "--out", str(tmp_path / "data")],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    rates = {cells[0]: cells for cells in map(str.split, r.stdout.splitlines())  # the pass rates table's rows
             if len(cells) == 9 and cells[1] == "claude-code"}
    # checks-json: the scripted agent writes "unsolved" as the answer, so it half-passes (0.5) and never passes
    # task, harness, model (forge-run --model none given: unknown), policy, n, passed, pass rate, mean reward, solved
    assert rates["hello"] == ["hello", "claude-code", "unknown", "(none)", "1", "1", "1.000", "1.000", "always"]
    assert rates["checks-json"] == ["checks-json", "claude-code", "unknown", "(none)", "1", "0", "0.000", "0.500",
                                    "never"]
    assert "2 task rows: 1 never solved, 0 sometimes, 1 always" in r.stdout
