"""The first process of a rollout: joins the rollout's cgroup, sets limits, opens the recorder bridge, runs the harness
(and, where asked, a grade() that reads files alone after it: `forkserver`'s jail job).

`run_confined` runs in a fresh child of the warm fork server
(`forkserver.py`), so a rollout pays a fork, not a Python start-up (about
60 ms of CPU beside the harnesses, on a small machine throughput lost). It is
the leader of a session of its own, which the runner kills on timeout.

With a bridge it is PID 1 of a PID namespace of its own already (the fork
server unshared one for its next child, `forkserver.Forked`), and unshares a
network namespace (together as `unshare --net --pid --fork --kill-child`
would): there, with only loopback, it answers DNS with "no such name" (see
`dns_fails_fast`) and forwards 127.0.0.1:PORT to the recorder on TCP
sockets made in the machine's network namespace (`bridge.py`). One process
and one copy of each byte (it was two processes, the first handing sockets
over from outside). When PID 1 exits (or is killed) the kernel kills every
process left in the namespace, so a harness's children cannot outlive the
rollout. Without a bridge it is a child subreaper instead: whatever the
harness left running (daemonised children included) is re-parented to it
and killed. The status is the harness's (128 + signal when killed by one).

With the namespaces, the harness itself runs as PID 1 of one more PID
namespace, with a `/proc` of that namespace's own and no capabilities
(`_run_hidden`): no process of forgerl's, this jail included, is in its
sight, so it cannot read the keys in their environments. Where the runner
asks (`JailSpec.user`), it also runs as a uid of its own
(`harness_user.py`), owning its workspace and HOME and no file of root's.
"""

from __future__ import annotations

import fcntl
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .bridge import connector_from, forward
from .harness_user import hand_over, runtime
from .mountns import enter_root, own_proc, reach
from .namespaces import CLONE_NEWNET, CLONE_NEWPID, LIBC, drop_capabilities, open_namespace, unshare
from .services import ServiceStage
from .verifier import VerifierStage, kill_namespace, run_stage, snapshot

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_SIOCSIFADDR, _SIOCSIFNETMASK = 0x8916, 0x891C
_PR_SET_CHILD_SUBREAPER, _PR_SET_PDEATHSIG = 36, 1


@dataclass
class JailSpec:
    """One harness run as the runner asks for it (sent to the fork server as JSON)."""

    argv: list[str]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    cgroup: str = ""  # a cgroup directory to join
    cpu_seconds: int = 0  # RLIMIT_CPU, per process
    bridge_port: int = 0  # namespaces, and 127.0.0.1:PORT inside forwarded to the recorder
    recorder_host: str = ""
    recorder_port: int = 0
    # Optional stages (`verifier.Layout`): a root of the rollout's own in a mount namespace, the harness's
    # wall clock kept by PID 1, and a verifier run after the harness. Need the namespaces (a bridge).
    root: str = ""
    binds: list[list[str]] = field(default_factory=list)
    writable: list[str] | None = None  # with a root: the machine's folders are read-only but these
    harness_timeout_s: float = 0.0
    verifier: dict | None = None
    # Optional stage (`services.py`): the task's services (Service.to_json), started by PID 1 before the harness;
    # their state endpoints are read into `state_file` afterwards. Needs the namespaces (a bridge).
    services: list[dict] = field(default_factory=list)
    state_file: str = ""
    # Optional: {"code", "workspace"}, a grade() that reads files alone, run by the jail once the harness has ended
    # (`forkserver`'s jail job), so a rollout's grade costs no process of its own.
    grade: dict | None = None
    # Optional, with the namespaces: [uid, gid] the harness runs as (`harness_user.py`), its own folders handed to it.
    user: list[int] | None = None
    reach: list[str] = field(default_factory=list)  # with `user`: files besides its own it must reach (MCP servers')
    scratch: str = ""  # with `user`: its own temp dir (its TMPDIR), handed to it too


