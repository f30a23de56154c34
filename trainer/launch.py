"""Composing a complete veRL config, writing it, and the command that runs veRL on it.

veRL's entry points are Hydra apps. We compose their own packaged config
(`verl.trainer.config`) with our overrides, so a bad key fails here in one
line rather than on the cluster, and write the whole resolved tree
(`<out>/<name>.yaml`): what ran is on disk, and the launch is simply
`--config-path <out> --config-name <name>`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from forgerl.errors import UserError


class LaunchError(UserError):
    """Bad options or data: one line, exit 2."""


def compose(config_name: str, overrides: list[str]) -> str:
    """veRL's packaged config `config_name` with `overrides` applied, as YAML (interpolations kept)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_module("verl.trainer.config", version_base=None):
            return OmegaConf.to_yaml(hydra_compose(config_name, overrides=overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise LaunchError(f"veRL config {config_name}: {str(e).splitlines()[0]}") from None


def write_config(out: Path, name: str, text: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.yaml"
    path.write_text(text)
    return path


def yaml_list(paths: list[str]) -> str:
    """A Hydra override value for a list of paths."""
    return "[" + ",".join(paths) + "]"


def run(cmd: list[str], dry_run: bool) -> int:
    print(shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    return subprocess.call(cmd)


def module_command(module: str, config: Path, nproc: int | None = None) -> list[str]:
    """`torchrun` for SPMD trainers (SFT), plain python for Ray-driven ones (PPO)."""
    head = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
            if nproc else [sys.executable])
    return [*head, "-m", module, f"--config-path={config.parent.resolve()}", f"--config-name={config.stem}"]
