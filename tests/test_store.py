"""The dataset root: append-only writes, readers, compaction, deletion, migrations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import datasets
import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forgerl.schema import files, maintenance, store, tables, writer
from forgerl.schema.messages import Exchange, Message, Part, Usage
from forgerl.schema.records import CallRecord, decompress, messages_from_refs
from forgerl.schema.files import SchemaVersionError


def make_call(session: str, i: int, history: list[Message]) -> CallRecord:
    reply = Message("assistant", (Part("text", text=f"reply {i}"),
                                  Part("tool_call", tool_name="Bash", call_id=f"t{i}", arguments='{"cmd":"ls"}')))
    ex = Exchange(input=list(history), output=[reply], usage=Usage(10, 5, 2, 1), model_requested="m")
    return CallRecord(call_id=f"{session}-{i}", session_id=session, api="anthropic", method="POST",
                      path="/v1/messages", t_start=datetime.now(timezone.utc), complete=True, status=200,
                      exchange=ex, request_raw=b'{"x":1}', response_raw=b"event: x\n\n")


def record_session(writer: writer.DatasetWriter, session: str, turns: int) -> None:
    history = [Message("system", (Part("text", text="you are a test"),)),
               Message("user", (Part("text", text=f"task for {session}"),))]
    for i in range(turns):
        call = make_call(session, i, history)
        writer.add_call(call)
        history += [call.exchange.output[0],
                    Message("tool", (Part("tool_result", call_id=f"t{i}", text=f"out {i}", is_error=i == 1),))]
    writer.add_session(session, harness="test")


def test_roundtrip_and_part_dedupe(tmp_path):
    with writer.DatasetWriter(tmp_path) as w:
        record_session(w, "s1", 10)
    calls = store.read_table(tmp_path, "calls")
    parts = store.read_table(tmp_path, "messages")
    assert calls.num_rows == 10
    # 2 initial parts + 2 output parts per call + the 9 tool results later calls sent:
    # linear in new content, not quadratic in session length.
    assert parts.num_rows == 2 + 10 * 2 + 9
    by_hash = dict(zip(parts.column("part_hash").to_pylist(), parts.column("part").to_pylist()))
    last = calls.slice(9, 1).to_pylist()[0]
    messages = messages_from_refs(last["input_refs"], last["input_msg"], last["input_roles"], by_hash)
    assert [m.role for m in messages] == ["system", "user"] + ["assistant", "tool"] * 9
    assert messages[5].parts[0].is_error is True
    out = parts.filter(pa.compute.equal(parts.column("part_type"), "tool_call"))
    assert set(out.column("direction").to_pylist()) == {"output"}
    assert decompress(last["request_raw"]) == b'{"x":1}'
    assert last["cache_read_tokens"] == 2 and last["cache_write_tokens"] == 1


def test_three_readers_load_the_root(tmp_path):
    with writer.DatasetWriter(tmp_path) as w:
        record_session(w, "a", 3)
        w.flush()
        record_session(w, "b", 4)
    paths = files.data_files(tmp_path, "calls")
    assert len(paths) >= 2
    ds = datasets.load_dataset("parquet", data_files={"train": paths}, features=tables.features("calls"),
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 7 and ds.features == tables.features("calls")
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/calls/*.parquet')").fetchall()[0][0] == 7
    assert pl.scan_parquet(f"{tmp_path}/calls/*.parquet").select(pl.len()).collect().item() == 7
    for table in tables.TABLES:
        glob = f"{tmp_path}/{table}/*.parquet"
        if files.data_files(tmp_path, table):
            pl.scan_parquet(glob).collect()
            duckdb.sql(f"SELECT * FROM read_parquet('{glob}')").fetchall()


def test_many_writers_share_a_root(tmp_path):
    writers = [writer.DatasetWriter(tmp_path) for _ in range(4)]
    threads = [threading.Thread(target=record_session, args=(w, f"s{i}", 5)) for i, w in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    calls = store.read_table(tmp_path, "calls")
    assert calls.num_rows == 20 and len(set(calls.column("call_id").to_pylist())) == 20


def test_compaction_is_atomic_for_readers(tmp_path):
    with writer.DatasetWriter(tmp_path, flush_interval=3600) as w:
        for i in range(30):
            record_session(w, f"s{i}", 2)
            w.flush()
    before = len(files.data_files(tmp_path, "calls"))
    assert before == 30
    stop = threading.Event()
    seen: list[int] = []

    def read_forever():
        while not stop.is_set():
            ids = store.read_table(tmp_path, "calls", columns=["call_id"]).column("call_id").to_pylist()
            seen.append(len(ids))
            assert len(ids) == len(set(ids))

    reader = threading.Thread(target=read_forever)
    reader.start()
    replaced = maintenance.compact(tmp_path)
    time.sleep(0.1)
    stop.set()
    reader.join()
    assert replaced["calls"] == 30
    assert len(files.data_files(tmp_path, "calls")) == 1
    assert set(seen) == {60}, "a reader saw a call twice or not at all"
    # A second compaction folds duplicates left by a restarted writer.
    with writer.DatasetWriter(tmp_path) as w:
        record_session(w, "s0", 2)  # same session again: its parts are rewritten by this new writer
    maintenance.compact(tmp_path)
    parts = store.read_table(tmp_path, "messages")
    keys = list(zip(parts.column("session_id").to_pylist(), parts.column("part_hash").to_pylist()))
    assert len(keys) == len(set(keys))


def test_the_session_index_follows_new_files_and_a_compaction(tmp_path):
    """A reader's index learns each new file once and forgets a compaction's sources, per table."""
    from forgerl.schema import sessions

    def counts():
        return {s: sessions.session_count(tmp_path, "calls", s) for s in ("a", "b", "c")}

    def holding(session):
        return [f for f, _ in sessions.session_files(tmp_path, "calls", session)]

    with writer.DatasetWriter(tmp_path, flush_interval=3600) as w:
        record_session(w, "a", 2)
        w.flush()
        record_session(w, "b", 2)
        w.add_call(make_call("a", 2, []))  # a's third call in a second file
        w.flush()
        assert counts() == {"a": 3, "b": 2, "c": 0}
        assert holding("a") == files.data_files(tmp_path, "calls") and len(holding("a")) == 2
        assert sessions.session_count(tmp_path, "messages", "b") > 0  # another table, its own index
        maintenance.compact(tmp_path)
        assert counts() == {"a": 3, "b": 2, "c": 0} and holding("a") == files.data_files(tmp_path, "calls")
        record_session(w, "c", 3)
        w.flush()
    assert counts() == {"a": 3, "b": 2, "c": 3} and holding("c") == files.data_files(tmp_path, "calls")[1:]
    calls = sessions.session_rows(tmp_path, "calls", "a", ["call_id"]).column("call_id").to_pylist()
    assert sorted(calls) == ["a-0", "a-1", "a-2"]
    sessions.forget()
    assert counts() == {"a": 3, "b": 2, "c": 3}


def test_an_older_listing_read_meanwhile_does_not_hide_a_new_file(tmp_path):
    """Two rollouts graded at once: one thread lists the folder before the writer's newest file lands and is
    held up; another lists after, learns that file, and is about to look for its session in it when the
    first catches up with its older listing. The file is still there: it must not be forgotten (a rollout
    was an infra_error when its grading saw fewer calls than the recorder had acknowledged)."""
    from forgerl.schema import sessions

    with writer.DatasetWriter(tmp_path, flush_interval=3600) as w:
        record_session(w, "a", 2)
        w.flush()
        _, older = files.data_file_names(tmp_path, "calls")
        record_session(w, "b", 3)
        w.flush()
    path, newer = files.data_file_names(tmp_path, "calls")
    index = sessions._folder(path)
    index.update(newer)
    index.update(older)
    assert [rows for _, rows, _ in index.holding("b", newer)] == [3]
    assert sessions.session_count(tmp_path, "calls", "b") == 3


def test_glob_readers_after_compaction(tmp_path):
    with writer.DatasetWriter(tmp_path) as w:
        record_session(w, "a", 3)
        w.flush()
        record_session(w, "b", 3)
    maintenance.compact(tmp_path)
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/calls/*.parquet')").fetchall()[0][0] == 6


def test_delete_session_rewrites_only_its_files(tmp_path):
    with writer.DatasetWriter(tmp_path, flush_interval=3600) as w:
        record_session(w, "keep", 3)
        w.flush()
        record_session(w, "gone", 3)
        record_session(w, "keep2", 1)
        w.flush()
    keep_files = {p: os.stat(p).st_mtime_ns for p in files.data_files(tmp_path, "calls")[:1]}
    removed = maintenance.delete_session(tmp_path, "gone")
    assert removed["calls"] == 3 and removed["messages"] > 0 and removed["sessions"] == 1
    for p, mtime in keep_files.items():
        assert os.stat(p).st_mtime_ns == mtime, "a file without the session was rewritten"
    for table in tables.TABLES:
        ids = store.read_table(tmp_path, table, columns=["session_id"]).column("session_id").to_pylist()
        assert "gone" not in ids
    assert set(store.read_table(tmp_path, "calls").column("session_id").to_pylist()) == {"keep", "keep2"}


def test_a_file_from_the_future_is_refused(tmp_path):
    with writer.DatasetWriter(tmp_path) as w:
        record_session(w, "s", 2)
    path = Path(files.data_files(tmp_path, "sessions")[0])
    files.atomic_write_table(path, pq.read_table(path), "sessions", version=tables.SCHEMA_VERSION + 1)
    with pytest.raises(SchemaVersionError, match="upgrade forgerl"):
        store.read_table(tmp_path, "sessions")


def test_not_a_dataset(tmp_path):
    with pytest.raises(files.DatasetError, match="not a forgerl dataset"):
        store.read_table(tmp_path, "calls")
    (tmp_path / files.MANIFEST).write_text(json.dumps({"format": files.FORMAT, "schema_version": 99}))
    with pytest.raises(SchemaVersionError):
        files.read_manifest(tmp_path)


WRITER_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_store import make_call, Message, Part
    from forgerl.schema import writer
    w = writer.DatasetWriter({root!r}, flush_interval=0.2)
    i = 0
    while True:
        call = make_call("s", i, [Message("user", (Part("text", text=str(i)),))])
        w.add_call(call)
        print(i, time.time(), flush=True)
        i += 1
        time.sleep(0.01)
""")


