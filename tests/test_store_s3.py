"""A dataset on S3 through the store's seam, against a real S3 server (SeaweedFS, `s3_server.py`): the writer
appends, readers read, leases live and die, several writers share a prefix, and no credential lands anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from forgerl.errors import UserError
from forgerl.schema import coordination, files, recovery, storage, store
from forgerl.schema.staging import local_copy
from forgerl.schema.writer import DatasetWriter

from s3_server import ACCESS_KEY, SECRET_KEY
from test_recorder_durability import every_value_on_disk
from test_store import make_call, record_session
from verb_checks import assert_refused, verb


def objects(root: str) -> dict[str, bytes]:
    """Every object under a root, by key, with its bytes."""
    s3, where = storage.locate(root)
    infos = s3.fs.get_file_info(pafs.FileSelector(s3.native(where), recursive=True, allow_not_found=True))
    return {i.path: s3.read_bytes(f"s3://{i.path}") for i in infos if i.type == pafs.FileType.File}


def assert_no_credential(root: str) -> None:
    """Neither half of the key the store ran with is in any object's bytes, nor in any Parquet value decoded."""
    secrets = (ACCESS_KEY.encode(), SECRET_KEY.encode())
    found = [key for key, data in objects(root).items() if any(s in data for s in secrets)]
    with local_copy(root) as local:
        found += [where for where, data in every_value_on_disk(Path(local)) if any(s in data for s in secrets)]
    assert not found, found


def test_an_s3_root_is_s3_storage_with_object_coordination(s3_root):
    where_from_path = storage.locate(s3_root.replace("s3://", "s3:/"))[1]  # what pathlib leaves of the URI
    s3, where = storage.locate(s3_root)
    assert isinstance(s3, storage.S3Storage) and where == where_from_path == s3_root
    assert isinstance(s3.coordinator(where), coordination.ObjectCoordinator)
    with pytest.raises(UserError, match=r"^gs://b/x: gs:// roots are not supported"):
        storage.locate("gs://b/x")
    with pytest.raises(UserError, match=rf"^{s3_root}: s3:// roots are not supported by forge-run --out"):
        storage.local_only(s3_root, "forge-run --out")


def test_writer_appends_and_readers_read_and_no_credential_is_written(s3_root):
    with DatasetWriter(s3_root, flush_interval=None) as w:
        record_session(w, "s1", 4)
        w.flush()
        assert coordination.ObjectCoordinator(storage.locate(s3_root)[0].fs, s3_root).live_writers() == [w.writer_id]
        record_session(w, "s2", 3)
    assert store.read_table(s3_root, "calls").num_rows == 7
    assert sorted(store.read_table(s3_root, "sessions").column("session_id").to_pylist()) == ["s1", "s2"]
    assert files.read_manifest(s3_root)["format"] == files.FORMAT
    written = objects(s3_root)
    assert any(k.endswith("/forgerl.json") for k in written) and not any("/_writers/" in k for k in written)
    assert_no_credential(s3_root)


def test_a_missing_bucket_or_a_refused_key_is_one_line_at_start(s3_root, monkeypatch):
    with pytest.raises(UserError, match=r"^s3://no-such-bucket-here/data/\w+: no such bucket 'no-such-bucket-here'$"):
        DatasetWriter("s3://no-such-bucket-here/data", flush_interval=None)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(UserError, match=r"^s3://.*: .*ACCESS_DENIED") as refused:
        DatasetWriter(s3_root, flush_interval=None)
    assert "not-the-secret" not in str(refused.value) and "\n" not in str(refused.value)


def test_ls_and_show_read_an_s3_root(s3_root):
    with DatasetWriter(s3_root, flush_interval=None) as w:
        record_session(w, "s1", 3)
    listed = verb("forge-record", "ls", s3_root)
    assert listed.returncode == 0 and "s1" in listed.stdout, listed.stderr
    shown = verb("forge-record", "show", s3_root, "s1")
    assert shown.returncode == 0 and "session s1 (test): 3 calls" in shown.stdout and "reply 2" in shown.stdout
    for out in (listed, shown):
        assert SECRET_KEY not in out.stdout + out.stderr


def test_a_dead_writers_lease_expires_and_its_calls_are_recovered_once(s3_root, monkeypatch):
    """A writer killed with -9 leaves its in-flight snapshot and a lease nobody renews: while the lease lasts
    recovery leaves it alone; once it has expired, two recoveries turn the snapshot into rows exactly once."""
    monkeypatch.setenv(coordination.LEASE_ENV, "1.5")
    script = textwrap.dedent(f"""
        import time
        from forgerl.schema import writer
        from test_store import make_call
        w = writer.DatasetWriter({s3_root!r}, writer_id="doomed", flush_interval=None)
        w.track("s9-0", lambda final: make_call("s9", 0, []))
        w.add_call(make_call("s9", 1, []))
        w.flush()
        print("flushed", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parent)
    coordinator = storage.locate(s3_root)[0].coordinator(s3_root)
    try:
        assert proc.stdout.readline().strip() == "flushed"
        assert coordinator.live_writers() == ["doomed"] and recovery.recover(s3_root) == 0
    finally:
        proc.kill()
        proc.wait()
    time.sleep(2)
    assert coordinator.live_writers() == []
    assert recovery.recover(s3_root) == 1 and recovery.recover(s3_root) == 0
    calls = {c["call_id"]: c["complete"] for c in store.read_table(s3_root, "calls").to_pylist()}
    assert calls == {"s9-0": False, "s9-1": True}


def test_two_writers_at_once_on_one_prefix_lose_no_file(s3_root):
    """Two writers flushing into one prefix at the same time: every flush of each lands (names carry writer ids)."""
    writers = [DatasetWriter(s3_root, flush_interval=None) for _ in range(2)]

    def write(w: DatasetWriter, tag: str) -> None:
        for i in range(5):
            w.add_call(make_call(f"{tag}-{i}", 0, []))
            w.flush()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(write, writers, "ab"))
    for w in writers:
        w.close()
    calls = store.read_table(s3_root, "calls").column("call_id").to_pylist()
    assert sorted(calls) == sorted(f"{tag}-{i}-0" for tag in "ab" for i in range(5))
    assert len(files.data_files(s3_root, "calls")) == 10


def calls_of(root: str, session: str, n: int, timeout: float = 15.0) -> list[dict]:
    """Poll an s3:// dataset until `session` has `n` calls (recorders flush every 0.5 s)."""
    deadline = time.time() + timeout
    rows: list[dict] = []
    while time.time() < deadline:
        rows = [r for r in store.read_table(root, "calls").to_pylist() if r["session_id"] == session]
        if len(rows) >= n:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"session {session}: {len(rows)} calls on S3, expected {n}")