def loopback_up() -> None:
    """`ip link set lo up`, without needing the ip binary."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def add_loopback_address(ip: str, label: str) -> None:
    """`ip addr add IP/32 dev lo label LABEL`, without forking the ip binary (OSError if it cannot)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for request, address in ((_SIOCSIFADDR, socket.inet_aton(ip)), (_SIOCSIFNETMASK, b"\xff" * 4)):
            fcntl.ioctl(s.fileno(), request, struct.pack("16sHH4s16x", label.encode(), socket.AF_INET, 0, address))


def _nxdomain(query: bytes) -> bytes | None:
    """The answer "no such name" to a DNS query: header flags + the query's own question section."""
    if len(query) < 12:
        return None
    end = 12
    while end < len(query) and query[end]:
        end += query[end] + 1
    end += 5  # the root label, QTYPE, QCLASS
    if end > len(query):
        return None
    flags = 0x8000 | (query[2] << 8 & 0x7900) | 0x0080 | 3  # QR, opcode + RD as asked, RA, NXDOMAIN
    return query[:2] + struct.pack(">HHHHH", flags, 1, 0, 0, 0) + query[12:end]


def _answer_dns(sock: socket.socket) -> None:
    while True:
        query, peer = sock.recvfrom(512)
        reply = _nxdomain(query)
        if reply:
            sock.sendto(reply, peer)


