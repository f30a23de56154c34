"""Run one harness process tree under limits, and leave nothing behind.

The harness runs under a jail (`jail.py`) forked from the runner's warm
fork server (`forkserver.py`), not started as a new Python. What is
enforced, best first, as the machine allows (`Sandbox.enforced` says which,
and every outcome records it):

* network: a network namespace (as `unshare --net`) gives the harness only
  loopback; the recorder is reached through a bridge on 127.0.0.1 inside
  (`bridge.py`), so no other host or port is reachable. Without
  unshare (no CAP_SYS_ADMIN, no user namespaces) the network is NOT
  isolated: the harness is only pointed at the recorder.
* processes: the jail is PID 1 of its own PID namespace (as `unshare --pid
  --fork --kill-child`), so every descendant dies with it, even ones that
  `setsid` away. The harness itself is PID 1 of one more, nested PID
  namespace with its own `/proc` (`hidepid=2`) and no capabilities: it
  sees none of forgerl's processes and cannot read their environment
  (the judge's, the user model's, the runner's keys) or memory. It runs
  as uid `HARNESS_UID` (nobody), owning its workspace and HOME and no
  file of root's (`harness_user.py`), where this process may switch uids.
  Without namespaces the jail is a child subreaper that kills what the
  harness left behind. Always also: the jail's process group is killed on
  timeout, and the rollout's cgroup (if any) is swept.
* memory: a cgroup (v1 `memory.limit_in_bytes` or v2 `memory.max`) under the
  runner's own, when writable. (RLIMIT_AS is not used: Node reserves far more
  address space than it uses.)
* CPU time: RLIMIT_CPU in the jail (per process).
* wall clock: the runner kills the tree at the task's timeout.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .forkserver import Forked, ForkError, answer_within
from forgerl.harnesses import McpServer

from .harness_user import HARNESS_GID, HARNESS_UID, can_switch_uid, runtime
from .jail import JailSpec
from .services import Service, read_state
from .verifier import Layout

BRIDGE_PORT = 8787  # inside the rollout's own network namespace, any port is free
KILL_GRACE_S = 2.0
CONFINE_TIMEOUT_S = 30.0
SERVICE_STATE = "services.json"  # in the rollout's temp dir
UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]


@functools.cache
def can_unshare() -> bool:
    """Whether network, PID and mount namespaces, with a procfs of their own, can be made here (root or user
    namespaces)."""
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def weak_jail_reason(isolate_network: bool) -> str:
    """Why a harness here could read forgerl's keys or root's files: it would see forgerl's processes in `/proc`
    (its jail has no PID namespace of its own: no network isolation, or no `unshare` here) or run as forgerl's own
    uid (no uid switch here); "" if neither."""
    if not isolate_network:
        return "network isolation is off, and with it the jail's PID namespace and its own /proc"
    if not can_unshare():
        return "unshare fails here (no CAP_SYS_ADMIN), so the jail has no PID namespace or /proc of its own"
    if not can_switch_uid():
        return (f"no uid switch here (uid {os.getuid()} without CAP_SETUID, CAP_SETGID and CAP_CHOWN), so the harness "
                "would run as forgerl's own uid and read every file it can")
    return ""


def own_memory_cgroup() -> tuple[Path, str] | None:
    """The memory cgroup this process is in, and its limit file, if one can be made beneath it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (base / "memory.limit_in_bytes").exists():
                return base, "memory.limit_in_bytes"
        if controllers == "":
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (base / "memory.max").exists():
                return base, "memory.max"
    return None


@dataclass
class Result:
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float
    grade: dict | None = None  # the jail's own grade() answer ({"ok", "scores"|"error"}), if it ran one


