"""The Linux namespace calls the jail, its bridge and the fork server make (libc through ctypes: Python 3.11 has no
`os.unshare` or `os.setns`). Standard library only: the fork server imports it before it forks."""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
LIBC = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    """OSError with errno's text if a libc call returned non-zero."""
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """New namespaces of the kinds `flags` names: for this thread (network, mount), or its next children (PID)."""
    check(LIBC.unshare(flags), "unshare")


def setns(fd: int, flags: int) -> None:
    """Move this thread into the namespace `fd` (an open /proc/PID/ns/... file) is, or its next children (PID)."""
    check(LIBC.setns(fd, flags), "setns")


def open_namespace(kind: str) -> int:
    """An fd of this thread's namespace of `kind` ("net", "pid_for_children", ...), closed on exec."""
    return os.open(f"/proc/thread-self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
