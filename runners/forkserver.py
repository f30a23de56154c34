"""A warm parent that forks one child per job: a rollout's jail, or a grade, for the cost of a fork.

Starting Python costs about 60 to 80 ms of CPU, spent beside the harnesses
still running; on a small machine that is throughput lost, twice a rollout.
So a runner process starts one server (`python -m forgerl.runners.forkserver
SOCKET`), which imports the jail and the grading code once and, for each
connection on its Unix socket, forks a child that does one job and answers.
The server is single-threaded (so forking it is safe) and never runs task
code itself; it exits when the runner does (its stdin closes), and serves the
runner that started it alone (a harness could reach its socket).

There are two servers, each warm with only what its children need
(`WARM`): jails and grades fork from one that imports the jail and the
grade() runner alone (~16 MB), calls (a benchmark's own grader, which reads
the recorded calls) from one that also imports the grading code and with it
pyarrow (~90 MB). A fork copies its parent's page tables and each page the
child then writes: a rollout's jail (one process, more with services) or
grade forked from the 90 MB server costs about twice the CPU.
multiprocessing's own forkserver does not fit: it re-imports the caller's
`__main__` in every child.

Per job the client sends one byte carrying the file descriptors the job
needs (SCM_RIGHTS), then a JSON request (4-byte length first). The byte is
`N` for a child that must be PID 1 of a PID namespace of its own (a jail
with a bridge): the server unshares one for its next child, forks, and goes
back to its own, so the jail needs no first process of its own to fork PID
1 from. Otherwise it is `J`. The child answers `{"pid": N}` at once (its pid
in the server's namespace; it leads a session of its own, so N is also the
process group to kill), then the job's answer, a line each:

- `{"job": "jail", ...JailSpec}` with the harness's stdout and stderr:
  `{"ready": true}` once confined (namespaces made, bridge open), then, after
  the client's `GO` byte, `{"returncode": N}` once the harness has exited
  (`jail.run_confined`). So a runner can confine the next rollout while a
  slot is still busy, and start its harness at once when the slot frees.
  With a `grade` in the spec ({"code", "workspace"}: a grade() that reads
  files alone), the jail then runs it itself, once nothing the harness
  started is left running, and answers `{"grade": {...}}` as a grade job
  does: a rollout's grade costs no process of its own.
- `{"job": "grade", "code", "transcript", "workspace"}`: `{"ok": true,
  "scores": {...}}` or `{"ok": false, "error": "..."}`.
- `{"job": "call", "function": "module:name", "args": {...}, "cwd"}`: the
  function called with `args` in `cwd` (how a task kind runs its benchmark's
  own grader): `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from .namespaces import CLONE_NEWPID, open_namespace, setns, unshare

_LOCK = threading.Lock()
_SERVERS: dict[str, tuple[subprocess.Popen, str]] = {}  # server kind -> (its process, its socket)
WARM = {"jail": ("jail", "grade_code"), "call": ("grading", "jail")}  # what each kind imports before it forks
SERVER_OF = {"jail": "jail", "grade": "jail", "call": "call"}  # the server each job forks from


GO = b"G"
JOB, PID_ONE = b"J", b"N"  # a request's first byte: a child as it comes, or PID 1 of a PID namespace of its own


class ForkError(RuntimeError):
    """The child ran past its time, or died without an answer."""


# ------------------------------------------------------------------ the runner's side


def _socket_path(kind: str) -> str:
    """The socket of the running server of `kind`, started (again) if there is none."""
    with _LOCK:
        server = _SERVERS.get(kind)
        if server is None or server[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="forgerl-forks-"), "socket")
            proc = subprocess.Popen([sys.executable, "-m", "forgerl.runners.forkserver", path, kind],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            if proc.stdout.readline().strip() != b"ready":
                proc.kill()
                raise ForkError(f"the fork server did not start (exit status {proc.wait()})")
            server = _SERVERS[kind] = (proc, path)
        return server[1]


class Forked:
    """One job in a child of the server: its pid (and process group) now, its answer when it ends."""

    def __init__(self, request: dict, fds: Sequence[int] = (), pid_one: bool = False):
        self._conn = socket.socket(socket.AF_UNIX)
        self._buffer = b""
        try:
            self._conn.connect(_socket_path(SERVER_OF[request["job"]]))
            payload = json.dumps(request).encode()
            socket.send_fds(self._conn, [PID_ONE if pid_one else JOB], list(fds))
            self._conn.sendall(struct.pack(">I", len(payload)) + payload)
            self.pid: int = json.loads(self._line(None))["pid"]
        except BaseException:
            self._conn.close()
            raise

    def go(self) -> None:
        """Let a job that waits for it (a confined jail) go on."""
        self._conn.sendall(GO)

    def answer(self, timeout: float | None) -> dict | None:
        """The job's answer; None if it is still running after `timeout` s; ForkError if it died silent."""
        line = self._line(timeout)
        return None if line is None else json.loads(line)

    def _line(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if deadline is not None:
                if (left := deadline - time.monotonic()) <= 0:
                    return None
                self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(1 << 16)
            except TimeoutError:
                return None
            if not chunk:
                raise ForkError("its process died without an answer")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        self._conn.close()


def fork_grade(request: dict, timeout: float) -> dict:
    """The child's answer to `request` ({"code", "transcript", "workspace"}); ForkError past `timeout` s."""
    return answer_within(Forked({"job": "grade", **request}), timeout)


def fork_call(function: str, args: dict, cwd: str, timeout: float) -> dict:
    """`function` ("module:name", JSON in and out) called with `args` in a child working in `cwd`: its answer
    ({"ok": true, "result"} or {"ok": false, "error"}); ForkError past `timeout` s."""
    return answer_within(Forked({"job": "call", "function": function, "args": args, "cwd": cwd}), timeout)


def answer_within(job: Forked, timeout: float) -> dict:
    """The job's (next) answer, then it is closed; ForkError (the job killed) past `timeout` s."""
    try:
        answer = job.answer(timeout)
        if answer is None:
            os.kill(job.pid, signal.SIGKILL)
            raise ForkError(f"ran past {timeout:.0f} s")
        return answer
    finally:
        job.close()


# ------------------------------------------------------------------ the server


def _quietly_in(cwd: str) -> None:
    """Work in `cwd` with stdout and stderr discarded (a grader's prints must not reach the socket)."""
    os.chdir(cwd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


def _grade(request: dict, fds: list[int], conn: socket.socket) -> dict:
    """Grade in the workspace, its prints discarded."""
    from .grade_code import run_grade

    try:
        _quietly_in(request["workspace"])
        return {"ok": True, "scores": run_grade(request["code"], request["transcript"], request["workspace"])}
    except BaseException as e:  # noqa: BLE001 - whatever grade() raises is the grader's failure, reported
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _call(request: dict, fds: list[int], conn: socket.socket) -> dict:
    """Call the named function in `cwd`, its prints discarded."""
    import importlib

    try:
        _quietly_in(request["cwd"])
        module, name = request["function"].split(":")
        return {"ok": True, "result": getattr(importlib.import_module(module), name)(**request["args"])}
    except BaseException as e:  # noqa: BLE001 - whatever the task's grader raises is its failure, reported
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _jail(request: dict, fds: list[int], conn: socket.socket) -> dict:
    from .jail import JailSpec, run_confined

    def ready() -> bool:
        """Say so, and wait for the runner's go (False: it hung up instead)."""
        conn.sendall(b'{"ready": true}\n')
        return conn.recv(1) == GO

    stdout, stderr = fds
    spec = JailSpec(**request)
    returncode = run_confined(spec, stdout, stderr, conn, ready)
    if spec.grade is None:
        return {"returncode": returncode}
    conn.sendall(json.dumps({"returncode": returncode}).encode() + b"\n")
    return {"grade": _grade({**spec.grade, "transcript": []}, fds, conn)}


JOBS = {"grade": _grade, "call": _call, "jail": _jail}


def _child(conn: socket.socket, fds: list[int]) -> None:
    """In the forked child: lead a session of its own, read the job, announce the pid, do it, answer."""
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # jobs wait for processes of their own
    request = json.loads(_exactly(conn, struct.unpack(">I", _exactly(conn, 4))[0]))
    pid = int(os.readlink("/proc/self"))  # as the server's namespace (/proc's) numbers it, also for a PID 1
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    answer = JOBS[request.pop("job")](request, fds, conn)
    conn.sendall(json.dumps(answer).encode() + b"\n")


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("the client hung up mid-request")
        data += chunk
    return data


def serve(path: str, kind: str) -> int:
    import importlib

    for module in WARM[kind]:  # imported once here, so children start with them
        importlib.import_module(f"{__package__}.{module}")

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    own_pids = open_namespace("pid")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(256)
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)  # readable only at EOF: the runner is gone
    print("ready", flush=True)
    try:
        while True:
            for key, _ in events.select():
                if key.fileobj is sys.stdin:
                    return 0
                conn, _ = listener.accept()
                with conn:
                    _fork_for(conn, listener, own_pids)
    finally:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _from_runner(conn: socket.socket) -> bool:
    """Whether the client is the runner that started this server. A harness runs with forgerl's uid (so it could
    open the socket) but in a PID namespace of its own: it must not get a job forked outside its jail."""
    peer_pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    return peer_pid == os.getppid()


def _fork_for(conn: socket.socket, listener: socket.socket, own_pids: int) -> None:
    """Read a job's first byte and file descriptors, and fork its child (into a PID namespace of its own, as PID
    1, if the byte asks for one); the child never returns here."""
    if not _from_runner(conn):
        return
    conn.settimeout(5)  # a client sends its first byte at once
    try:
        tag, fds, _, _ = socket.recv_fds(conn, 1, 2)
    except OSError:
        return
    if not tag:  # the client hung up first
        return
    conn.settimeout(None)
    fresh = False
    if tag == PID_ONE:
        try:
            unshare(CLONE_NEWPID)
            fresh = True
        except OSError:
            pass  # the child is no PID 1, and its jail says so
    try:
        if os.fork() == 0:
            try:
                listener.close()
                os.close(own_pids)
                _child(conn, fds)
            finally:
                os._exit(0)
    finally:
        if fresh:
            setns(own_pids, CLONE_NEWPID)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2]))