@dataclass
class Sandbox:
    """One rollout's confinement; `base_url` is the recorder as the harness must address it."""

    tmp: Path  # the rollout's temp dir (the services' state file goes here)
    recorder_url: str
    isolate_network: bool = True
    enforced: list[str] = field(default_factory=list)
    _cgroup: Path | None = None
    _job: Forked | None = None
    _output: _Output | None = None
    _grading: bool = False  # the jail grades after the harness: its job stays open for that answer

    def __post_init__(self) -> None:
        self.netns = self.isolate_network and can_unshare()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{BRIDGE_PORT}" if self.netns else self.recorder_url

    def _make_cgroup(self, memory_mb: int) -> None:
        found = own_memory_cgroup()
        if found is None:
            return
        base, limit_file = found
        path = base / f"forgerl-{uuid.uuid4().hex[:12]}"  # unique: pods on one node all have a /work
        try:
            path.mkdir()
            (path / limit_file).write_text(str(memory_mb * 1024 * 1024))
        except OSError:
            return
        self._cgroup = path
        self.enforced.append(f"memory {memory_mb} MiB (cgroup {path.name})")

    def _spec(self, argv: list[str], env: dict[str, str], cwd: Path, cpu_s: int) -> JailSpec:
        spec = JailSpec(argv, str(cwd), env, cgroup=str(self._cgroup or ""), cpu_seconds=cpu_s)
        self.enforced.append(f"cpu {cpu_s} s (rlimit)")
        if not self.netns:
            why = "no unshare here" if self.isolate_network else "left to the pod's NetworkPolicy"
            self.enforced.append(f"process group + cgroup sweep; network not isolated by the runner ({why})")
            return spec
        url = urlsplit(self.recorder_url)
        spec.bridge_port = BRIDGE_PORT
        spec.user = [HARNESS_UID, HARNESS_GID] if can_switch_uid() else None
        self.enforced.append("network namespace: recorder only; PID namespace; harness with its own /proc, "
                             "no capabilities" + (f", uid {HARNESS_UID}" if spec.user else ", forgerl's uid"))
        spec.recorder_host, spec.recorder_port = url.hostname, url.port
        return spec

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def confine(self, argv: list[str], env: dict[str, str], cwd: Path, *, cpu_s: int, memory_mb: int,
                layout: Layout | None = None, harness_timeout_s: float = 0.0,
                services: tuple[Service, ...] = (), grade: dict | None = None,
                mcp_servers: tuple[McpServer, ...] = ()) -> None:
        """Make the jail (namespaces, bridge, cgroup) and leave it waiting for `run`: OSError if it cannot.

        A `layout` (fixed paths in a mount namespace, a verifier after the harness) needs the namespaces;
        `harness_timeout_s` is then kept by the jail, so the verifier still runs after an agent timeout.
        A `grade` ({"code", "workspace"}: a grade() that reads files alone) is run by the jail itself once the
        harness has ended, with the harness's confinement; `graded` has its answer. The harness starts the task's
        `mcp_servers` itself: as its own uid, it must reach their programs and the files their commands name.
        """
        if memory_mb > 0:  # 0: no memory limit (and no cgroup)
            self._make_cgroup(memory_mb)
        spec = self._spec(argv, env, cwd, cpu_s)
        if spec.user:  # a temp dir of its own: what it left in the shared /tmp, other rollouts' harnesses could read
            scratch = self.tmp / "tmp"
            scratch.mkdir(exist_ok=True)
            spec.env, spec.scratch = {**spec.env, "TMPDIR": str(scratch)}, str(scratch)
            spec.reach = [p for server in mcp_servers for p in (
                *runtime(server.command[0], env.get("PATH", os.defpath)),
                *(a for a in server.command[1:] if os.path.isabs(a) and os.path.exists(a)))]
        if layout is not None:
            if not self.netns:
                raise OSError("this task needs a mount and a PID namespace (its fixed paths and verifier), and "
                              + ("network isolation is off" if not self.isolate_network else "unshare fails here"))
            spec.harness_timeout_s = harness_timeout_s
            vars(spec).update(layout.jail_fields())
            self.enforced.append(f"mount namespace: {', '.join(t for t, _ in layout.binds)} of the rollout's own"
                                 + ("; verifier after the agent, in a fresh /logs/verifier" if layout.verifier else ""))
        wait_s = CONFINE_TIMEOUT_S + self._services(spec, services, harness_timeout_s)
        spec.grade, self._grading = grade, grade is not None
        self._output = _Output()
        self._job = Forked({"job": "jail", **asdict(spec)}, self._output.fds, pid_one=bool(spec.bridge_port))
        try:
            if self._job.answer(wait_s) != {"ready": True}:
                raise OSError(self.service_state().get("error") or f"the jail was not ready after {wait_s:.0f} s")
        except ForkError as e:
            raise OSError(f"the jail died before the harness started: {e}") from None

    def _services(self, spec: JailSpec, services: tuple[Service, ...], harness_timeout_s: float) -> float:
        """Put the task's services into the jail's spec (they need its network namespace; PID 1 keeps the harness's
        clock, so their state is read after a timeout too); the seconds they may take to come up."""
        if not services:
            return 0.0
        if not self.netns:
            raise OSError(f"this task's services ({', '.join(s.name for s in services)}) need a network namespace "
                          "of the rollout's own, so their fixed ports never clash, and "
                          + ("network isolation is off" if not self.isolate_network else "unshare fails here"))
        spec.services = [s.to_json() for s in services]
        spec.state_file = str(self.tmp / SERVICE_STATE)
        spec.harness_timeout_s = harness_timeout_s
        self.enforced.append(f"services in the rollout's network namespace: {', '.join(s.name for s in services)}")
        return sum(s.ready_timeout_s for s in services)

    def service_state(self) -> dict:
        """What the services stage wrote: {"services": {name: {path: JSON}}}, {"error": why} or {} (none)."""
        return read_state(self.tmp / SERVICE_STATE)

    def run(self, timeout_s: float) -> Result:
        """Start the confined harness; run it to completion or timeout, then kill what is left of the jail.

        The cgroup is swept when the sandbox is left (`release`), not here: the
        jail's last process may take a few ms to leave it, and a caller holding a
        harness slot around `run` should not wait for that.
        """
        start = time.monotonic()
        answer = None
        try:
            self._job.go()
            answer = self._job.answer(timeout_s)
        except (ForkError, OSError) as e:
            raise OSError(f"the jail died without a status: {e}") from None
        finally:
            if answer is None or not self._grading:
                self._end_job(answer)
        stdout, stderr = self._output.read()
        return Result(returncode=None if answer is None else answer["returncode"], timed_out=answer is None,
                      stdout=stdout, stderr=stderr, seconds=time.monotonic() - start)

    def graded(self, timeout_s: float) -> dict | None:
        """The answer of the grade the jail ran after the harness ({"ok", "scores"|"error"}); None when it ran none
        (none was asked for, or the harness did not end on its own). A jail past `timeout_s` is killed."""
        job, self._job = self._job, None  # still open after `run` only while a grade is to come
        if job is None:
            return None
        try:
            return answer_within(job, timeout_s)["grade"]
        except ForkError as e:
            return {"ok": False, "error": str(e)}

    def release(self) -> None:
        """Kill the jail's process group if it is still there, then drop the cgroup (once)."""
        self._end_job(None)
        if self._output is not None:
            self._output.close()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            _sweep_cgroup(cgroup)

    def _end_job(self, answer: dict | None) -> None:
        """Kill the jail's process group unless it answered (once)."""
        job, self._job = self._job, None
        if job is None:
            return
        if answer is None:
            _killpg(job.pid, signal.SIGTERM)
            try:
                job.answer(KILL_GRACE_S)
            except ForkError:
                pass
            _killpg(job.pid, signal.SIGKILL)
        job.close()


class _Output:
    """The harness's stdout and stderr, in memory files (no file on disk to create and delete per rollout: on
    some filesystems that costs a millisecond of CPU each)."""

    def __init__(self) -> None:
        self.fds = [os.memfd_create("forgerl-stdout", os.MFD_CLOEXEC), os.memfd_create("forgerl-stderr", os.MFD_CLOEXEC)]

    def read(self) -> tuple[str, str]:
        out, err = (os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace") for fd in self.fds)
        return out, err

    def close(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep_cgroup(path: Path, deadline_s: float = 5.0) -> None:
    """Kill every process still in the cgroup (even ones that left the process group), then remove it."""
    deadline, pause = time.monotonic() + deadline_s, 0.001
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            path.rmdir()
            return
        except OSError:  # its last processes are still leaving (a jail that just answered takes ~1 ms)
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
