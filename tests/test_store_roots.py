"""Dataset roots are parsed in one place (`schema.storage.locate`): a path or a `file://` URI is a local folder,
`s3://` is S3 (tests/test_store_s3.py), and any other URI scheme is one line of refusal in every verb that takes a
root, never a local folder named `gs:`.
The store's parts meet over one seam: the local coordinator's leases and publishing are what they always were."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from forgerl.errors import UserError
from forgerl.schema import coordination, recovery, storage, store
from forgerl.schema.writer import DatasetWriter

from test_store import record_session
from verb_checks import assert_refused, verb

REFUSED = "s3://bkt/data: s3:// roots are not supported"


@pytest.mark.parametrize("root", ["gs://bkt/data", Path("gs://bkt/data"), "GS://bkt/data", "az://bkt/data"])
def test_a_uri_scheme_not_supported_is_refused(root):
    with pytest.raises(UserError, match=r"^\w+://bkt/data: \w+:// roots are not supported"):
        storage.locate(root)


def test_paths_and_file_uris_are_local(tmp_path):
    assert storage.locate(tmp_path)[1] == str(tmp_path)
    assert storage.locate("relative/s3:x")[1] == "relative/s3:x"  # a colon later in a path is no scheme
    assert storage.locate(f"file://{tmp_path}")[1] == str(tmp_path)
    assert storage.locate(Path(f"file://{tmp_path}"))[1] == str(tmp_path)
    with DatasetWriter(f"file://{tmp_path}/data") as w:
        record_session(w, "s1", 2)
    assert store.read_table(f"file://{tmp_path}/data", "calls").num_rows == 2
    assert store.read_table(tmp_path / "data", "calls").num_rows == 2


def test_the_generic_pyarrow_storage_does_what_local_disk_does(tmp_path):
    """The seam's pyarrow implementation (what a non-local filesystem gets) and local disk's own listing agree on a
    real dataset folder: the same names (hidden temporaries left out), reads, sizes and deletes."""
    with DatasetWriter(tmp_path, flush_interval=None) as w:
        record_session(w, "s1", 3)
    (tmp_path / "calls" / ".half-written.parquet.tmp").write_bytes(b"x")
    local, generic = storage.locate(tmp_path)[0], storage.Storage(pafs.LocalFileSystem())
    for folder, suffix in ((f"{tmp_path}/calls", ".parquet"), (f"{tmp_path}/_compaction", ".json"),
                           (f"{tmp_path}/missing", ".parquet")):
        assert sorted(generic.names(folder, suffix)) == sorted(local.names(folder, suffix))
    [name] = generic.names(f"{tmp_path}/calls", ".parquet")
    path = f"{tmp_path}/calls/{name}"
    assert generic.read_bytes(path) == (tmp_path / "calls" / name).read_bytes()
    assert generic.size(path) == local.size(path) > 0 and generic.is_folder(str(tmp_path))
    generic.delete(path)
    generic.delete(path)  # already gone: fine
    assert not local.exists(path)


def test_writer_leases_and_recovery_through_the_coordinator(tmp_path):
    """A live writer's lease is seen and not taken over; once it is released its leftovers are recovered."""
    w = DatasetWriter(tmp_path, flush_interval=None)
    local = storage.locate(tmp_path)[0].coordinator(str(tmp_path))
    assert isinstance(local, coordination.LocalCoordinator)
    assert local.live_writers() == [w.writer_id]
    assert local.take_over(w.writer_id) is None
    with pytest.raises(BlockingIOError):
        local.hold_writer(w.writer_id)
    assert local.publish_new(str(tmp_path / "once"), b"a") and not local.publish_new(str(tmp_path / "once"), b"b")
    assert (tmp_path / "once").read_bytes() == b"a"
    w.close()
    assert local.live_writers() == [] and not (tmp_path / "_writers" / f"{w.writer_id}.lock").exists()
    assert recovery.recover(tmp_path) == 0


@pytest.mark.slow
def test_every_verb_refuses_a_root_it_cannot_take_with_one_line(tmp_path):
    """A scheme no verb takes (gs://) is refused by every verb; s3:// by forge-run, which reads its dataset as local
    files still, before touching the store. tests/test_store_s3.py runs the others on S3."""
    (tmp_path / "hello.toml").write_text('id = "hello"\nprompt = "Say hi."\n[grading]\ncode = """\n'
                                         'def grade(transcript, workspace_path):\n    return {"ok": 1.0}\n"""\n')
    gs = "gs://bkt/data: gs:// roots are not supported"
    runs = [(gs, ("forge-record", "ls", "gs://bkt/data")), (gs, ("forge-record", "show", "gs://bkt/data", "x")),
            (gs, ("forge-record", "compact", "gs://bkt/data")), (gs, ("forge-record", "delete", "gs://bkt/data", "x")),
            (gs, ("forge-record", "run", "--out", "gs://bkt/data", "--", "true")),
            (gs, ("forge-analyze", "sql", "gs://bkt/data", "SELECT 1")),
            (gs, ("forge-convert", "gs://bkt/data", "--to", "atif", "--out", "o")),
            (REFUSED, ("forge-run", "hello.toml", "--harness", "codex", "--upstream", "http://127.0.0.1:9", "--out",
                       "s3://bkt/data"))]
    for message, args in runs:
        assert_refused(verb(*args, cwd=tmp_path), message)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hello.toml"], args
