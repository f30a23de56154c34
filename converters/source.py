"""Reading a dataset session by session, in bounded memory.

Every file is checked up front (footer readable, schema version known), so
bad input fails before anything is written. Calls and message parts are then
streamed out of DuckDB ordered by session (DuckDB sorts out of core under a
memory limit) and merged, so only one session's calls and parts are held at a
time whatever the dataset size.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from forgerl.schema import duck
from forgerl.schema.messages import Message
from forgerl.schema.migrations import SchemaVersionError
from forgerl.schema.records import call_messages
from forgerl.schema.store import DatasetError, data_files, file_version, read_manifest
from forgerl.schema.tables import SCHEMA_VERSION, TABLES

CALL_COLUMNS = ("call_id", "session_id", "seq", "api", "status", "error", "complete", "t_start",
                "model_requested", "model_returned", "stop_reason", "input_tokens", "output_tokens",
                "cache_read_tokens", "tools", "request_params", "input_refs", "input_msg", "input_roles",
                "input_extra", "output_refs", "output_msg", "output_roles", "output_extra", "prompt_token_ids",
                "completion_token_ids", "completion_logprobs", "policy_version")
_BATCH = 2048


@dataclass
class Call:
    """One recorded model call with its messages rebuilt."""

    row: dict[str, Any]
    input: list[Message]
    output: list[Message]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return json.loads(self.row["tools"]) if self.row.get("tools") else []

    @property
    def ok(self) -> bool:
        status = self.row.get("status")
        return bool(self.row.get("complete")) and not self.row.get("error") and (status is None or status < 400)


@dataclass
class Session:
    session_id: str
    harness: str | None
    calls: list[Call]
    outcome: dict[str, Any] | None = None
    blobs: dict[str, str | None] = field(default_factory=dict)  # blob hash -> media type

    @property
    def reward(self) -> float | None:
        return self.outcome.get("reward") if self.outcome else None

    @property
    def started(self) -> datetime | None:
        return self.calls[0].row["t_start"] if self.calls else None


def check_dataset(root: Path) -> dict:
    """The manifest, after checking every data file opens and has a known schema version."""
    manifest = read_manifest(root)
    for table in TABLES:
        for path in data_files(root, table):
            try:
                version = file_version(Path(path))
            except (OSError, pa.ArrowException) as e:
                raise DatasetError(f"{path}: unreadable parquet: {e}") from None
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(f"{path}: schema version {version} is newer than this forgerl "
                                         f"({SCHEMA_VERSION}); upgrade forgerl")
    if not data_files(root, "calls"):
        raise DatasetError(f"{root}: the dataset has no calls")
    return manifest


def _connect(root: Path) -> duckdb.DuckDBPyConnection:
    return duck.connect(root, config={"memory_limit": os.environ.get("FORGE_CONVERT_MEMORY", "512MB"),
                                      "preserve_insertion_order": False})


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> Iterator[dict[str, Any]]:
    reader = con.sql(sql).to_arrow_reader(_BATCH)
    for batch in reader:
        yield from batch.to_pylist()


def _grouped(rows: Iterator[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    current, group = None, []
    for row in rows:
        if row["session_id"] != current and group:
            yield current, group
            group = []
        current = row["session_id"]
        group.append(row)
    if group:
        yield current, group


def iter_sessions(root: Path, *, harnesses: set[str] | None = None) -> Iterator[Session]:
    """Sessions in session-id order, each with its calls in recording order and its outcome."""
    try:
        yield from _iter_sessions(root, harnesses)
    except duckdb.Error as e:
        raise DatasetError(f"{root}: cannot read the dataset: {str(e).splitlines()[0]}") from None


def _iter_sessions(root: Path, harnesses: set[str] | None) -> Iterator[Session]:
    con = _connect(root)
    meta = con.execute("SELECT session_id, max(harness) FILTER (WHERE harness IS NOT NULL AND harness <> 'unknown') "
                       "FROM sessions GROUP BY session_id").fetchall()
    harness_of = dict(meta)
    outcomes = {r["session_id"]: r for r in con.sql(
        "SELECT * FROM outcomes QUALIFY row_number() OVER (PARTITION BY session_id "
        "ORDER BY attempt DESC NULLS LAST, t_end DESC NULLS LAST) = 1").to_arrow_table().to_pylist()}
    blob_media = con.execute("SELECT session_id, blob_hash, any_value(media_type) FROM blobs "
                             "GROUP BY session_id, blob_hash ORDER BY session_id").fetchall()
    blobs: dict[str, dict[str, str | None]] = {}
    for sid, digest, media in blob_media:
        blobs.setdefault(sid, {})[digest] = media
    # Two cursors, both ordered by session: merge them one session at a time.
    calls = _grouped(_rows(con, f"SELECT {', '.join(CALL_COLUMNS)} FROM calls "
                                "ORDER BY session_id, t_start, seq, call_id"))
    parts_con = con.cursor()
    parts = _grouped(_rows(parts_con, "SELECT DISTINCT session_id, part_hash, part FROM messages ORDER BY session_id"))
    pending_parts: tuple[str, list[dict]] | None = next(parts, None)
    for session_id, rows in calls:
        while pending_parts is not None and pending_parts[0] < session_id:
            pending_parts = next(parts, None)
        by_hash: dict[str, str] = {}
        if pending_parts is not None and pending_parts[0] == session_id:
            by_hash = {r["part_hash"]: r["part"] for r in pending_parts[1]}
        harness = harness_of.get(session_id)
        if harnesses and (harness or "unknown") not in harnesses:
            continue
        built = []
        for row in rows:
            try:
                built.append(Call(row, call_messages(row, by_hash, "input"), call_messages(row, by_hash, "output")))
            except KeyError as e:
                raise DatasetError(f"{root}: call {row['call_id']} references a missing part {e}") from None
        yield Session(session_id, harness, built, outcomes.get(session_id), blobs.get(session_id, {}))


def blob_bytes(root: Path, hashes: list[str]) -> dict[str, bytes]:
    """The bytes of some blobs (images for verl-sft rows), read by hash."""
    if not hashes:
        return {}
    files = data_files(root, "blobs")
    if not files:
        return {}
    table = pq.read_table(files, columns=["blob_hash", "data"],
                          filters=[("blob_hash", "in", list(set(hashes)))])
    return dict(zip(table.column("blob_hash").to_pylist(), table.column("data").to_pylist()))
