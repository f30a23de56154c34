"""A set of task ids that `compare` is restricted to and the report's learning curves split by (held-out vs train).

Analysis may not import the runners (they import analysis), so it cannot ask
forge-run's loader which tasks a folder holds. A task set is therefore a
file of task ids, one a line (`#` starts a comment), or a shell-style glob
over the dataset's task ids (`--task-glob 'heldout-*'`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from forgerl.errors import UserError


@dataclass(frozen=True)
class TaskSet:
    """Task ids named by a file (`ids`) or matched by a glob (`glob`); `name` says which, for titles."""

    name: str
    ids: frozenset[str] = frozenset()
    glob: str | None = None

    @classmethod
    def from_options(cls, ids_file: str | None, glob: str | None) -> TaskSet | None:
        """The set `--task-ids FILE` or `--task-glob GLOB` names (None for neither; UserError for both, or for a
        file that is missing, unreadable or names no task)."""
        if ids_file is not None and glob is not None:
            raise UserError("give --task-ids or --task-glob, not both")
        if glob is not None:
            if not glob.strip():
                raise UserError("--task-glob: empty pattern")
            return cls(name=f"tasks matching {glob!r}", glob=glob)
        if ids_file is None:
            return None
        path = Path(ids_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--task-ids {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        ids = frozenset(line.split("#", 1)[0].strip() for line in text.splitlines()) - {""}
        if not ids:
            raise UserError(f"--task-ids {path}: no task ids in it (one a line)")
        return cls(name=f"the {len(ids)} tasks of {path}", ids=ids)

    def __contains__(self, task: object) -> bool:
        if not isinstance(task, str):
            return False
        return fnmatch.fnmatchcase(task, self.glob) if self.glob is not None else task in self.ids

    def select(self, tasks: Iterable[str]) -> list[str]:
        """The given tasks that are in the set, in their order."""
        return [t for t in tasks if t in self]

    def check(self, con: duckdb.DuckDBPyConnection) -> None:
        """UserError unless at least one of the dataset's graded tasks is in the set (a wrong file, not a subset)."""
        tasks = [r[0] for r in con.execute("SELECT DISTINCT task FROM outcome_scopes WHERE task IS NOT NULL "
                                           "ORDER BY 1").fetchall()]
        if not self.select(tasks):
            shown = ", ".join(tasks[:5]) + (", ..." if len(tasks) > 5 else "")
            raise UserError(f"none of the dataset's {len(tasks)} graded tasks is in {self.name}"
                            + (f" (its tasks: {shown})" if tasks else ""))

    def __str__(self) -> str:
        return self.name
