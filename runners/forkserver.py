"""A warm parent that forks one child per grade: grade() in a process of its own for the cost of a fork.

Starting Python for every grade costs about 80 ms of CPU, spent beside the
harnesses still running; on a small machine that is throughput lost. So a
runner process starts one server (`python -m forgerl.runners.forkserver
SOCKET`), which imports the grading code once and, for each connection on
its Unix socket, forks a child that grades in the workspace and answers. The
server is single-threaded (so forking it is safe) and never runs task code
itself; it exits when the runner does (its stdin closes). multiprocessing's
own forkserver does not fit: it re-imports the caller's `__main__` in every
child.

Per grade: the client sends a JSON request and closes its side; the child
answers `{"pid": N}` at once, then `{"ok": true, "scores": {...}}` or
`{"ok": false, "error": "..."}`.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading

_LOCK = threading.Lock()
_SERVER: tuple[subprocess.Popen, str] | None = None


class ForkError(RuntimeError):
    """The grade child ran past its time, or died without an answer."""


# ------------------------------------------------------------------ the runner's side


def _socket_path() -> str:
    """The running server's socket, started (again) if there is none."""
    global _SERVER
    with _LOCK:
        if _SERVER is None or _SERVER[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="forgerl-grader-"), "socket")
            proc = subprocess.Popen([sys.executable, "-m", "forgerl.runners.forkserver", path],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            if proc.stdout.readline().strip() != b"ready":
                proc.kill()
                raise ForkError(f"the grader server did not start (exit status {proc.wait()})")
            _SERVER = (proc, path)
        return _SERVER[1]


def fork_grade(request: dict, timeout: float) -> dict:
    """The child's answer to `request` ({"code", "transcript", "workspace"}); ForkError past `timeout` s."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(_socket_path())
        conn.sendall(json.dumps(request).encode())
        conn.shutdown(socket.SHUT_WR)
        reader = conn.makefile("rb")
        pid = json.loads(reader.readline())["pid"]
        try:
            line = reader.readline()
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise ForkError(f"ran past {timeout:.0f} s") from None
    if not line:
        raise ForkError("its process died without an answer")
    return json.loads(line)


# ------------------------------------------------------------------ the server


def _child(conn: socket.socket) -> None:
    """In the forked child: grade in the workspace, its prints discarded, and answer."""
    from .grading import run_grade

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # grade() may wait for processes of its own
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    try:
        request = json.loads(conn.makefile("rb").read())
        os.chdir(request["workspace"])
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        answer = {"ok": True, "scores": run_grade(request["code"], request["transcript"], request["workspace"])}
    except BaseException as e:  # noqa: BLE001 - whatever grade() raises is the grader's failure, reported
        answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    conn.sendall(json.dumps(answer).encode() + b"\n")


def serve(path: str) -> int:
    from . import grading  # noqa: F401 - imported once here, so children start with it

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
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
                if os.fork() == 0:  # the child never returns into this loop
                    try:
                        listener.close()
                        _child(conn)
                    finally:
                        os._exit(0)
                conn.close()
    finally:
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
