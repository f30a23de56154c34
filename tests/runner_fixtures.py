"""Shared pieces of the runner tests: task-performing model scripts, tiny harnesses, process checks.

The scripts play the model behind the recorder: on the first call they ask
the harness's shell tool to create exactly the files a QwenClawBench task's
grade() checks, and once the tool result comes back they give a final
answer. The file contents are chosen so the expected score is known and not
trivial (some checks pass, some deliberately fail).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from forgerl.recorder.control import RecorderControl
from forgerl.harnesses import Harness, RunContext

from scripted_upstream import Request, Script, ToolCall, Turn, saw_tool_result

BENCH = Path("/work/shared/benchmarks/qwenclawbench")
if not BENCH.is_dir():  # the repository's sibling checkout of the shared folder
    BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "qwenclawbench"
SPARQL_TASK = "task_00067_write_sparql_query_for_product_reviews_containing_iphone"
NOVEL_TASK = "task_00043_read_memory_files_and_summarize_novel_preparation"

# 14 of task_00067's 15 checks pass: the query also selects ?reviewerName (the task's trap).
SPARQL_QUERY = """PREFIX pr: <http://www.example.org/product-review#>
SELECT ?reviewId ?reviewTitle ?reviewText ?reviewDate ?productName ?reviewerName WHERE {
  ?r pr:reviewId ?reviewId ; pr:reviewTitle ?reviewTitle ; pr:reviewText ?reviewText ;
     pr:reviewDate ?reviewDate ; pr:hasProduct ?p ; pr:reviewerName ?reviewerName .
  ?p pr:productName ?productName .
  FILTER(CONTAINS(?productName, "iPhone"))
}
"""
SPARQL_SCORE = 14 / 15
PERFECT_QUERY = SPARQL_QUERY.replace(" ?reviewerName WHERE", " WHERE").replace(" ; pr:reviewerName ?reviewerName", "")

# task_00043 grades the assistant's text: this answer passes 3 of its 8 checks exactly
# (title; genre/setting: literary + sci-fi + 2041; style: unreliable + dual timeline).
NOVEL_ANSWER = ("Summary: 'The Borrowed Mind' is a literary sci-fi novel set in 2041, told by an unreliable "
                "narrator across a dual timeline.")
NOVEL_SCORE = 3 / 8


def shell_call(request: Request, command: str) -> ToolCall:
    """The harness's own shell tool: Claude Code's Bash, Codex's exec_command."""
    if request.api == "anthropic":
        return ToolCall("Bash", {"command": command, "description": "write the answer file"})
    return ToolCall("exec_command", {"cmd": command})


def write_query(request: Request, query: str) -> Turn:
    cmd = f"cat > query_output.sparql <<'EOF'\n{query}EOF"
    return Turn(text="Writing the query.", tool_calls=[shell_call(request, cmd)])


def task_script(request: Request) -> Turn:
    """Performs task_00067 (writes query_output.sparql) or task_00043 (answers in text), by its prompt."""
    if "SPARQL" in str(request.body):
        return Turn(text="Wrote query_output.sparql.") if saw_tool_result(request) else write_query(request, SPARQL_QUERY)
    return Turn(text=NOVEL_ANSWER)


def alternating_script() -> Script:
    """Like `task_script`, but every other SPARQL rollout writes the perfect query (reward 1.0): 1 pass in 2."""
    rollouts = itertools.count()

    def script(request: Request) -> Turn:
        if "SPARQL" in str(request.body) and not saw_tool_result(request):
            return write_query(request, PERFECT_QUERY if next(rollouts) % 2 == 0 else SPARQL_QUERY)
        return task_script(request)

    return script


# A PythonHarness snippet's model call (a rollout without one is an infra error); an error status goes to stderr.
CALL_MODEL = ("import os, sys, urllib.error, urllib.request\n"
              "url = os.environ['FORGE_BASE_URL'] + '/s/' + os.environ['FORGE_SESSION_ID'] + '/v1/chat/completions'\n"
              "request = urllib.request.Request(url, data=b'{\"model\": \"m\", \"messages\": "
              "[{\"role\": \"user\", \"content\": \"go\"}]}', headers={'content-type': 'application/json'})\n"
              "try:\n"
              "    urllib.request.urlopen(request, timeout=30).read()\n"
              "except urllib.error.HTTPError as e:\n"
              "    print(e.code, e.read().decode(), file=sys.stderr)\n")


