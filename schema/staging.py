"""A local copy of a dataset on object storage, for code that reads its files itself rather than through the seam.

`forge-convert` reads table files with DuckDB's `read_parquet` (file names and row numbers included), and DuckDB
cannot read S3 here (its `httpfs` extension is downloaded on first use). So an `s3://` input is staged: its manifest
and the consistent file set of each table (`files.data_files`, never a compacted file and its sources both) are
copied into a temporary folder under `TMPDIR`, which is removed when the work is done. A local root is used in place.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs

from .files import MANIFEST, data_files
from .storage import LocalStorage, locate
from .store import open_dataset
from .tables import TABLES


@contextmanager
def local_copy(root: str | os.PathLike) -> Iterator[str | os.PathLike]:
    """`root` itself if it is local, else a temporary local copy of what readers of it see, removed afterwards."""
    storage, where = locate(root)
    if isinstance(storage, LocalStorage):
        yield root
        return
    open_dataset(root)
    with tempfile.TemporaryDirectory(prefix="forgerl-stage-") as tmp:
        local = Path(tmp) / "data"
        local.mkdir()
        (local / MANIFEST).write_bytes(storage.read_bytes(f"{where}/{MANIFEST}"))
        for table in TABLES:
            (local / table).mkdir()
            for path in data_files(where, table):
                pafs.copy_files(storage.native(path), str(local / table / os.path.basename(path)),
                                source_filesystem=storage.fs, destination_filesystem=pafs.LocalFileSystem())
        yield str(local)
