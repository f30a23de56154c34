"""Harness transcripts kept in SQLite (OpenClaw 2026.9, OpenCode 1.18), read back as JSON lines."""

from __future__ import annotations

import sqlite3
from pathlib import Path

MAX_TRANSCRIPT_BYTES = 1 << 20  # what an outcome keeps of a harness's own transcript


def sqlite_transcript(databases: list[Path], query: str) -> str | None:
    """The first column of `query`'s rows in each database, one line each (capped at 1 MiB), or None.

    Opened read-only: the harness has exited, and its WAL is read along with the file.
    """
    lines: list[str] = []
    size = 0
    for db in sorted(databases):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for (line,) in con.execute(query):
                lines.append(line)
                size += len(line) + 1
                if size > MAX_TRANSCRIPT_BYTES:
                    break
        finally:
            con.close()
    return "\n".join(lines)[:MAX_TRANSCRIPT_BYTES] if lines else None