@dataclass
class PythonHarness(Harness):
    """A stand-in harness: a Python snippet as the agent (hangs, crashes, forks), run like any harness."""

    name: str = "python-snippet"
    cli: str = "python3"
    api: str = "none"
    code: str = ""

    def find(self) -> str:
        return sys.executable

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        return [exe, "-c", self.code], {"HOME": str(ctx.home), "FORGE_BASE_URL": ctx.base_url,
                                        "FORGE_SESSION_ID": ctx.session}


def rollout_processes(marker: str) -> list[int]:
    """PIDs whose command line carries `marker` (left-overs of a rollout)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def cgroups_left(outcome) -> list[str]:
    """The outcome's memory cgroup, if the runner made one and it still exists."""
    import re
    from forgerl.runners.sandbox import own_memory_cgroup
    found = own_memory_cgroup()
    names = re.findall(r"\(cgroup (forgerl-[0-9a-f]+)\)", " ".join(outcome.extra.get("enforced") or []))
    return [n for n in names if found and (found[0] / n).exists()]


def rollout_dirs(where: Path | None = None) -> set[str]:
    import tempfile
    return {p.name for p in Path(where or tempfile.gettempdir()).glob("forgerl-rollout-*")}


def toml_task(folder: Path, task_id: str, grader_body: str, *, timeout_s: float = 60, memory_mb: int = 1024,
              prompt: str = "do it") -> Path:
    """A forgerl TOML task whose grade() runs `grader_body` (with `ws = Path(workspace_path)`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "seed.txt").write_text("seed\n")
    body = "\n".join("    " + line for line in grader_body.strip().splitlines())
    path = folder / f"{task_id}.toml"
    path.write_text(f'''id = "{task_id}"
prompt = "{prompt}"
timeout_seconds = {timeout_s}
[limits]
memory_mb = {memory_mb}
[[workspace_files]]
source = "seed.txt"
dest = "in/seed.txt"
[grading]
code = """
from pathlib import Path
def grade(transcript, workspace_path):
    ws = Path(workspace_path)
{body}
"""
''')
    return path


# --- Kubernetes: the kmock API emulator over real HTTP, and a kubelet that runs pods as local processes ----------


class KubeAPI:
    """kmock's KubernetesEmulator served on a loopback port, on its own thread and event loop."""

    def __init__(self) -> None:
        self.url = ""
        self.km = None
        self.logs: dict[str, str] = {}  # pod name -> its log, served at pods/<name>/log

    def start(self) -> KubeAPI:
        import threading
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    def _serve(self, ready) -> None:
        import asyncio
        import kmock

        async def main() -> None:
            self._stop = asyncio.Event()
            async with kmock.KubernetesEmulator() as km, kmock.Server(km) as server:
                self.km, self.url = km, str(server.url).rstrip("/")
                km.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True,
                                                             subresources={"status", "log"})
                km["get", kmock.resource("v1/pods"), kmock.subresource("log")] << (
                    lambda request: self.logs.get(request.name, ""))
                ready.set()
                await self._stop.wait()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(main())

    def refuse_pod_creation(self, times: int | None, status: int = 503) -> None:
        import kmock
        view = self.km["post", kmock.resource("v1/pods")]
        (view if times is None else view[:times]) << status

    def pods(self) -> list[dict]:
        """Every pod ever created: [{'name', 'deleted', 'manifest'}]."""
        return [{"name": name, "deleted": obj.deleted, "manifest": obj.last.raw if obj.deleted else obj.raw}
                for (_, _, name), obj in list(self.km.objects.items())]

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class FakeKubelet:
    """The node: watches pods over the API, runs each pod's containers here (its native sidecars first, each
    in a PID namespace with its own /proc, as containers are), patches its status.

    The image picks a behaviour: `...:pending` is never scheduled, `...:missing` cannot be pulled
    (ImagePullBackOff), `...:crash` runs a command that dies without a result; anything else runs the
    pod's real command (python3 -m forgerl.runners.pod) with the pod's env. activeDeadlineSeconds and
    deletion kill the process, like a kubelet would.
    """

    def __init__(self, api_url: str, namespace: str, workdir: Path, secrets: dict[str, dict[str, str]] | None = None):
        from kubernetes import client
        cfg = client.Configuration()
        cfg.host = api_url
        self.core = client.CoreV1Api(client.ApiClient(cfg))
        self.namespace, self.workdir = namespace, workdir
        self.secrets = secrets or {}  # Secret name -> its data, for env entries `valueFrom: secretKeyRef`
        self.procs: dict[str, object] = {}
        self.deleted: set[str] = set()
        self._lock = threading.Lock()
        self.api: KubeAPI | None = None
        self._stopped = False

    def start(self, api: KubeAPI) -> FakeKubelet:
        import threading
        self.api = api
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def _watch(self) -> None:
        import threading
        from kubernetes import watch
        seen: set[str] = set()
        while not self._stopped:
            try:
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace, _request_timeout=2):
                    name = event["object"].metadata.name
                    if event["type"] == "DELETED":
                        with self._lock:  # a pod deleted before its container started never starts
                            self.deleted.add(name)
                            proc = self.procs.get(name)
                        if proc is not None and proc.poll() is None:
                            threading.Thread(target=self._stop_container, args=(proc,), daemon=True).start()
                    elif name not in seen:
                        seen.add(name)
                        pod = self.core.api_client.sanitize_for_serialization(event["object"])
                        threading.Thread(target=self._run, args=(pod,), daemon=True).start()
            except Exception:  # read timeouts between events; the API going away at the end
                continue

    @staticmethod
    def _stop_container(proc, grace_s: float = 5.0) -> None:
        """Like a kubelet: SIGTERM, a grace period, then SIGKILL (the container's PID namespace takes the rest)."""
        import signal
        import subprocess
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()

    def _status(self, name: str, phase: str, state: dict, reason: str | None = None) -> None:
        status = {"phase": phase, "containerStatuses": [{"name": "rollout", "image": "", "imageID": "", "ready": False,
                                                         "restartCount": 0, "state": state}]}
        if reason:
            status["reason"] = reason
        try:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
        except Exception:
            pass  # deleted meanwhile

    def _run(self, pod: dict) -> None:
        import subprocess
        name, spec = pod["metadata"]["name"], pod["spec"]
        container = spec["containers"][0]
        image = container["image"]
        if image.endswith(":pending"):
            return
        if image.endswith(":missing"):
            self._status(name, "Pending", {"waiting": {"reason": "ImagePullBackOff", "message": f"pull {image}"}})
            return
        base = self.workdir / name
        base.mkdir(parents=True)
        result = base / "termination-log"
        loopback = self._own_loopback()
        sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        cmd = self._command(container)
        if image.endswith(":crash"):
            cmd = [sys.executable, "-c", "import sys; print('segfault in the image'); sys.exit(139)"]
        self._status(name, "Running", {"running": {"startedAt": "2026-12-03T00:00:00Z"}})
        started = []
        try:
            for sidecar in sidecars:  # native sidecars: started, and their startup probe passed, before the rest
                started.append(self._start(name, sidecar, base, loopback, base / f"{sidecar['name']}.log"))
                if not self._started(sidecar, base, loopback):
                    self._status(name, "Pending", {"waiting": {"reason": "CrashLoopBackOff",
                                                               "message": f"{sidecar['name']}: startup probe failed"}})
                    return
            with self._lock:
                if name in self.deleted:
                    return
                proc = self.procs[name] = self._start(name, container, base, loopback, base / "log", cmd=cmd,
                                                      extra={"FORGE_RESULT_PATH": str(result),
                                                             "FORGE_WORKDIR": str(base / "work")})
            try:
                code = proc.wait(timeout=spec.get("activeDeadlineSeconds"))
                reason = None
            except subprocess.TimeoutExpired:
                self._stop_container(proc)
                code, reason = proc.wait(), "DeadlineExceeded"
        finally:
            for sidecar in started:  # they stop once the pod's containers have
                if sidecar is not None and sidecar.poll() is None:
                    self._stop_container(sidecar)
        logs = (base / "log").read_text(errors="replace")
        self.api.logs[name] = logs
        message = result.read_text() if result.exists() else None
        if message is None and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = logs[-2048:]
        terminated = {"exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error"}
        if message:
            terminated["message"] = message
        self._status(name, "Succeeded" if code == 0 else "Failed", {"terminated": terminated}, reason)

    @staticmethod
    def _own_loopback() -> dict[str, str]:
        """A pod's loopback is its own; here every pod shares the machine's. So each pod's model-keys sidecar gets a
        port of its own, and the URLs of its pod point there: {what the runner wrote: what this pod uses}."""
        from forgerl.runners.model_keys import DEFAULT_PORT, PORT_VARIABLE
        from forgerl.recorder.proxy import free_port
        port = free_port()
        return {f"127.0.0.1:{DEFAULT_PORT}": f"127.0.0.1:{port}", PORT_VARIABLE: str(port)}

    @staticmethod
    def _command(container: dict) -> list[str]:
        return [sys.executable if c == "python3" else c for c in container["command"]]

    def _env(self, container: dict, loopback: dict[str, str]) -> dict[str, str]:
        """The container's environment as a kubelet resolves it, on this pod's loopback."""
        from forgerl.runners.model_keys import PORT_VARIABLE
        env = {k: os.environ[k] for k in ("PATH", "LANG", "HOME") if k in os.environ}
        for e in container.get("env") or []:
            value = self._value(e)
            for old, new in loopback.items():
                value = value.replace(old, new) if old != PORT_VARIABLE else value
            env[e["name"]] = value
        return env | {PORT_VARIABLE: loopback[PORT_VARIABLE]}

    def _start(self, name: str, container: dict, base: Path, loopback: dict[str, str], log_path: Path, *,
               cmd: list[str] | None = None, extra: dict[str, str] | None = None):
        """One container as a process: a PID namespace with its own /proc, like a container's (its processes see
        none of the pod's other containers'), nothing in it outliving it; its working directory under the pod's."""
        import subprocess
        from forgerl.runners.sandbox import can_unshare
        cmd = cmd or self._command(container)
        if can_unshare():
            cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *cmd]
        cwd = base / container["name"]
        cwd.mkdir(exist_ok=True)
        with open(log_path, "wb") as log:
            return subprocess.Popen(cmd, env=self._env(container, loopback) | (extra or {}), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)

    def _started(self, container: dict, base: Path, loopback: dict[str, str]) -> bool:
        """Run the container's startup probe (`exec`) until it passes, or its failure threshold."""
        import subprocess
        import time
        probe = container.get("startupProbe") or {}
        if "exec" not in probe:
            return True
        for _ in range(probe.get("failureThreshold", 3)):
            if subprocess.run(self._command(probe["exec"]), env=self._env(container, loopback),
                              cwd=base / container["name"], capture_output=True).returncode == 0:
                return True
            time.sleep(probe.get("periodSeconds", 10))
        return False

    def _value(self, entry: dict) -> str:
        """An env entry's value, given or from a Secret (`valueFrom.secretKeyRef`), as a kubelet resolves it."""
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        return self.secrets[ref["name"]][ref["key"]] if ref else entry.get("value", "")

    def stop(self) -> None:
        self._stopped = True
        for proc in self.procs.values():
            if proc.poll() is None:
                self._stop_container(proc)


def processes_in(folder: Path) -> list[int]:
    """PIDs whose working directory is inside `folder` (what a rollout under it left running)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def barriers_asked_now(monkeypatch) -> list[bool]:
    """Each flush barrier's `now` as runners ask it (the barriers still reach the recorder)."""
    asked: list[bool] = []
    flush = RecorderControl.flush

    def spied(self, session: str, now: bool = False) -> int:
        asked.append(now)
        return flush(self, session, now)

    monkeypatch.setattr(RecorderControl, "flush", spied)
    return asked
