"""The store's one filesystem seam, and the one place a dataset root is parsed.

Every byte of a dataset's files is listed, read and deleted through a `Storage`: a `pyarrow.fs` filesystem, which
local disk and S3 (`pyarrow.fs.S3FileSystem`) both implement. pyarrow over fsspec because pyarrow already reads and
writes every Parquet file of the store and is in the core lock with S3 built in: its filesystems hand native files
straight to the Parquet reader (`ParquetFile(path, filesystem=storage.fs)`), where fsspec would add a second I/O stack (and s3fs, aiobotocore) for the same bytes.
Writing a file whole-or-nothing and the locks are coordination, not storage (`coordination.py`).

Local disk lists a folder with `os.listdir`: pyarrow's selector stats every entry, 5 times the time on a table of
3,000 files (1.3 against 6.7 ms), which a runner pays three times a rollout.

Roots: a path or a `file://` URI is a local folder; `s3://bucket/prefix` is that prefix on S3 (`S3Storage`), with
credentials from the standard AWS chain (environment, `~/.aws`, web identity) as pyarrow's S3 client resolves them,
and the endpoint from `AWS_ENDPOINT_URL` for stores other than AWS. Nothing here reads or keeps a credential. Any
other URI scheme (`gs://`, ...) is refused with one line, not taken as a local folder named `gs:`. Code that reads a
root's files outside the seam (DuckDB's own Parquet reader, which cannot read S3 here) reads S3 through pyarrow
(`duck.py`), works on a staged local copy (`staging.py`), or asks `local_only` first, which refuses an `s3://` root
with one line.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

import pyarrow.fs as pafs

from forgerl.errors import UserError

from .coordination import Coordinator, LocalCoordinator, ObjectCoordinator, object_key

# "s3://bucket/p", or "s3:/bucket/p" once pathlib has folded the slashes; two letters at least, so no drive letter.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


class Storage:
    """Files of one filesystem by path, through a pyarrow filesystem."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    def native(self, path: str) -> str:
        """The path `fs` takes for a path of this storage (the store passes roots and files as `locate` gave them)."""
        return path

    def names(self, folder: str, suffix: str) -> list[str]:
        """The names in `folder` ending in `suffix`, hidden (temporary) ones left out; none if it is missing."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.native(folder), allow_not_found=True))
        return [i.base_name for i in infos if i.base_name.endswith(suffix) and not i.base_name.startswith(".")]

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(self.native(path)) as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(self.native(path)).type != pafs.FileType.NotFound

    def is_folder(self, path: str) -> bool:
        return self.fs.get_file_info(self.native(path)).type == pafs.FileType.Directory

    def size(self, path: str) -> int:
        return self.fs.get_file_info(self.native(path)).size

    def make_folder(self, path: str) -> None:
        self.fs.create_dir(self.native(path), recursive=True)

    def delete(self, path: str) -> None:
        """Remove a file; one already gone is fine."""
        try:
            self.fs.delete_file(self.native(path))
        except FileNotFoundError:
            pass

    def sync_folder(self, folder: str) -> None:
        """Make the deletions in `folder` durable (nothing to do where a delete is durable when it returns)."""

    def coordinator(self, root: str) -> Coordinator:
        raise NotImplementedError(f"{type(self).__name__} has no coordination")


class LocalStorage(Storage):
    """Local disk: pyarrow's local filesystem, with the listing and durability local disk needs."""

    def __init__(self) -> None:
        super().__init__(pafs.LocalFileSystem())

    def names(self, folder: str, suffix: str) -> list[str]:
        try:
            return [n for n in os.listdir(folder) if n.endswith(suffix) and not n.startswith(".")]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def sync_folder(self, folder: str) -> None:
        LocalCoordinator.sync_folder(folder)

    def coordinator(self, root: str) -> Coordinator:
        return LocalCoordinator(root)


class S3Storage(Storage):
    """S3 or any S3-compatible store: pyarrow's S3 filesystem; paths are `s3://bucket/key` URIs."""

    def __init__(self, endpoint: str | None, region: str | None) -> None:
        super().__init__(pafs.S3FileSystem(endpoint_override=endpoint, region=region))

    def native(self, path: str) -> str:
        return object_key(path)

    def make_folder(self, path: str) -> None:
        """Nothing to make (a prefix needs no folder object), but a missing bucket or refused credentials are one
        line now, at start-up, not a failed flush later."""
        bucket = self.native(path).split("/", 1)[0]
        try:
            missing = self.fs.get_file_info(bucket).type == pafs.FileType.NotFound
        except OSError as e:
            raise _one_line(path, e) from None
        if missing:
            raise UserError(f"{path}: no such bucket {bucket!r}")

    def exists(self, path: str) -> bool:
        """Whether the object is there; a store that cannot be reached or refuses us is one line (every reader asks
        this of the manifest first)."""
        try:
            return super().exists(path)
        except OSError as e:
            raise _one_line(path, e) from None

    def is_folder(self, path: str) -> bool:
        """Any prefix is a folder on an object store: whether it holds a dataset is the manifest's question."""
        return True

    def coordinator(self, root: str) -> Coordinator:
        return ObjectCoordinator(self.fs, root)


def _one_line(path: str, error: OSError) -> UserError:
    """A store that cannot be reached or refuses us, as the user's problem: its first line (pyarrow's S3 errors
    name the bucket, key and AWS error, never a credential)."""
    return UserError(f"{path}: {str(error).splitlines()[0]}")


@lru_cache(maxsize=1)
def _local() -> LocalStorage:
    return LocalStorage()


@lru_cache(maxsize=4)
def _s3(endpoint: str | None, region: str | None) -> S3Storage:
    return S3Storage(endpoint, region)


def locate(root: str | os.PathLike) -> tuple[Storage, str]:
    """The storage a root (or a file under one) lives on and its path there; UserError for a scheme not supported."""
    text = os.fspath(root)
    match = _SCHEME.match(text)
    if match and match.group(1).lower() == "file":
        return _local(), re.sub(r"^[A-Za-z]+:/+", "/", text)
    if match:
        scheme = match.group(1)
        uri = f"{scheme}://{text[len(scheme) + 1:].lstrip('/')}".rstrip("/")  # as given, before pathlib folded it
        if scheme.lower() == "s3":
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            return _s3(os.environ.get("AWS_ENDPOINT_URL") or None, region), f"s3://{object_key(uri)}"
        raise UserError(f"{uri}: {scheme}:// roots are not supported; a dataset root is a local folder "
                        "(a path or a file:// URI) or s3://bucket/prefix")
    return _local(), text


def local_only(root: str | os.PathLike, what: str) -> str:
    """The local path of a root for `what`, which reads files outside the seam; one line refusing an s3:// root."""
    storage, where = locate(root)
    if not isinstance(storage, LocalStorage):
        raise UserError(f"{where}: s3:// roots are not supported by {what} yet; copy the dataset to a local folder")
    return where


def exists(path: str | os.PathLike) -> bool:
    """Whether a file is there, on whichever storage its path is."""
    storage, where = locate(path)
    return storage.exists(where)
