"""An agent in a rollout's jail cannot read forgerl's processes: their environments (the judge's, the user model's,
the runner's keys) and command lines are out of its sight, and a task's services get an allowlisted environment.

A fake key is planted in the runner's environment before its fork servers start (so the jail's own first process,
forked from one, carries it in /proc/PID/environ) and in a sibling process of the runner. The agent, a real process
in a real rollout, dumps every /proc/*/environ and /proc/*/cmdline it can read into its workspace; the grader, outside
the jail, looks there for the key and forgerl's processes. With a shared /proc (no namespaces: what forge-run
refuses without --allow-shared-proc) the same agent finds them, so the test can fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig
from forgerl.runners import forkserver
from forgerl.runners.cli import main as forge_run
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import Rollout
from forgerl.runners.loader import load_tasks
from forgerl.runners.sandbox import Sandbox, can_unshare
from forgerl.runners.services import Service
from forgerl.schema.store import DatasetWriter

from runner_fixtures import CALL_MODEL, PythonHarness, toml_task
from scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.skipif(not can_unshare(), reason="no namespaces on this machine (see runners/README.md)")

KEY = "sk-judge-" + uuid.uuid4().hex  # planted: no process of the agent's may ever see it
SIBLING = "forgerl-sibling-" + uuid.uuid4().hex[:8]

# What the agent runs: a shell script that reads every process's environment and command line it can.
SCAN = r"""
for d in /proc/[0-9]*; do
  [ "$d" = "/proc/$$" ] && continue
  echo "== $d"; tr '\0' '\n' < "$d/environ"; tr '\0' ' ' < "$d/cmdline"; echo
done > seen.txt 2>&1
ls -d /proc/[0-9]* | wc -l > pids.txt
"""
AGENT = f"import subprocess\nsubprocess.run(['sh', '-c', {SCAN!r}], check=True)\nprint('scanned')\n"

# Run by the runner's grader, outside the jail: what the agent saw. The patterns are assembled here, not written
# out, so no process of the agent's carries them in its own command line.
GRADER = f"""
seen = (ws / "seen.txt").read_text()
return {{"scanned": float(bool((ws / "pids.txt").read_text().strip())),
        "key": float({KEY[:8]!r} + {KEY[8:]!r} in seen),
        "sibling": float({SIBLING[:8]!r} + {SIBLING[8:]!r} in seen),
        "forkserver": float("runners." + "forkserver" in seen),
        "pytest": float("py" + "test" in seen)}}
"""


@pytest.fixture(scope="module")
def planted():
    """The key in this (runner) process's environment, in fork servers started with it, and in a sibling."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORGE_JUDGE_API_KEY", KEY)
        mp.setattr(forkserver, "_SERVERS", {})  # fresh servers, started with the key in their environment
        sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", SIBLING],
                                   env={"FORGE_USER_MODEL_API_KEY": KEY})
        try:
            yield
        finally:
            sibling.kill()
            sibling.wait()
            for proc, _ in forkserver._SERVERS.values():
                proc.stdin.close()
                proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, planted):
    root = tmp_path_factory.mktemp("secrets")
    with ScriptedUpstream() as up, BackgroundRecorder(RecorderConfig(out=root / "data", upstream_anthropic=up.url,
                                                                     upstream_openai=up.url)) as rec:
        yield root, rec


def scan(stack, isolate: bool) -> dict[str, float]:
    root, rec = stack
    name = f"t{uuid.uuid4().hex[:6]}"
    [task] = load_tasks(toml_task(root / "tasks" / name, name, GRADER))
    runner = LocalRunner(PythonHarness(code=CALL_MODEL + AGENT), rec.config.url, root / "data", retries=0,
                         isolate_network=isolate)
    with DatasetWriter(root / "data", source="runner") as writer:
        [outcome] = runner.run([Rollout(task, 0)], writer)
    assert outcome.error is None and outcome.extra["final_answer"] == "scanned", (outcome.error, outcome.extra)
    return json.loads(outcome.row()["scores"])


def test_the_agent_sees_no_forgerl_process_and_no_key(stack):
    assert scan(stack, isolate=True) == {"scanned": 1.0, "key": 0.0, "sibling": 0.0, "forkserver": 0.0,
                                         "pytest": 0.0}


def test_with_a_shared_proc_the_same_agent_finds_them(stack):
    """The control: the scan works, so the test above could fail."""
    found = scan(stack, isolate=False)
    assert found["key"] == found["sibling"] == found["forkserver"] == found["pytest"] == 1.0, found


def test_the_harness_has_its_own_proc_and_no_capabilities(tmp_path, planted):
    """It sees only its own processes, and cannot unmount its /proc to reach the machine's."""
    script = "grep CapEff /proc/self/status; ls -d /proc/[0-9]*; umount /proc && echo gone-$((1+1)); cat /proc/1/cmdline"
    with Sandbox(tmp_path, "http://127.0.0.1:9") as sandbox:
        sandbox.confine(["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, tmp_path, cpu_s=30, memory_mb=0)
        result = sandbox.run(30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["CapEff:", "0000000000000000"]
    assert "gone-2" not in result.stdout and "umount" in result.stderr
    assert [line for line in lines if line.startswith("/proc/")] == ["/proc/1"]  # the shell (ls: gone already)
    assert lines[-1].startswith("sh\x00-c\x00grep CapEff")  # PID 1 is the harness itself


def test_a_service_gets_the_allowlisted_environment_only(tmp_path, planted):
    """A task's service never inherits the runner's keys: only `SERVICE_ENV` and what the task names."""
    code = ("import http.server, json, os\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        body = json.dumps(dict(os.environ)).encode()\n"
            "        self.send_response(200); self.send_header('content-type', 'application/json'); self.end_headers()\n"
            "        self.wfile.write(body)\n"
            "    def do_POST(self): self.do_GET()\n"
            "    def log_message(self, *a): pass\n"
            "http.server.HTTPServer(('127.0.0.1', 8931), H).serve_forever()\n")
    service = Service("env", (sys.executable, "-c", code), 8931, env={"TASK_SETTING": "on"}, state_paths=("/env",))
    with Sandbox(tmp_path, "http://127.0.0.1:9") as sandbox:
        sandbox.confine(["true"], {"PATH": "/usr/bin:/bin"}, tmp_path, cpu_s=30, memory_mb=0, harness_timeout_s=20,
                        services=(service,))
        assert sandbox.run(30).returncode == 0
        env = sandbox.service_state()["services"]["env"]["/env"]
    assert KEY not in json.dumps(env)
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "TASK_SETTING", "LC_CTYPE"}
    assert env["TASK_SETTING"] == "on"


def test_forge_run_refuses_a_shared_proc_unless_told(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    toml_task(tasks, "t", "return {}")
    argv = [str(tasks), "--harness", "claude-code", "--out", str(tmp_path / "data"),
            "--upstream", "http://127.0.0.1:9", "--no-network-isolation"]
    assert forge_run(argv) == 2
    err = capsys.readouterr().err
    assert "forge-run: " in err and "--allow-shared-proc" in err and len(err.strip().splitlines()) == 1
