"""One rollout's calls as the veRL agent loop reads them, as the dataset grows to 100k calls.

    .venv/bin/python bench/session_read.py            # 1k, 10k, 100k calls
    .venv/bin/python bench/session_read.py --sizes 1000 10000

The dataset grows in place, the way a recorder fills it: files of 500 calls
(one flush under load), 10 calls a session, each call with 400 prompt and 100
completion token ids and logprobs. At each size the bench reads one session
(its 10 calls, the agent loop's columns) three ways:

    session_rows, warm   `schema.sessions.session_rows` with its file index up to date: what the agent
                         loop pays per rollout, since its process learns each new file once
    session_rows, cold   the same with an empty index: learning every file's sessions first (once per process)
    whole table          the old read: every file's columns, then a filter on session_id

Times are the median of 5 reads of different sessions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from forgerl import printer
from forgerl.schema import sessions
from forgerl.schema.files import atomic_write_table
from forgerl.schema.store import init_root, read_table
from forgerl.schema.tables import TABLES

COLUMNS = ["call_id", "session_id", "seq", "t_start", "prompt_token_ids", "completion_token_ids",
           "completion_logprobs"]
FILE_CALLS, SESSION_CALLS = 500, 10


def write_calls(root: Path, start: int, stop: int) -> None:
    """Calls start..stop as files of FILE_CALLS rows, named like a writer's."""
    now = datetime.now(timezone.utc)
    for first in range(start, stop, FILE_CALLS):
        rows = [{"call_id": f"c{i}", "session_id": f"s{i // SESSION_CALLS}", "seq": i % SESSION_CALLS, "t_start": now,
                 "api": "chat", "prompt_token_ids": list(range(i % 7, i % 7 + 400)),
                 "completion_token_ids": list(range(100)), "completion_logprobs": [-0.5] * 100}
                for i in range(first, min(first + FILE_CALLS, stop))]
        table = pa.Table.from_pylist(rows, schema=TABLES["calls"])
        atomic_write_table(root / "calls" / f"bench-{first // FILE_CALLS:08d}.parquet", table, "calls")


def median_ms(read, sessions_: list[str], before=lambda: None) -> float:
    times = []
    for session in sessions_:
        before()
        start = time.perf_counter()
        rows = read(session)
        times.append(1000 * (time.perf_counter() - start))
        assert rows.num_rows == SESSION_CALLS, (session, rows.num_rows)
    return statistics.median(times)


def whole_table(root: Path, session: str) -> pa.Table:
    calls = read_table(root, "calls", COLUMNS)
    return calls.filter(pc.equal(calls["session_id"], session))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    args = p.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    results = []
    with tempfile.TemporaryDirectory(prefix="forgerl-bench-read-") as tmp:
        root = Path(tmp) / "data"
        init_root(root)
        written = 0
        for size in sorted(args.sizes):
            write_calls(root, written, size)
            written = size
            picks = [f"s{(size // SESSION_CALLS) * k // 5}" for k in range(5)]
            rows = lambda s: sessions.session_rows(root, "calls", s, COLUMNS)  # noqa: E731
            rows(picks[-1])  # the agent loop's process has seen every file (and pyarrow's readers are warm)
            warm = median_ms(rows, picks)
            cold = median_ms(rows, picks, before=sessions.forget)
            whole = median_ms(lambda s: whole_table(root, s), picks[:3])
            files = len(list((root / "calls").glob("*.parquet")))
            results.append((size, files, f"{warm:.1f}", f"{cold:.1f}", f"{whole:.1f}"))
    printer.show(printer.table(["calls", "files", "session_rows warm ms", "session_rows cold ms", "whole table ms"],
                               results, left=0, style=printer.MARKDOWN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
