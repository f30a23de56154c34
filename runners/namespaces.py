"""The Linux namespace calls the jail, its bridge and the fork server make (libc through ctypes: Python 3.11 has no
`os.unshare` or `os.setns`). Standard library only: the fork server imports it before it forks."""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
LIBC = ctypes.CDLL(None, use_errno=True)
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, _PR_SET_NO_NEW_PRIVS = 24, 47, 4, 38
_CAPABILITY_VERSION_3 = 0x20080522


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


def drop_capabilities(user: tuple[int, int] | None = None) -> None:
    """Give up every capability, for good, and with `user` (uid, gid) become that user, without supplementary
    groups: this process and whatever it executes can mount, unmount, trace or read the memory of no process that
    holds more (forgerl's own), nor regain any through a set-uid binary, nor (as another uid) read root's files.

    The order matters: the bounding set needs CAP_SETPCAP, the ids CAP_SETUID and CAP_SETGID, so the ids are switched
    after the one and before the last step empties the rest. Safe between fork and exec: libc is loaded already."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):  # the bounding set: what an exec by root would grant again
        check(LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop a capability from the bounding set")
    check(LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear the ambient capabilities")
    check(LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
    if user is not None:
        uid, gid = user
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # the kernel clears the permitted and effective sets here
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    check(LIBC.capset(header, (ctypes.c_uint32 * 6)()), "capset")  # effective, permitted, inheritable: none
