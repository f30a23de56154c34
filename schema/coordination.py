"""How processes sharing a dataset root agree: writer leases, the maintenance lock, and publishing a file whole.

Everything the store does that is more than reading or deleting a file (`storage.py`) goes through a
`Coordinator`, so a store on object storage differs from local disk here and nowhere else:

- a writer holds a lease for as long as it lives; recovery takes over the lease of a writer that died and
  turns what it left in flight into rows; an upgrade refuses while any writer lives;
- compaction, deletion and upgrades hold the one maintenance lease, waiting for it;
- a file appears whole or not at all (`publish`), and a file that must be created once (the manifest) is
  created only if absent (`publish_new`).

On local disk (`LocalCoordinator`) a lease is an `flock` on `_writers/<id>.lock`, which the kernel drops when the
process dies, and publishing is write, fsync, rename, fsync of the folder; create-if-absent is a hard link.

On S3 (`ObjectCoordinator`) a PUT is atomic, so `publish` is one PUT of the file built in memory (pyarrow's output
streams cannot abort, so a write that fails half-way uploads nothing). A writer's lease is an object
`_writers/<id>.lease` holding an expiry, rewritten by a thread of its holder every third of `LEASE_SECONDS`
(`FORGERL_S3_LEASE_SECONDS` sets it); a lease past its expiry (or gone) is dead. pyarrow's S3 client cannot send `If-None-Match` / `If-Match`, and boto3 is no
dependency of ours, so nothing here is a conditional write, and the design needs none for writing: every object a
writer creates is named by its own writer id, and recovery is idempotent (the recovered file's name is fixed by the
dead writer's id and its rows are the snapshot's calls not yet written, so two recoverers at once write the same
file or nothing). `publish_new` is a check then a PUT: two first writers at once both write a manifest, the same
but for `created_at`. Compaction, deletion and upgrades need a real lock (two compactors would merge the same files
twice), which needs conditional writes: on S3 they are refused with one line until they have one.
Clocks of the machines sharing a root must agree to well within `LEASE_SECONDS`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from forgerl.errors import UserError

_MAINTENANCE = "maintenance"
# How long an object-store writer lease lives unrenewed (renewed every third of it): what a writer that stalls
# longer (a paused pod) risks is its unfinished calls recovered as incomplete while it lives.
LEASE_SECONDS = 30.0
LEASE_ENV = "FORGERL_S3_LEASE_SECONDS"


class Lease(Protocol):
    def release(self) -> None: ...


class Coordinator(Protocol):
    """What writers, recovery, upgrades, compaction and deletion agree through, for one dataset root."""

    def hold_writer(self, writer_id: str) -> Lease:
        """The writer's lease, held until released or the writer dies; BlockingIOError if another holds it."""

    def take_over(self, writer_id: str) -> Lease | None:
        """A dead writer's lease, to recover what it left (released when done, which ends it); None while it lives."""

    def live_writers(self) -> list[str]:
        """Ids of writers whose lease is held."""

    def maintenance(self) -> Lease:
        """The dataset's one maintenance lease (compaction, deletion, upgrades), waiting while another holds it."""

    def publish(self, path: str, write: Callable[[BinaryIO], None]) -> None:
        """Write a file by `write(f)` so that readers see it whole or not at all, replacing any file there."""

    def publish_new(self, path: str, data: bytes) -> bool:
        """Create the file with `data` only if absent (against a concurrent creator); whether this call made it."""


class Flock:
    """An exclusive flock on a file; held until released or the process dies."""

    def __init__(self, path: Path, blocking: bool = True):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(self.fd)
            raise

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class _Ending(Flock):
    """A writer's lock: its file goes with it."""

    def release(self) -> None:
        super().release()
        self.path.unlink(missing_ok=True)


