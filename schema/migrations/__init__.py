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

Migrations are frozen: each module holds the logic it applies as of its version (a copy, not an import of the
live segmenter), so upgrading an old dataset gives the same result whatever later changes; a golden-file test
(`tests/test_migration_golden.py`) holds them to it.

- `m002_segments_and_harness_rank` (v1 -> v2): every trainable call gets its
  place in its session's threads, computed from the stored calls and parts in
  recording order, and every `sessions` row the rank of the evidence that
  named its harness.
- `m003_tools_absent` (v2 -> v3): every call says whether it holds tool calls
  or results while its request defined no tools.
- `m004_malformed_tool_calls` (v3 -> v4): calls get `malformed_tool_calls`,
  which serve mode records from then on; for calls recorded before it the
  count was never kept, so it is null.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ..files import SchemaVersionError, read_manifest, write_manifest
from ..storage import locate
from ..tables import SCHEMA_VERSION
from . import m002_segments_and_harness_rank, m003_tools_absent, m004_malformed_tool_calls


@dataclass(frozen=True)
class Migration:
    name: str
    from_version: int  # upgrades a dataset at this version to the next
    apply: Callable[[str], None]


MIGRATIONS: tuple[Migration, ...] = (
    Migration("m002_segments_and_harness_rank", 1, m002_segments_and_harness_rank.apply),
    Migration("m003_tools_absent", 2, m003_tools_absent.apply),
    Migration("m004_malformed_tool_calls", 3, m004_malformed_tool_calls.apply),
)


def upgrade(root: str | os.PathLike) -> dict:
    """Run the pending migrations in order; return the upgraded manifest."""
    storage, where = locate(root)
    coordinator = storage.coordinator(where)
    lease = coordinator.maintenance()
    try:
        manifest = read_manifest(root)  # another process may have upgraded it while we waited
        if manifest["schema_version"] >= SCHEMA_VERSION:
            return manifest
        live = coordinator.live_writers()
        if live:
            raise SchemaVersionError(
                f"{root}: the dataset is schema version {manifest['schema_version']} and needs an upgrade to "
                f"{SCHEMA_VERSION}, but writer {live[0]} is still recording into it; stop it and retry")
        for migration in MIGRATIONS:
            if migration.from_version >= manifest["schema_version"]:
                migration.apply(where)
                manifest["schema_version"] = migration.from_version + 1
                manifest["migrations"] = [*manifest.get("migrations", []), migration.name]
                write_manifest(root, manifest)
        return manifest
    finally:
        lease.release()
