"""Ordered, named migrations that upgrade a dataset in place, once, when it is first opened.

Every reader and writer opens a dataset through `store.open_dataset`, which
runs `upgrade` when the manifest's schema version is older than this
forgerl's (as simonw/llm migrates its store on open). A migration rewrites the
files of the tables it changes (atomically, one file at a time) and the
manifest records its name, so every read path (`read_table`, the DuckDB
views, `forge-record ls/show`, the converters, the agent loop) sees one
schema version. A dataset with a live writer is not upgraded: the writer
would keep adding old files. Files a migration did not touch keep their
version; their tables did not change.

- `m002_segments_and_harness_rank` (v1 -> v2): every trainable call gets its
  place in its session's threads (`schema/segments.py`, computed from the
  stored calls and parts in recording order), and every `sessions` row the
  rank of the evidence that named its harness.
- `m003_tools_absent` (v2 -> v3): every call says whether it holds tool calls
  or results while its request defined no tools (`segments.tools_absent`,
  from the stored tools and the part types its refs point at).
- `m004_malformed_tool_calls` (v3 -> v4): calls get `malformed_tool_calls`,
  which serve mode records from then on; for calls recorded before it the
  count was never kept, so it is null.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from .records import MessageMemo
from .segments import NO_PLACE, TOOL_PARTS, SessionThreads, tools_absent
from .sessions import PLACE_COLUMNS
from .files import (SchemaVersionError, atomic_write_table, conform, data_files, live_writers, maintenance_lock,
                    read_manifest, write_manifest)
from .tables import SCHEMA_VERSION, TABLES


@dataclass(frozen=True)
class Migration:
    name: str
    from_version: int  # upgrades a dataset at this version to the next
    apply: Callable[[Path], None]


def upgrade(root: Path) -> dict:
    """Run the pending migrations in order; return the upgraded manifest."""
    lock = maintenance_lock(root)
    try:
        manifest = read_manifest(root)  # another process may have upgraded it while we waited
        if manifest["schema_version"] >= SCHEMA_VERSION:
            return manifest
        live = live_writers(root)
        if live:
            raise SchemaVersionError(
                f"{root}: the dataset is schema version {manifest['schema_version']} and needs an upgrade to "
                f"{SCHEMA_VERSION}, but writer {live[0]} is still recording into it; stop it and retry")
        for migration in MIGRATIONS:
            if migration.from_version >= manifest["schema_version"]:
                migration.apply(root)
                manifest["schema_version"] = migration.from_version + 1
                manifest["migrations"] = [*manifest.get("migrations", []), migration.name]
                write_manifest(root, manifest)
        return manifest
    finally:
        lock.release()


# ------------------------------------------------------------------ v1 -> v2

# The harness names v1's User-Agent table gave SDKs and runtimes rather than harnesses.
_V1_GENERIC = frozenset({"anthropic-python", "anthropic-js", "openai-python", "openai-js"})
# What placing a v1 call reads (v1 files have no placement yet).
_PLACE_COLUMNS = tuple(c for c in PLACE_COLUMNS if c not in NO_PLACE)


def _v1_rank(harness: str | None) -> int:
    return 0 if harness in (None, "unknown") else 1 if harness in _V1_GENERIC else 2


def _placements(root: Path) -> dict[str, dict[str, Any]]:
    """call id -> segment columns, each session's calls placed in recording order."""
    con = duckdb.connect()
    calls, parts = data_files(root, "calls"), data_files(root, "messages")
    if not calls:
        return {}
    columns = ", ".join(_PLACE_COLUMNS)
    rows = con.sql(f"SELECT {columns} FROM read_parquet({calls!r}, union_by_name=true) "
                   "ORDER BY session_id, t_start, seq, call_id").to_arrow_table().to_pylist()
    by_session: dict[str, dict[str, str]] = {}
    if parts:
        for sid, digest, part in con.sql(f"SELECT DISTINCT session_id, part_hash, part FROM "
                                         f"read_parquet({parts!r}, union_by_name=true)").fetchall():
            by_session.setdefault(sid, {})[digest] = part
    out: dict[str, dict[str, Any]] = {}
    threads, memo, current = SessionThreads(), MessageMemo(), None
    for row in rows:
        if row["session_id"] != current:
            threads, memo, current = SessionThreads(), MessageMemo(), row["session_id"]
        parts_of = by_session.get(current, {})
        placement = threads.place(row, lambda form: memo.message(form, parts_of))
        out[row["call_id"]] = placement.columns() if placement else NO_PLACE
    return out


def _m002(root: Path) -> None:
    placed = _placements(root)
    for path in map(Path, data_files(root, "calls")):
        table = conform(pq.read_table(path), TABLES["calls"])
        ids = table.column("call_id").to_pylist()
        for name in NO_PLACE:
            values = [placed.get(i, NO_PLACE)[name] for i in ids]
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pa.array(values, TABLES["calls"].field(name).type))
        atomic_write_table(path, table, "calls", 2)
    for path in map(Path, data_files(root, "sessions")):
        table = conform(pq.read_table(path), TABLES["sessions"])
        ranks = pa.array([_v1_rank(h) for h in table.column("harness").to_pylist()], pa.int32())
        table = table.set_column(table.schema.get_field_index("harness_rank"), "harness_rank", ranks)
        atomic_write_table(path, table, "sessions", 2)


# ------------------------------------------------------------------ v2 -> v3


def _tool_parts(root: Path) -> dict[tuple[str, str], str]:
    """(session id, part hash) -> part type of every stored tool call or tool result part."""
    parts = data_files(root, "messages")
    if not parts:
        return {}
    kinds = ", ".join(f"'{t}'" for t in sorted(TOOL_PARTS))
    rows = duckdb.connect().sql(f"SELECT DISTINCT session_id, part_hash, part_type FROM read_parquet({parts!r}, "
                                f"union_by_name=true) WHERE part_type IN ({kinds})").fetchall()
    return {(sid, digest): kind for sid, digest, kind in rows}


def _m003(root: Path) -> None:
    tool_parts = _tool_parts(root)
    for path in map(Path, data_files(root, "calls")):
        table = conform(pq.read_table(path), TABLES["calls"])
        columns = table.select(["session_id", "tools", "input_refs", "output_refs"]).to_pylist()
        flags = [None if row["input_refs"] is None else tools_absent(
            row["tools"], (tool_parts.get((row["session_id"], h), "") for h in
                           [*row["input_refs"], *(row["output_refs"] or [])])) for row in columns]
        table = table.set_column(table.schema.get_field_index("tools_absent"), "tools_absent",
                                 pa.array(flags, pa.bool_()))
        atomic_write_table(path, table, "calls", 3)


def _m004(root: Path) -> None:
    for path in map(Path, data_files(root, "calls")):
        atomic_write_table(path, conform(pq.read_table(path), TABLES["calls"]), "calls", 4)


MIGRATIONS: tuple[Migration, ...] = (
    Migration("m002_segments_and_harness_rank", 1, _m002),
    Migration("m003_tools_absent", 2, _m003),
    Migration("m004_malformed_tool_calls", 3, _m004),
)