class LocalCoordinator:
    """Coordination on one machine's disk: flock and atomic rename."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.locks = Path(root) / "_writers"

    def hold_writer(self, writer_id: str) -> Lease:
        return _Ending(self.locks / f"{writer_id}.lock", blocking=False)

    def take_over(self, writer_id: str) -> Lease | None:
        try:
            return _Ending(self.locks / f"{writer_id}.lock", blocking=False)
        except BlockingIOError:
            return None

    def live_writers(self) -> list[str]:
        live = []
        for path in self.locks.glob("*.lock"):
            if path.stem == _MAINTENANCE:
                continue
            try:
                Flock(path, blocking=False).release()
            except BlockingIOError:
                live.append(path.stem)
            except FileNotFoundError:
                pass
        return live

    def maintenance(self) -> Lease:
        self.locks.mkdir(exist_ok=True)  # a copied dataset may lack empty folders
        return Flock(self.locks / f"{_MAINTENANCE}.lock")

    def publish(self, path: str, write: Callable[[BinaryIO], None]) -> None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        self.sync_folder(target.parent)

    def publish_new(self, path: str, data: bytes) -> bool:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        try:
            os.link(tmp, target)  # create-if-absent, atomic against a concurrent creator
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    @staticmethod
    def sync_folder(folder: str | os.PathLike) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def object_key(path: str) -> str:
    """The `bucket/key` of an `s3://bucket/key` URI (or `s3:/bucket/key`, once pathlib folded its slashes)."""
    return re.sub(r"^[A-Za-z][A-Za-z0-9+.-]+:/+", "", path).rstrip("/")


class _Renewed:
    """An object-store writer lease: its expiry rewritten by a daemon thread until released, then deleted."""

    def __init__(self, coordinator: ObjectCoordinator, key: str) -> None:
        self.coordinator, self.key = coordinator, key
        self._stop = threading.Event()
        coordinator.put_expiry(key)
        self._thread = threading.Thread(target=self._renew, name=f"forgerl-lease-{key.rsplit('/', 1)[-1]}",
                                        daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.coordinator.lease_s / 3):
            try:
                self.coordinator.put_expiry(self.key)
            except OSError as e:  # keep trying: the store may come back before the lease runs out
                print(f"forgerl: renewing lease {self.key} failed: {e}", flush=True)

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        self.coordinator.delete(self.key)


class _Ended:
    """A dead writer's lease taken over: released by deleting what is left of it."""

    def __init__(self, coordinator: ObjectCoordinator, key: str) -> None:
        self.coordinator, self.key = coordinator, key

    def release(self) -> None:
        self.coordinator.delete(self.key)


class ObjectCoordinator:
    """Coordination on an object store (S3) through a pyarrow filesystem: atomic PUTs and expiring leases."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs, self.root = fs, root  # root: the dataset's s3:// URI
        self.lease_s = float(os.environ.get(LEASE_ENV) or LEASE_SECONDS)
        self.leases = f"{object_key(root)}/_writers"

    def put_expiry(self, key: str) -> None:
        with self.fs.open_output_stream(key) as f:
            f.write(json.dumps({"expires": time.time() + self.lease_s}).encode())

    def delete(self, key: str) -> None:
        try:
            self.fs.delete_file(key)
        except FileNotFoundError:
            pass

    def _alive(self, key: str) -> bool:
        try:
            with self.fs.open_input_stream(key) as f:
                return json.loads(f.read())["expires"] > time.time()
        except FileNotFoundError:
            return False

    def hold_writer(self, writer_id: str) -> Lease:
        key = f"{self.leases}/{writer_id}.lease"
        if self._alive(key):
            raise BlockingIOError(f"writer {writer_id} is alive")
        return _Renewed(self, key)

    def take_over(self, writer_id: str) -> Lease | None:
        key = f"{self.leases}/{writer_id}.lease"
        return None if self._alive(key) else _Ended(self, key)

    def live_writers(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.leases, allow_not_found=True))
        return [i.base_name.removesuffix(".lease") for i in infos
                if i.base_name.endswith(".lease") and self._alive(i.path)]

    def maintenance(self) -> Lease:
        raise UserError(f"{self.root}: s3:// roots are not supported for compaction, deletion or upgrades yet "
                        "(they need a lock by conditional writes); run them on a local copy")

    def publish(self, path: str, write: Callable[[BinaryIO], None]) -> None:
        buffer = pa.BufferOutputStream()
        write(buffer)
        with self.fs.open_output_stream(object_key(path)) as f:
            f.write(buffer.getvalue())

    def publish_new(self, path: str, data: bytes) -> bool:
        key = object_key(path)
        if self.fs.get_file_info(key).type != pafs.FileType.NotFound:
            return False
        with self.fs.open_output_stream(key) as f:
            f.write(data)
        return True
