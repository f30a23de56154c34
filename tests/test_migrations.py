"""A dataset written by forgerl's schema v1 (`fixtures/dataset_v1`, the analysis example as main wrote it
before v2) is upgraded in place on first open, and then every verb reads the same data. What the upgrade writes,
row for row, is held by `test_migration_golden.py` (the migrations are frozen, so it is no longer compared with
the live segmenter)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forgerl.analysis import connect
from forgerl.schema import files, segments, store, tables
from forgerl.schema.conform import file_version
from forgerl.schema.coordination import Flock

from conftest import REPO

FIXTURE = Path(__file__).parent / "fixtures" / "dataset_v1"
BIN = REPO / ".venv" / "bin"


@pytest.fixture
def v1(tmp_path) -> Path:
    root = tmp_path / "v1"
    shutil.copytree(FIXTURE, root)
    assert json.loads((root / files.MANIFEST).read_text())["schema_version"] == 1
    assert all(file_version(Path(p)) == 1 for p in files.data_files(root, "calls"))
    return root


def _verb(*args: str) -> str:
    done = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_verb_reads_a_v1_dataset_and_they_agree(v1, tmp_path):
    listed = json.loads(_verb("forge-record", "ls", str(v1), "--json"))  # the first reader upgrades it
    manifest = json.loads((v1 / files.MANIFEST).read_text())
    assert manifest["schema_version"] == tables.SCHEMA_VERSION == 4
    assert manifest["migrations"] == ["m002_segments_and_harness_rank", "m003_tools_absent",
                                     "m004_malformed_tool_calls"]
    assert all(file_version(Path(p)) == 4 for p in files.data_files(v1, "calls"))
    assert all(file_version(Path(p)) == 2 for p in files.data_files(v1, "sessions"))

    calls = store.read_table(v1, "calls")
    sessions = store.read_table(v1, "sessions")
    n_sessions, n_calls = len(set(calls.column("session_id").to_pylist())), calls.num_rows
    assert n_sessions == 21 and n_calls == 90
    assert len(listed) == n_sessions and sum(r["calls"] for r in listed) == n_calls
    assert sessions.num_rows == n_sessions  # one row per session wherever it is read
    assert {r["session_id"]: r["harness"] for r in listed} == dict(zip(*(sessions.column(c).to_pylist()
                                                                           for c in ("session_id", "harness"))))
    counted = json.loads(_verb("forge-analyze", "sql", str(v1), "SELECT count(*) AS calls, count(DISTINCT "
                               "session_id) AS sessions, count(segment_index) AS placed FROM calls", "--format", "json"))
    placed = sum(1 for i in calls.column("segment_index").to_pylist() if i is not None)
    assert counted == [{"calls": n_calls, "sessions": n_sessions, "placed": placed}]
    assert connect(v1).sql("SELECT count(*) FROM sessions").fetchall()[0][0] == n_sessions

    out = tmp_path / "atif"
    _verb("forge-convert", str(v1), "--to", "atif", "--out", str(out))
    converted = json.loads((out / "manifest.json").read_text())
    assert converted["input"]["schema_version"] == 4
    segment_ids = {f"{s}:{i}" for s, i in zip(calls.column("session_id").to_pylist(),
                                             calls.column("segment_index").to_pylist()) if i is not None}
    assert converted["counts"]["segments"] == len(segment_ids) == 24
    shown = _verb("forge-record", "show", str(v1), "cc-subagent-a1")
    assert "cc-subagent-a1 (claude-code)" in shown


def test_an_upgrade_waits_for_live_writers(v1):
    """A writer still recording v1 files would leave the dataset mixed: the upgrade refuses, clearly."""
    (v1 / "_writers").mkdir(exist_ok=True)
    held = Flock(v1 / "_writers" / "old-writer.lock", blocking=False)
    try:
        with pytest.raises(files.SchemaVersionError, match="writer old-writer is still recording"):
            store.read_table(v1, "calls")
        assert json.loads((v1 / files.MANIFEST).read_text())["schema_version"] == 1
        assert all(file_version(Path(p)) == 1 for p in files.data_files(v1, "calls"))
    finally:
        held.release()
    assert pq.read_schema(files.data_files(v1, "calls")[0]).names == [
        n for n in tables.CALLS.names if n not in (*segments.NO_PLACE, "tools_absent", "malformed_tool_calls")]
    assert store.read_table(v1, "calls").schema == tables.CALLS


def test_the_bundled_example_is_at_the_current_schema():
    """Tests and docs read `analysis/example` in place, so a stale one would be upgraded (rewritten) by the
    first reader and leave the checkout dirty: a schema change upgrades it and commits the result."""
    example = REPO / "analysis" / "example"
    manifest = json.loads((example / files.MANIFEST).read_text())
    assert manifest["schema_version"] == tables.SCHEMA_VERSION
    assert all(file_version(Path(p)) == tables.SCHEMA_VERSION for p in files.data_files(example, "calls"))
