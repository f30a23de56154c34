"""The uid the harness runs as, and what it is given to run as it: its own folders, and its runtime.

forgerl runs as root; a harness running as root could read every file root may (`/root/.aws`, a secret file, a
dataset of mode 600) and write the tools its verifier will run. In the jail's namespaces it runs as
`HARNESS_UID` instead. `nobody` (65534) because every distribution and image has it in `/etc/passwd` (git, ssh
and Node's `os.userInfo()` want an entry) and it owns no file: the harness owns only what it is handed here.
Every rollout's harness shares it; they cannot reach each other's folders, which stay in their rollouts' 0700
temp dirs (`mountns.reach` opens a rollout's own to its harness alone, in that harness's mount namespace).
Standard library only: the fork server imports it before it forks.
"""

from __future__ import annotations

import os
import shutil

HARNESS_UID = HARNESS_GID = 65534  # nobody / nogroup
_CAP_CHOWN, _CAP_SETGID, _CAP_SETUID = 0, 6, 7


def can_switch_uid() -> bool:
    """Whether this process may hand folders to `HARNESS_UID` and become it (CAP_CHOWN, CAP_SETGID, CAP_SETUID), and
    is not that uid already."""
    try:
        with open("/proc/self/status") as f:
            effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    needed = (1 << _CAP_CHOWN) | (1 << _CAP_SETGID) | (1 << _CAP_SETUID)
    return effective & needed == needed and os.getuid() != HARNESS_UID


def hand_over(paths: list[str], uid: int, gid: int) -> None:
    """Give every file under each of `paths` to uid:gid (what the harness writes: its workspace, its HOME and the
    configs written there for it). Symbolic links are never followed: a link an agent left in its workspace last
    round gives nothing outside it."""
    for path in paths:
        os.chown(path, uid, gid, follow_symlinks=False)
        for here, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(here, name), uid, gid, follow_symlinks=False)


def runtime(argv0: str, search_path: str) -> list[str]:
    """The files exec of `argv0` reads, symbolic links resolved: the program, and its `#!` interpreter (through
    `env`), so a runtime under a folder the harness may not search (a Python in a 0700 `/root`) can be reached."""
    found, program = [], shutil.which(argv0, path=search_path)
    while program and len(found) < 4:
        program = os.path.realpath(program)
        found.append(program)
        program = _interpreter(program, search_path)
    return found


def _interpreter(program: str, search_path: str) -> str | None:
    """The interpreter a `#!` line names (the program `/usr/bin/env` is asked for), or None."""
    try:
        with open(program, "rb") as f:
            line = f.readline(256)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        program_words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(program_words[0], path=search_path) if program_words else None
    return words[0] if words else None
