"""Crash recovery: what writers that died left in flight becomes incomplete call rows, once.

A live writer snapshots its unfinished calls to `_inflight/<writer>.parquet` on every flush. A writer starting
up takes over the lease of each writer whose snapshot is there and whose lease is free (it died: `coordination.py`),
writes the snapshot's calls not already written as `calls/<writer>-recovered.parquet`, and removes the snapshot.
"""

from __future__ import annotations

import os

import pyarrow as pa

from .conform import open_parquet, read_files
from .files import atomic_write_table, data_files
from .storage import locate


def recover(root: str | os.PathLike) -> int:
    """Turn dead writers' in-flight snapshots into incomplete call rows; return how many."""
    storage, where = locate(root)
    coordinator = storage.coordinator(where)
    recovered = 0
    inflight = f"{where}/_inflight"
    for name in sorted(storage.names(inflight, ".parquet")):
        snap, writer_id = f"{inflight}/{name}", name.removesuffix(".parquet")
        lease = coordinator.take_over(writer_id)
        if lease is None:
            continue  # that writer is alive
        try:
            if not storage.exists(snap):
                continue
            table = read_files("calls", [snap])
            written = _call_ids(where, prefix=f"{writer_id}-")
            keep = [cid not in written for cid in table.column("call_id").to_pylist()]
            table = table.filter(pa.array(keep, pa.bool_()))
            if table.num_rows:
                n = table.num_rows
                errors = [e or "recorder stopped before the call finished"
                          for e in table.column("error").to_pylist()]
                table = table.set_column(table.schema.get_field_index("error"), "error", pa.array(errors, pa.string()))
                table = table.set_column(table.schema.get_field_index("complete"), "complete",
                                         pa.array([False] * n, pa.bool_()))
                atomic_write_table(f"{where}/calls/{writer_id}-recovered.parquet", table, "calls")
                recovered += n
            storage.delete(snap)
        finally:
            lease.release()
    return recovered


def _call_ids(root: str, prefix: str = "") -> set[str]:
    ids: set[str] = set()
    for path in data_files(root, "calls"):
        if os.path.basename(path).startswith(prefix):
            with open_parquet(path) as parquet:
                ids.update(parquet.read(["call_id"]).column("call_id").to_pylist())
    return ids
