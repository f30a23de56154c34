"""A rollout's own view of the filesystem: the machine's root, plus per-rollout directories at fixed paths.

Benchmarks written for containers (Harbor) expect fixed absolute paths: the
working directory (`/app`), `/logs/verifier`, `/tests`. On the local runner
there is no image, so PID 1 of the rollout's jail, in a mount namespace of
its own (`unshare --mount`), builds a root on a tmpfs: every top-level entry
of the machine's `/` bound into it as it is, except the top-level names the
rollout's binds claim, which are fresh directories on that tmpfs; then each
bind (target path inside, source directory of this rollout outside), and
`pivot_root` into it. Parallel rollouts each get their own `/app`, `/tests`
and `/logs/verifier`; nothing of the machine's own `/logs` or `/app`, if
any, shows through, and nothing is created outside the rollout's temp dir.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import stat
from pathlib import PurePosixPath

from .namespaces import CLONE_NEWNS, LIBC, check, unshare

_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x20, 0x1000, 0x4000, 1 << 18
_KEPT_FLAGS = 0x2 | 0x4 | 0x8 | 0x400 | 0x800  # nosuid, nodev, noexec, noatime, nodiratime (ST_ = MS_ values)
SCRATCH = frozenset({"tmp", "dev", "proc", "sys", "run"})  # stay writable: what programs expect to write
_MNT_DETACH = 2
_SAFE_FLAGS = 0x2 | 0x4 | 0x8  # nosuid, nodev, noexec: the harness's /proc, the tmpfs of `reach`
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    check(LIBC.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source or fstype} on {target}")


def bind(source: str, target: str) -> None:
    """Bind `source` (with what is mounted beneath it) at `target`, in this mount namespace only."""
    _mount(source, target, None, _MS_BIND | _MS_REC)


def _pivot_root(new_root: str) -> None:
    """Make `new_root` this namespace's `/` and detach the old one (no way back to it from inside)."""
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown syscall number on {platform.machine()}")
    os.chdir(new_root)
    check(LIBC.syscall(number, b".", b"."), "pivot_root")
    check(LIBC.umount2(b".", _MNT_DETACH), "detach the old root")
    os.chdir("/")


def enter_root(new_root: str, binds: list[tuple[str, str]], writable: list[str] | None = None) -> None:
    """In a fresh mount namespace: `/` as it was, with each (target, source) of `binds` bound at target.

    `new_root` is an empty directory of this rollout's (it becomes the
    tmpfs the new root lives on). Top-level names a target falls under
    are fresh directories, so targets never touch the machine's own files.
    A source of "" leaves the target an empty directory on the tmpfs (a
    mount point for later). With `writable` (paths), the machine's own
    top-level folders are bound read-only, except `SCRATCH` and those
    holding a `writable` path: the agent can change neither the machine
    nor the tools its verifier will run.
    """
    unshare(CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here shows outside
    _mount("tmpfs", new_root, "tmpfs", 0, "mode=0755")
    claimed = {PurePosixPath(target).parts[1] for target, _ in binds}
    for name in sorted(os.listdir("/")):
        if name in claimed:
            continue
        source, dest = f"/{name}", os.path.join(new_root, name)
        if os.path.islink(source):
            os.symlink(os.readlink(source), dest)
        elif os.path.isdir(source):
            os.mkdir(dest)
            bind(source, dest)
            if writable is not None and name not in SCRATCH | {PurePosixPath(p).parts[1] for p in writable}:
                _read_only(dest)
        else:
            open(dest, "w").close()
            _mount(source, dest, None, _MS_BIND)
    for target, source in binds:
        dest = new_root + target
        os.makedirs(dest, exist_ok=True)  # under a claimed name: on the tmpfs
        if source:
            bind(source, dest)
    _pivot_root(new_root)
    LIBC.umount2(new_root.encode(), _MNT_DETACH)  # the tmpfs as seen again through the bound parent


def own_proc() -> None:
    """In a fresh mount namespace: a procfs of this process's PID namespace over `/proc`, so `/proc` lists only
    the processes of that namespace (none of forgerl's), with `hidepid=2` (a process that may not trace another,
    such as one without capabilities, does not even see it). Call it as the first process of the namespace."""
    unshare(CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # the new /proc must not show outside
    _mount("proc", "/proc", "proc", _SAFE_FLAGS, "hidepid=2")


def reach(paths: list[str], uid: int, gid: int) -> None:
    """In this process's own mount namespace (after `own_proc`): let uid:gid reach each of `paths` through the
    folders on the way that it may not search (the rollout's 0700 temp dir holding its workspace and HOME, a 0700
    `/root` holding the Python), opening nothing else in them: each such folder is covered by a tmpfs that holds
    only the entries on the way, bound from the folder itself. Elsewhere (another rollout's harness, in a
    namespace of its own) the folder stays as it is, closed."""
    ways: dict[str, set[str]] = {}
    for path in paths:
        parts = PurePosixPath(os.path.realpath(path)).parts
        for depth in range(1, len(parts)):
            folder = os.path.join(*parts[:depth])
            if not _searchable(os.stat(folder), uid, gid):
                ways.setdefault(folder, set()).add(parts[depth])
    for folder in sorted(ways, key=lambda f: f.count("/")):  # outer folders first: inner ones are then bound in
        kept = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the folder itself, once covered
        try:
            _mount("tmpfs", folder, "tmpfs", _SAFE_FLAGS, "mode=0755,size=64k")
            for name in sorted(ways[folder]):
                source, target = f"/proc/self/fd/{kept}/{name}", os.path.join(folder, name)
                if os.path.isdir(source):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                bind(source, target)
        finally:
            os.close(kept)


def _searchable(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether uid:gid (no other groups) may search a folder of this owner and mode (ACLs aside)."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _read_only(path: str) -> None:
    """Remount the bind at `path` read-only (its own mount; what is mounted beneath it keeps its flags)."""
    kept = os.statvfs(path).f_flag & _KEPT_FLAGS  # flags a user namespace locks must be repeated
    _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)


def fresh_dir(path: str) -> None:
    """An empty directory at `path`, whatever was there (a directory, a file, a symlink planted there)."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    os.mkdir(path, 0o777)