def dns_fails_fast(resolv_conf: str = "/etc/resolv.conf") -> None:
    """Answer every name lookup with NXDOMAIN at the configured nameservers' addresses.

    In a namespace with only loopback, a nameserver is unreachable; glibc gives
    up at once, but some resolvers (musl, so Codex) wait out their timeouts.
    """
    try:
        servers = [line.split()[1] for line in open(resolv_conf) if line.startswith("nameserver")]
    except OSError:
        return
    for n, ip in enumerate(servers, start=1):
        if ":" in ip:
            continue
        try:
            if not ip.startswith("127."):
                add_loopback_address(ip, f"lo:{n}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((ip, 53))
        except OSError:
            continue
        threading.Thread(target=_answer_dns, args=(sock,), daemon=True).start()


def die_with_parent(sig: int) -> None:
    """Get `sig` once the thread that forked this process is gone (however it went: kill -9 included). Safe
    between fork and exec: libc is loaded already."""
    LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init, so it can find them."""
    LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_descendants() -> None:
    """Kill and reap every process left under this one (children that daemonised included)."""
    me = os.getpid()
    while True:
        children = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == me:
                    children.append(int(entry))
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def run_confined(spec: JailSpec, stdout: int, stderr: int, runner: socket.socket,
                 ready: Callable[[], bool]) -> int:
    """Confine this (freshly forked) process, run the harness in it, and return the harness's status once
    nothing the harness started is left running.

    Once confined it calls `ready()`, which returns when the harness may
    start (False: never; the runner is gone). `runner` is the connection to
    the runner that asked: should the runner die first, everything under
    the jail is killed.
    """
    if spec.cgroup:
        with open(os.path.join(spec.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if spec.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (spec.cpu_seconds, spec.cpu_seconds + 5))
    if not spec.bridge_port:
        become_subreaper()
        if not ready():
            return 127
        code = _run(spec, stdout, stderr, runner)
        kill_descendants()
        return code
    if os.getpid() != 1:
        raise OSError("a jail with a bridge must be PID 1 of a PID namespace of its own (the fork server's job)")
    return _pid_one(spec, stdout, stderr, runner, ready)


def _pid_one(spec: JailSpec, stdout: int, stderr: int, runner: socket.socket, ready: Callable[[], bool]) -> int:
    """PID 1 of the new PID namespace, in a network namespace of its own: loopback, DNS that fails fast, the
    bridge to the recorder (on sockets made in the machine's network namespace, kept open here), the harness."""
    outside = open_namespace("net")
    unshare(CLONE_NEWNET)
    loopback_up()
    dns_fails_fast()
    listener = socket.create_server(("127.0.0.1", spec.bridge_port), backlog=256)
    connect = connector_from(outside, open_namespace("net"), spec.recorder_host, spec.recorder_port)
    forward(listener, connect)
    code = _with_services(spec, lambda go: _confined_run(spec, stdout, stderr, runner, go), ready, stderr, runner)
    kill_namespace()  # what the harness left (daemons included), before anything else looks at its workspace
    return code


def _with_services(spec: JailSpec, body: Callable[[Callable[[], bool]], int], ready: Callable[[], bool],
                   stderr: int, runner: socket.socket) -> int:
    """`body(ready)` with the task's services up (`services.ServiceStage`); 127, the harness never started, if one
    is not. The harness's clock (`harness_timeout_s`) runs from the runner's go, so an agent past its time is
    stopped here and the services' state is still read.

    `body` (the agent, then a verifier) runs as PID 1 of a PID namespace nested in this one: every process the
    agent leaves is in it, killed before a verifier runs (`verifier.kill_namespace`) and when it ends, while the
    services, started here, stay up through the verifier. No process of the agent's can pass as a service: a
    process cannot move to an ancestor PID namespace.
    """
    if not spec.services:
        return body(ready)
    stage = ServiceStage(spec.services, spec.state_file)
    if not stage.start():
        return 127
    went_r, went_w = os.pipe()  # the nested PID 1 sends when the runner said go (CLOCK_MONOTONIC is system-wide)

    def go() -> bool:
        answer = ready()
        os.write(went_w, struct.pack("d", time.monotonic()))
        return answer

    try:
        pid = _fork_child(lambda: _in_namespaces_of(CLONE_NEWPID, lambda: body(go), stderr, runner), stderr)
        os.close(went_w)
        went_w = -1
        return _wait_child(pid, runner)
    finally:
        if went_w >= 0:
            os.close(went_w)
        went = os.read(went_r, 8)  # nothing: the runner never said go
        os.close(went_r)
        stage.finish(len(went) == 8 and 0 < spec.harness_timeout_s <= time.monotonic() - struct.unpack("d", went)[0])


def _in_namespaces_of(flags: int, body: Callable[[], int], stderr: int, runner: socket.socket) -> int:
    """In a child: unshare the namespaces `flags` names, and run `body` as the first process in them."""
    unshare(flags)
    pid = _fork_child(body, stderr)
    return _wait_child(pid, runner)


def _confined_run(spec: JailSpec, stdout: int, stderr: int, runner: socket.socket, ready: Callable[[], bool]) -> int:
    """The harness (and verifier) in the namespaces, in the rollout's own root where it has one."""
    if spec.root:
        enter_root(spec.root, [(target, source) for target, source in spec.binds], spec.writable)
    if spec.verifier is None:
        return _run(spec, stdout, stderr, runner) if ready() else 127
    return _harness_then_verifier(spec, stdout, stderr, runner, ready)


def _harness_then_verifier(spec: JailSpec, stdout: int, stderr: int, runner: socket.socket,
                           ready: Callable[[], bool]) -> int:
    """The harness under PID 1's own clock, then the verifier stage (`verifier.run_stage`); the harness's status."""
    stage = VerifierStage(**spec.verifier)
    tests = snapshot(stage.tests_source)  # before the agent can touch them
    if not ready():
        return 127
    start = time.monotonic()
    code = _run(spec, stdout, stderr, runner)
    timed_out = bool(spec.harness_timeout_s) and time.monotonic() - start >= spec.harness_timeout_s
    run_stage(stage, tests, timed_out)
    return code


def _fork_child(body: Callable[[], int], stderr: int) -> int:
    """Fork a child that dies with this process and exits with `body()`'s status (127 if it raises: said on
    the rollout's `stderr`)."""
    alive_r, alive_w = os.pipe()  # EOF once the parent is gone (its pid may not be visible from the child)
    pid = os.fork()
    if pid == 0:
        code = 127
        try:
            os.close(alive_w)
            die_with_parent(signal.SIGKILL)
            if not select.select([alive_r], [], [], 0)[0]:  # else the parent died before the line above
                os.close(alive_r)
                code = body()
        except BaseException as e:  # noqa: BLE001 - reported in the rollout's stderr, as the jail's own failure
            os.write(stderr, f"forgerl-jail: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(code)
    os.close(alive_r)
    return pid


def _wait_child(pid: int, runner: socket.socket) -> int:
    """The child's status; killed at once on SIGTERM, or if the runner hangs up first."""
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    if _runner_gone_first(pid, runner):
        os.kill(pid, signal.SIGKILL)
    return _status(os.waitpid(pid, 0)[1])


def _runner_gone_first(pid: int, runner: socket.socket, timeout_s: float | None = None) -> bool:
    """Wait for child `pid` to exit (without reaping it), or for the runner to hang up: whether the runner did
    (or `timeout_s` passed first: the child must go either way).

    The runner hangs up only by dying before the harness ended, without
    killing the jail; then what is under the jail must go too. (No watcher
    thread: a process that has unshared a PID namespace cannot start one.)
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    exited = os.pidfd_open(pid)
    try:
        events = select.poll()
        events.register(exited, select.POLLIN)
        events.register(runner, 0)  # only POLLHUP and POLLERR, which poll always reports
        left = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
        return exited not in dict(events.poll(left))
    finally:
        os.close(exited)


def _run(spec: JailSpec, stdout: int, stderr: int, runner: socket.socket) -> int:
    if spec.bridge_port:
        return _run_hidden(spec, stdout, stderr, runner)
    try:
        child = subprocess.Popen(spec.argv, cwd=spec.cwd, env=spec.env, stdin=subprocess.DEVNULL, stdout=stdout,
                                 stderr=stderr)
    except OSError as e:
        os.write(stderr, f"forgerl-jail: cannot start {spec.argv[0]}: {e}\n".encode())
        return 127
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    if _runner_gone_first(child.pid, runner, spec.harness_timeout_s or None):
        child.kill()
    return _exit_code(child.wait())


def _run_hidden(spec: JailSpec, stdout: int, stderr: int, runner: socket.socket) -> int:
    """The harness as PID 1 of a PID namespace of its own, with that namespace's own `/proc` and no capabilities:
    it sees only its own processes, none of forgerl's (this jail, the services, the runner, the recorder), and
    cannot unmount that `/proc` or read another process's environment or memory. When it exits, the kernel kills
    what it left; SIGTERM (the runner's) kills it."""
    pid = _fork_child(lambda: _in_namespaces_of(CLONE_NEWPID, lambda: _exec_harness(spec, stdout, stderr),
                                                stderr, runner), stderr)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    if _runner_gone_first(pid, runner, spec.harness_timeout_s or None):
        os.kill(pid, signal.SIGKILL)
    return _status(os.waitpid(pid, 0)[1])


def _exec_harness(spec: JailSpec, stdout: int, stderr: int) -> int:
    """Become the harness (PID 1 of its namespace): its own `/proc`, its stdio, no capabilities, and where asked its
    own uid, holding its folders (127 if it cannot be started)."""
    own_proc()
    if spec.user:
        _give_the_harness_user(spec)
    os.chdir(spec.cwd)
    stdin = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.closerange(3, 1 << 20)  # nothing of the jail's (its sockets, the runner's connection) goes with it
    drop_capabilities((spec.user[0], spec.user[1]) if spec.user else None)
    try:
        os.execvpe(spec.argv[0], spec.argv, spec.env)
    except OSError as e:
        os.write(2, f"forgerl-jail: cannot start {spec.argv[0]}: {e}\n".encode())
    return 127


def _give_the_harness_user(spec: JailSpec) -> None:
    """Hand the harness's own folders (its working directory, its HOME with the configs written there for it, its
    temp dir, the folders a layout binds for it) to its uid, and let it reach them, its runtime and the files its
    MCP servers need (`mountns.reach`)."""
    uid, gid = spec.user
    folders = [spec.cwd, spec.env.get("HOME", ""), spec.scratch, *(target for target, source in spec.binds if source)]
    own = [p for p in dict.fromkeys(folders) if p and os.path.isdir(p)]
    hand_over(own, uid, gid)
    reach([*own, *runtime(spec.argv[0], spec.env.get("PATH", os.defpath)), *spec.reach], uid, gid)


def _status(wait_status: int) -> int:
    return _exit_code(os.waitstatus_to_exitcode(wait_status))


def _exit_code(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + signal when a signal killed it."""
    return 128 - returncode if returncode < 0 else returncode
