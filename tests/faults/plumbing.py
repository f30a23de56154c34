"""Test-only faults for `test_plumbing_refusals.py`: broken plumbing as a slip would leave it, never a switch in
the product.

- `checkpoint`: a checkpoint folder as forge-train leaves one for serving (the tokenizer files and a
  `forgerl_policy.json` naming the template it was trained with); `edit_template` then changes the template in
  the folder, as a tokenizer swapped or re-saved after training would.
- `rewrite_outcomes`: a dataset's `outcomes` files rewritten row by row, as a runner or a script that joined
  rewards to the wrong sessions would have written them (`swap_sessions`, `duplicate`, `set_field`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from forgerl.schema.conform import file_version, read_files
from forgerl.schema.files import atomic_write_table, data_files
from forgerl.schema.templates import POLICY_FILE, folder_template_sha256, template_file

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja")


def checkpoint(tokenizer_dir: str | Path, dest: Path, version: str = "v1") -> Path:
    """`dest` holding the tokenizer's files and a `forgerl_policy.json` trained with its template."""
    tokenizer_dir = Path(tokenizer_dir)
    dest.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, dest / name)
    (dest / POLICY_FILE).write_text(json.dumps({"policy_version": version, "parent": "v0", "engine": "torch",
                                                "chat_template_sha256": folder_template_sha256(tokenizer_dir)}))
    return dest


def edit_template(folder: Path, old: str, new: str) -> None:
    """Replace `old` (which must be there) by `new` in the folder's chat template, in the file that holds it."""
    path = template_file(folder)
    if path.suffix == ".jinja":
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
        return
    config = json.loads(path.read_text())
    assert old in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(old, new)
    path.write_text(json.dumps(config, ensure_ascii=False, indent=2))


Rows = list[dict]


def rewrite_outcomes(root: Path, change: Callable[[Rows], Rows]) -> None:
    """The dataset's outcome rows, changed by `change`, as its one outcomes file (the others removed)."""
    paths = [Path(p) for p in data_files(root, "outcomes")]
    version = max(file_version(p) for p in paths)
    table = read_files("outcomes", paths)
    rows = change(table.to_pylist())
    for p in paths:
        p.unlink()
    atomic_write_table(paths[0], pa.Table.from_pylist(rows, schema=table.schema), "outcomes", version)


def swap_sessions(first: int, second: int) -> Callable[[Rows], Rows]:
    """Rows `first` and `second` (in session-id order) trade session ids: each reward lands on the other's."""
    def change(rows: Rows) -> Rows:
        rows = sorted(rows, key=lambda r: r["session_id"])
        rows[first]["session_id"], rows[second]["session_id"] = rows[second]["session_id"], rows[first]["session_id"]
        return rows
    return change


def duplicate(index: int, **changed: object) -> Callable[[Rows], Rows]:
    """Row `index` (in session-id order) written again, with `changed` fields (none: an exact repeat)."""
    def change(rows: Rows) -> Rows:
        rows = sorted(rows, key=lambda r: r["session_id"])
        return rows + [{**rows[index], **changed}]
    return change


def set_field(index: int, **changed: object) -> Callable[[Rows], Rows]:
    """Row `index` (in session-id order) with `changed` fields."""
    def change(rows: Rows) -> Rows:
        rows = sorted(rows, key=lambda r: r["session_id"])
        rows[index] = {**rows[index], **changed}
        return rows
    return change
