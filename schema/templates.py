"""Which chat template a tokenizer folder holds, as one sha256, and which one a checkpoint was trained with.

A policy learns the exact text its training rows were rendered in; served
under another template it sees prompts it never saw, and nothing fails:
the rewards just fall. So the template is named by a hash of its text,
exactly as the folder holds it (`chat_template.jinja`, else
`tokenizer_config.json`'s `chat_template`; a list of named templates: the
`default` one), the way transformers loads it: forge-convert's manifest
records it beside the tokenizer's sha256 (`tokenizer.chat_template_sha256`),
a checkpoint's `forgerl_policy.json` carries the one it was trained on, and
`forge-record serve --policy` compares that with the folder it renders from.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

POLICY_FILE = "forgerl_policy.json"  # a checkpoint folder's provenance: versions, shards, template hash


def template_file(folder: str | os.PathLike) -> Path:
    """The file a folder's chat template is read from: `chat_template.jinja` where there is one, which
    transformers prefers, else `tokenizer_config.json`."""
    jinja = Path(folder) / "chat_template.jinja"
    return jinja if jinja.is_file() else Path(folder) / "tokenizer_config.json"


def chat_template(folder: str | os.PathLike) -> str | None:
    """The folder's chat template text as transformers reads it, or None when it holds none (ValueError: a
    `tokenizer_config.json` that is not a JSON object)."""
    path = template_file(folder)
    if path.suffix == ".jinja":
        return path.read_text()
    template = _json(path).get("chat_template") if path.is_file() else None
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def template_sha256(template: str) -> str:
    """The sha256 naming a chat template: of its text's UTF-8 bytes, nothing normalised."""
    return hashlib.sha256(template.encode()).hexdigest()


def folder_template_sha256(folder: str | os.PathLike) -> str | None:
    """`template_sha256` of the folder's chat template; None when it has none."""
    template = chat_template(folder)
    return None if template is None else template_sha256(template)


def trained_template_sha256(checkpoint: str | os.PathLike) -> str | None:
    """The template hash a checkpoint folder says its policy was trained with (its `forgerl_policy.json`'s
    `chat_template_sha256`); None when the folder does not say (no such file, or no such key). ValueError: a
    policy file that is not a JSON object."""
    path = Path(checkpoint) / POLICY_FILE
    if not path.is_file():
        return None
    info = _json(path)
    value = info.get("chat_template_sha256")
    return value if isinstance(value, str) and value else None


def _json(path: Path) -> dict:
    """A JSON object file (ValueError naming the file otherwise)."""
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value