def test_kill_minus_9_loses_at_most_the_last_flush(tmp_path):
    script = WRITER_SCRIPT.format(tests=str(Path(__file__).parent), root=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acked: list[tuple[int, float]] = []
    deadline = None  # 3 s of writing, counted from the first ack: imports are slow on a busy machine
    while deadline is None or time.time() < deadline:
        i, t = proc.stdout.readline().split()
        acked.append((int(i), float(t)))
        deadline = deadline or time.time() + 3
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_time = time.time()
    ids = set(store.read_table(tmp_path, "calls").column("call_id").to_pylist())
    due = [i for i, t in acked if t < kill_time - 1.0]
    assert due and all(f"s-{i}" in ids for i in due)
    for table in tables.TABLES:
        for f in files.data_files(tmp_path, table):
            pq.read_table(f)


def test_outcomes_round_trip_and_unknown_columns(tmp_path):
    from forgerl.schema.store import read_table
    from forgerl.schema.writer import DatasetWriter
    with DatasetWriter(tmp_path / "ds") as writer:
        writer.add_outcome({"session_id": "s1", "task_id": "t1", "attempt": 0, "status": "success",
                            "reward": 1.0, "passed": True, "scores": '{"a": 1.0}'})
        with pytest.raises(ValueError, match="unknown outcome columns"):
            writer.add_outcome({"session_id": "s2", "rewardd": 0.5})
    rows = read_table(tmp_path / "ds", "outcomes").to_pylist()
    assert [(r["session_id"], r["task_id"], r["reward"], r["passed"]) for r in rows] == [("s1", "t1", 1.0, True)]
    assert rows[0]["writer_id"]


def test_row_groups_are_bounded_in_bytes(tmp_path):
    """Wide rows (a prompt of 100k token ids each) get small row groups, so a reader decoding one group
    a vector at a time needs tens of MB, not gigabytes; narrow rows keep large groups."""
    wide = pa.table({"session_id": ["s"] * 400, "prompt_token_ids": [list(range(100_000))] * 400})
    files.atomic_write_table(tmp_path / "wide.parquet", wide, "calls")
    meta = pq.ParquetFile(tmp_path / "wide.parquet").metadata
    assert meta.num_rows == 400 and meta.num_row_groups >= 4
    assert all(meta.row_group(g).num_rows * 400_000 <= 40 << 20 for g in range(meta.num_row_groups))
    narrow = pa.table({"session_id": [f"s{i}" for i in range(50_000)]})
    files.atomic_write_table(tmp_path / "narrow.parquet", narrow, "sessions")
    assert pq.ParquetFile(tmp_path / "narrow.parquet").metadata.num_row_groups == 1


def test_a_session_resumed_by_another_writer_continues_its_stored_segment(tmp_path):
    """A harness's `--continue` run goes through a new recorder: the new writer takes the session up where
    the stored calls left it (same segment, continuing the last call, parts not written twice)."""
    history = [Message("system", (Part("text", text="you are a test"),)), Message("user", (Part("text", text="go"),))]
    first = make_call("s", 0, history)
    with writer.DatasetWriter(tmp_path) as w:
        w.add_session("s", harness="test")
        w.add_call(first)
        w.add_call(make_call("other", 0, history))
    history += [first.exchange.output[0], Message("tool", (Part("tool_result", call_id="t0", text="out"),))]
    with writer.DatasetWriter(tmp_path) as w:
        w.add_call(make_call("s", 1, history))
        w.add_call(make_call("fresh", 0, history[:2]))
    calls = {c["call_id"]: c for c in store.read_table(tmp_path, "calls").to_pylist()}
    assert (calls["s-1"]["segment_index"], calls["s-1"]["continues_call"]) == (0, "s-0")
    assert (calls["fresh-0"]["segment_index"], calls["fresh-0"]["segment_reason"]) == (0, "start")
    parts = store.read_table(tmp_path, "messages").to_pylist()
    hashes = [(p["session_id"], p["part_hash"]) for p in parts]
    assert len(hashes) == len(set(hashes)), "the second writer wrote the session's parts again"