@pytest.mark.slow
def test_two_recorders_serve_into_one_s3_prefix_and_ls_lists_both(scripted, recorder, s3_root, s3_server):
    """`forge-record serve --out s3://...` twice on one prefix, a real SDK client through each: every call lands
    on S3, `forge-record ls` lists both sessions, and the AWS secret the recorders ran with is nowhere in it."""
    up = scripted()
    recorders = [recorder(up.url, out=s3_root) for _ in range(2)]
    for i, rec in enumerate(recorders):
        client = anthropic.Anthropic(base_url=rec.base(f"s3-{i}"), api_key="sk-ant-test")
        for turn in range(2):
            client.messages.create(model="m", max_tokens=20,
                                   messages=[{"role": "user", "content": f"hello {i} {turn}"}])
    for i in range(2):
        assert len(calls_of(s3_root, f"s3-{i}", 2)) == 2
    for rec in recorders:
        rec.stop()
    listed = verb("forge-record", "ls", s3_root)
    assert listed.returncode == 0 and "s3-0" in listed.stdout and "s3-1" in listed.stdout, listed.stderr
    assert not any("/_writers/" in k for k in objects(s3_root))  # both leases ended with their writers
    assert_no_credential(s3_root)


@pytest.mark.slow
def test_verbs_on_an_s3_root_answer_or_refuse_with_one_line(s3_root, tmp_path):
    """`forge-analyze sql` reads S3 through pyarrow datasets handed to DuckDB; compaction and deletion need a lock
    by conditional writes and refuse with one line, leaving the data as it was."""
    with DatasetWriter(s3_root, flush_interval=None) as w:
        record_session(w, "s1", 3)
    before = objects(s3_root)
    counted = verb("forge-analyze", "sql", s3_root, "SELECT count(*) AS n, count(DISTINCT session_id) AS s FROM calls")
    assert counted.returncode == 0 and counted.stdout.split()[-2:] == ["3", "1"], (counted.stdout, counted.stderr)
    refused = f"{s3_root}: s3:// roots are not supported for compaction, deletion or upgrades yet"
    assert_refused(verb("forge-record", "compact", s3_root, cwd=tmp_path), refused)
    assert_refused(verb("forge-record", "delete", s3_root, "s1", cwd=tmp_path), refused)
    assert objects(s3_root) == before and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_record_run_out_s3_records_a_client_and_writes_nothing_local(scripted, s3_root, tmp_path):
    """`forge-record run --out s3://...` around a real SDK client: its calls land on S3 and its summary reads them
    back from there; the folder it ran in stays empty."""
    up = scripted()
    client = ("import anthropic\nc = anthropic.Anthropic(api_key='sk-ant-api03-s3tests3tests3test')\n"
              "for i in range(2):\n    c.messages.create(model='m', max_tokens=20, "
              "messages=[{'role': 'user', 'content': f'hi {i}'}])\nprint('client done')\n")
    run = verb("forge-record", "run", "--out", s3_root, "--session", "s3run", "--upstream-anthropic", up.url,
               "--", sys.executable, "-c", client, cwd=tmp_path)
    assert run.returncode == 0 and "client done" in run.stdout, run.stderr
    assert "session s3run" in run.stderr and "2 calls" in run.stderr
    assert len(calls_of(s3_root, "s3run", 2)) == 2 and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_convert_stages_an_s3_input_and_gives_what_the_local_dataset_gives(s3_root, tmp_path, monkeypatch):
    """`forge-convert s3://...` converts a staged local copy (DuckDB cannot read S3 here): the shards equal those of
    the same sessions recorded locally, the manifest names the s3:// input, and the stage is gone afterwards."""
    for root in (s3_root, tmp_path / "local"):
        with DatasetWriter(root, flush_interval=None) as w:
            for session in ("s1", "s2"):
                record_session(w, session, 3)
    stage = tmp_path / "tmp"
    stage.mkdir()
    monkeypatch.setenv("TMPDIR", str(stage))
    for root, out in ((s3_root, "from-s3"), (tmp_path / "local", "from-local")):
        done = verb("forge-convert", str(root), "--to", "verl-sft", "--out", str(tmp_path / out), "--no-progress",
                    "--allow-tools-absent")
        assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "from-s3" / "manifest.json").read_text())["input"]["dataset"] == s3_root
    rows = {out: pq.read_table(sorted((tmp_path / out).glob("*/*.parquet"))).sort_by("session_id").to_pylist()
            for out in ("from-s3", "from-local")}
    assert rows["from-s3"] == rows["from-local"] and len(rows["from-s3"]) >= 2
    assert list(stage.iterdir()) == []
