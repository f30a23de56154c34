"""The first process of a rollout: joins the rollout's cgroup, sets limits, opens the recorder bridge, runs the harness.

    python -m forgerl.runners.jail [--cgroup DIR] [--cpu-seconds N] [--bridge-port P --bridge-unix SOCK] -- ARGV...

It is a child subreaper: when the harness exits, whatever it left running
(daemonised children included) is re-parented here and killed. Under
`unshare --net --pid --fork --kill-child` it is also PID 1 of a fresh PID
namespace with a network namespace of its own: when it exits (or its
`unshare` parent is killed) the kernel kills every process left in the
namespace, so a harness's children cannot outlive the rollout. Inside the
network namespace it also answers DNS with "no such name" (see
`dns_fails_fast`). Its exit status is the harness's (128 + signal when
killed by one).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading

from .bridge import forward, unix_connector

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_PR_SET_CHILD_SUBREAPER = 36


def loopback_up() -> None:
    """`ip link set lo up`, without needing the ip binary."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


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
    for ip in servers:
        if ":" in ip:
            continue
        if not ip.startswith("127."):
            subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], capture_output=True, check=False)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((ip, 53))
        except OSError:
            continue
        threading.Thread(target=_answer_dns, args=(sock,), daemon=True).start()


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init, so it can find them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="forgerl-jail")
    p.add_argument("--cgroup", default="")
    p.add_argument("--cpu-seconds", type=int, default=0)
    p.add_argument("--bridge-port", type=int, default=0)
    p.add_argument("--bridge-unix", default="")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.cgroup:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if args.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_seconds, args.cpu_seconds + 5))
    if args.bridge_port:
        loopback_up()
        dns_fails_fast()
        listener = socket.create_server(("127.0.0.1", args.bridge_port), backlog=256)
        forward(listener, unix_connector(args.bridge_unix))
    become_subreaper()
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"forgerl-jail: cannot start {cmd[0]}: {e}", file=sys.stderr)
        return 127
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    if os.getpid() != 1:  # PID 1 of a namespace: the kernel kills the rest (and /proc shows the host's)
        kill_descendants()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
