"""What a torch-trained checkpoint's `forgerl_policy.json` says: one record for `forge-train sft --engine torch` and
each `forge-train rl --engine torch` iteration, so the fields serve mode and the reports read are written alike."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

from forgerl.schema.templates import folder_template_sha256


def policy_record(model: Any, *, version: str, parent: str | None, seed: int, base: str | None, shards: Path,
                  template_folder: Path, steps: int, losses: list[float], seconds: float) -> dict[str, Any]:
    """The checkpoint's lineage (version, parent, base), how it was trained (seed, shards, steps, first and last
    loss, seconds, this process's peak RSS), and the tokenizer hash its shards were converted with and the chat
    template it is served with (`template_folder`'s), which serve mode compares with what it renders."""
    manifest = json.loads((shards / "manifest.json").read_text())
    return {"policy_version": version, "parent": parent, "engine": "torch",
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "seed": seed, "base": base,
            "tokenizer_sha256": manifest["tokenizer"]["sha256"],
            "chat_template_sha256": folder_template_sha256(template_folder),
            "shards": [str((shards / "manifest.json").resolve())], "steps": steps,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "seconds": round(seconds, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}  # Linux: KiB
