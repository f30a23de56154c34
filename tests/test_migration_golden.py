"""Migrations are frozen: upgrading the stored v1 dataset (`fixtures/dataset_v1`, written by forgerl v1) gives,
table for table and row for row, the committed result (`fixtures/dataset_v1_upgraded.jsonl.gz`).

The expected file was made by the migrations as they stood before they were frozen (commit 3d48f63, which
called the live segmenter), so the frozen copies are held to what upgrading produced then; a change to
`schema/segments.py` cannot move it. The comparison is a stable serialisation (every file's table, schema version
and columns, then its rows as canonical JSON), not the Parquet bytes, which carry the writing pyarrow's version.

A new migration changes the upgraded result on purpose: rewrite the expected file with
`.venv/bin/python tests/test_migration_golden.py` and review its diff.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import sys
from datetime import date, datetime
from pathlib import Path

import pyarrow.parquet as pq

from forgerl.schema import segments, store

FIXTURES = Path(__file__).parent / "fixtures"
OLD = FIXTURES / "dataset_v1"
EXPECTED = FIXTURES / "dataset_v1_upgraded.jsonl.gz"  # 750 kB of JSON as 90; zcat to read it


def _plain(value: object) -> object:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def dump(root: Path) -> list[str]:
    """The dataset as lines of canonical JSON: its manifest's version and migrations, then for every table file
    in name order its table, schema version and columns, then its rows."""
    manifest = json.loads((root / "forgerl.json").read_text())
    lines = [json.dumps({"schema_version": manifest["schema_version"], "migrations": manifest.get("migrations", [])})]
    for path in sorted(root.glob("*/*.parquet")):
        if path.parent.name.startswith("_"):
            continue
        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        lines.append(json.dumps({"file": f"{path.parent.name}/{path.name}",
                                 "table": meta.get(b"forgerl.table", b"").decode(),
                                 "version": meta.get(b"forgerl.schema_version", b"1").decode(),
                                 "columns": [f"{f.name}: {f.type}" for f in table.schema]}))
        lines += [json.dumps(row, sort_keys=True, default=_plain) for row in table.to_pylist()]
    return lines


def expected() -> list[str]:
    return gzip.decompress(EXPECTED.read_bytes()).decode().splitlines()


def upgraded(tmp: Path) -> Path:
    """A copy of the v1 dataset, upgraded in place by opening it."""
    root = tmp / "v1"
    shutil.copytree(OLD, root)
    store.open_dataset(root)
    return root


def test_upgrading_the_stored_v1_dataset_gives_the_committed_result(tmp_path):
    got, want = dump(upgraded(tmp_path)), expected()
    for line, (mine, theirs) in enumerate(zip(got, want), 1):
        assert mine == theirs, f"{EXPECTED.name} line {line} differs"
    assert len(got) == len(want)


def test_a_change_to_the_live_segmenter_does_not_change_the_upgrade(tmp_path, monkeypatch):
    """The frozen m002 places calls by its own copy: with the live segmenter placing nothing and flagging
    everything, the upgrade still gives the committed result."""
    monkeypatch.setattr(segments.SessionThreads, "place", lambda self, row, message_of: None)
    monkeypatch.setattr(segments, "tools_absent", lambda tools, part_types: True)
    assert dump(upgraded(tmp_path)) == expected()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        text = "\n".join(dump(upgraded(Path(tmp)))) + "\n"
    EXPECTED.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"wrote {EXPECTED}", file=sys.stderr)
