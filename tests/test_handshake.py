"""Runner <-> recorder handshake: the flush barrier, readiness, zero calls, a recording failure.

The recorder is real (in-process or `forge-record serve`), and so are its
writer process and the scripted upstream behind it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forgerl.recorder.control import RecorderControl
from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig
from scripted_upstream import ScriptedUpstream, Turn, sequence
from forgerl.recorder.writer_process import FLUSH_INTERVAL_S, Flusher, RecorderFailure
from forgerl.schema import sessions
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import HarnessSlots, Rollout
from forgerl.runners.loader import load_tasks
from forgerl.schema.files import data_files
from forgerl.schema.store import read_table
from forgerl.schema.writer import DatasetWriter

from runner_fixtures import CALL_MODEL, PythonHarness, barriers_asked_now, toml_task
from test_recorder_durability import child_pids, wait_gone

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def stack(tmp_path):
    with ScriptedUpstream(sequence(Turn(text=" ".join(f"w{i}" for i in range(40)))), chunks=20,
                          chunk_delay=0.03) as up, \
            BackgroundRecorder(RecorderConfig(out=tmp_path / "data", upstream_anthropic=up.url,
                                              upstream_openai=up.url)) as rec:
        yield tmp_path / "data", up, rec


def session_calls_on_disk(root, session: str) -> list[dict]:
    return [r for r in read_table(root, "calls", ["session_id", "complete", "t_end"]).to_pylist()
            if r["session_id"] == session]


def test_barrier_acknowledges_only_once_every_call_is_on_disk(stack):
    root, up, rec = stack
    session = f"barrier-{uuid.uuid4().hex[:6]}"
    base = f"{rec.config.url}/s/{session}/v1/chat/completions"
    for _ in range(3):
        assert httpx.post(base, json=CHAT, timeout=30).status_code == 200
    streamed = threading.Thread(target=lambda: httpx.post(base, json={**CHAT, "stream": True}, timeout=30))
    streamed.start()
    while len(up.log) < 4:  # through the proxy: ~0.6 s of deltas to go when the barrier is asked
        time.sleep(0.005)
    acknowledged = RecorderControl(rec.config.url).flush(session)
    rows = session_calls_on_disk(root, session)  # read right after the ack: no waiting, no polling
    streamed.join()
    assert acknowledged == 4
    assert len(rows) == 4 and all(r["complete"] for r in rows)


def test_readiness_and_control_paths_are_never_forwarded_or_recorded(stack):
    root, up, rec = stack
    control = RecorderControl(rec.config.url)
    assert control.ready()
    assert httpx.get(f"{rec.config.url}/_forge/ready").json() == {"ready": True}
    assert httpx.get(f"{rec.config.url}/_forge/nothing").status_code == 404
    assert httpx.get(f"{rec.config.url}/_forge/sessions/x/flush").status_code == 404  # POST only
    assert control.flush("never-seen") == 0
    assert up.log == []
    # Under a session prefix the same path is the harness's own traffic: forwarded and recorded.
    session = f"harness-{uuid.uuid4().hex[:6]}"
    httpx.get(f"{rec.config.url}/s/{session}/_forge/ready")
    assert [e.path for e in up.log] == ["/_forge/ready"]
    assert control.flush(session) == 1
    assert {r["session_id"] for r in read_table(root, "calls", ["session_id"]).to_pylist()} == {session}
    assert not RecorderControl(f"http://127.0.0.1:{rec.config.listen_port + 1}").ready()  # nothing there


def run_rollouts(rec_url: str, root, tmp_path, code: str, n: int = 1, tried: list[str] | None = None):
    """`n` rollouts of a Python snippet, one at a time; `tried` gets each attempt's session."""
    [task] = load_tasks(toml_task(tmp_path / "tasks", "hs", "return {'a': 1.0}"))
    tried = [] if tried is None else tried

    class Counting(LocalRunner):
        def attempt(self, rollout, session):
            tried.append(session)
            return super().attempt(rollout, session)

    runner = Counting(PythonHarness(code=code), rec_url, root, retries=0, workdir=tmp_path)
    with DatasetWriter(root, source="runner") as writer:
        return runner.run([Rollout(task, i) for i in range(n)], writer)


def test_a_rollout_with_a_call_is_graded(stack, tmp_path):
    root, _, rec = stack
    [outcome] = run_rollouts(rec.config.url, root, tmp_path, CALL_MODEL)
    assert outcome.status == "success", outcome.error


KEY = "sk-ant-api03-" + "Zq7" * 12  # key-shaped: the recorder's patterns mask it


def test_zero_recorded_calls_is_an_infra_error_that_says_how_the_harness_ended(stack, tmp_path):
    root, up, rec = stack
    tried: list[str] = []
    code = ("import sys; print('never asked the model')\n"
            f"sys.exit('browser did not start within 30 seconds (key {KEY})')")
    [outcome] = run_rollouts(rec.config.url, root, tmp_path, code, tried=tried)
    assert up.log == [] and len(tried) == 1
    assert outcome.status == "infra_error" and "no calls were recorded" in outcome.error
    assert "it exited with status 1; its stderr ended: browser did not start within 30 seconds" in outcome.error
    row = outcome.row()
    assert row["reward"] is None
    assert KEY not in row["error"] and "(key [REDACTED])" in row["error"]  # what is written, masked


def test_an_outcomes_free_text_is_masked_on_disk(stack, tmp_path):
    """A harness that prints a key: the outcome written keeps its stderr and final answer, the key masked."""
    root, _, rec = stack
    code = CALL_MODEL + f"import sys; print('using {KEY}', file=sys.stderr)"
    [outcome] = run_rollouts(rec.config.url, root, tmp_path, code)
    assert outcome.status == "success" and KEY in outcome.extra["stderr_tail"]  # in memory, as the harness said it
    [row] = [r for r in read_table(root, "outcomes").to_pylist() if r["session_id"] == outcome.session]
    assert json.loads(row["extra"])["stderr_tail"].strip() == "using [REDACTED]"
    assert KEY not in row["extra"]


def test_killed_writer_stops_forwarding_and_the_recorder_exits_non_zero(scripted, recorder):
    up = scripted()
    rec = recorder(up.url)
    base = rec.base("kill") + "/v1/chat/completions"
    assert httpx.post(base, json=CHAT, timeout=30).status_code == 200
    assert RecorderControl(rec.url).flush("kill") == 1
    [writer] = child_pids(rec.proc.pid)
    os.kill(writer, signal.SIGKILL)
    forwarded = len(up.log)
    deadline = time.monotonic() + 10
    while (r := httpx.post(base, json=CHAT, timeout=30)).status_code == 200 and time.monotonic() < deadline:
        forwarded = len(up.log)  # answered before the proxy saw the writer die: only then may one pass
        time.sleep(0.01)
    assert r.status_code == 503
    assert "forgerl recorder failure: writer process exited with status -9" in r.json()["error"]["message"]
    for _ in range(3):
        httpx.post(base, json={**CHAT, "stream": True}, timeout=30)
    assert len(up.log) == forwarded, "a call was forwarded after recording failed"
    with pytest.raises(RecorderFailure, match="writer process exited"):
        RecorderControl(rec.url).flush("kill")
    assert rec.proc.wait(timeout=30) != 0
    assert "writer process exited with status -9" in rec.stop()
    assert len(session_calls_on_disk(rec.out, "kill")) == 1, "what was recorded before the failure is kept"


def test_a_failed_write_stops_forwarding_too(scripted, recorder):
    up = scripted()
    rec = recorder(up.url)
    base = rec.base("disk") + "/v1/chat/completions"
    assert httpx.post(base, json=CHAT, timeout=30).status_code == 200
    RecorderControl(rec.url).flush("disk")
    shutil.rmtree(rec.out / "calls")
    (rec.out / "calls").write_text("")  # the next calls file cannot be written
    assert httpx.post(base, json=CHAT, timeout=30).status_code == 200  # forwarded before its write failed
    with pytest.raises(RecorderFailure, match="flush failed"):
        RecorderControl(rec.url).flush("disk")
    forwarded = len(up.log)
    r = httpx.post(base, json=CHAT, timeout=30)
    assert r.status_code == 503 and "flush failed" in r.json()["error"]["message"]
    assert len(up.log) == forwarded
    assert rec.proc.wait(timeout=30) != 0


def test_recording_failure_stops_the_run(scripted, recorder, tmp_path):
    up = scripted()
    rec = recorder(up.url)
    [writer] = child_pids(rec.proc.pid)
    os.kill(writer, signal.SIGKILL)
    tried: list[str] = []
    with pytest.raises(RecorderFailure):
        run_rollouts(rec.url, tmp_path / "data", tmp_path, CALL_MODEL, n=6, tried=tried)
    # One harness at a time, two more rollouts in flight beside it (pipelined): the other three never start.
    assert len(tried) <= 3, "rollouts started after the recorder failed"
    assert up.log == []
    assert read_table(tmp_path / "data", "outcomes").num_rows == 0


def test_session_read_opens_only_the_files_that_hold_the_session(tmp_path):
    root = tmp_path / "data"
    for i in range(6):  # six flushes: six files per table, one session each
        with DatasetWriter(root) as writer:
            writer.add_outcome({"session_id": f"s{i}", "task_id": "t", "attempt": i, "status": "success"})
    files = data_files(root, "outcomes")
    assert len(files) == 6
    assert sessions.session_rows(root, "outcomes", "s3", ["session_id", "attempt"]).to_pylist() == \
        [{"session_id": "s3", "attempt": 3}]
    mine = [f for f, _ in sessions.session_files(root, "outcomes", "s3")]
    assert len(mine) == 1
    for f in set(files) - set(mine):  # now unreadable: a read that opened them would fail
        with open(f, "wb") as out:
            out.write(b"not parquet")
    assert sessions.session_rows(root, "outcomes", "s3", ["attempt"]).column("attempt").to_pylist() == [3]
    with pytest.raises(pa.ArrowInvalid):  # the check above would have failed had it opened one
        pq.read_table(next(iter(set(files) - set(mine))))
    assert sessions.session_count(root, "outcomes", "s3") == 1


def test_barriers_ride_the_flush_clock_and_share_its_flushes(tmp_path):
    """A barrier is acknowledged by the clock's next flush, never by a flush of its own: barriers one after another
    still find the flushes `interval` apart, barriers asked together share one, and the open calls are
    snapshotted in each."""
    writer = DatasetWriter(tmp_path / "data", flush_interval=None)
    flushes: list[float] = []
    flush = writer.flush
    writer.flush = lambda *args, **kwargs: (flushes.append(time.monotonic()), flush(*args, **kwargs))[1]
    taken: list[bool] = []

    def snapshot(final: bool):
        taken.append(final)
        raise RuntimeError("finishing")  # what a call finishing meanwhile does: skipped, in the next snapshot

    writer.track("open-call", snapshot)
    interval = 0.2
    acks, channel = os.pipe()
    with os.fdopen(acks, "rb") as answers, os.fdopen(channel, "wb") as out:
        flusher = Flusher(writer, out, interval=interval)
        for token in range(3):  # each waits for its answer before the next is asked
            flusher.request(token, token)
            assert json.loads(answers.readline()) == {"flushed": token, "calls": token}
        asked = len(flushes)
        for token in range(3, 8):
            flusher.request(token, token)
        assert [json.loads(answers.readline()) for _ in range(5)] == [{"flushed": t, "calls": t} for t in range(3, 8)]
        assert len(flushes) - asked <= 2  # one flush answered all five (or the one under way, then the next)
        flusher.stop()
    gaps = [b - a for a, b in zip(flushes, flushes[1:-1])]  # the last one is stop()'s
    assert len(gaps) >= 3 and min(gaps) >= 0.9 * interval, gaps
    assert taken and not any(taken)  # the clock's flushes snapshotted the open call (as unfinished)
    writer.untrack("open-call")
    writer.close()


def test_a_barrier_asked_now_is_flushed_at_once_and_the_others_ride_the_clock(tmp_path):
    """`now` (a runner with a harness slot spare: nothing else keeps the machine busy) starts a flush at once, which
    answers every barrier waiting; a barrier asked without it waits for the clock."""
    writer = DatasetWriter(tmp_path / "data", flush_interval=None)
    acks, channel = os.pipe()
    with os.fdopen(acks, "rb") as answers, os.fdopen(channel, "wb") as out:
        flusher = Flusher(writer, out, interval=30)
        flusher.request(1, 1)
        start = time.monotonic()
        flusher.request(2, 5, now=True)
        assert [json.loads(answers.readline()) for _ in range(2)] == [{"flushed": 1, "calls": 1},
                                                                      {"flushed": 2, "calls": 5}]
        assert time.monotonic() - start < 10
        flusher.request(3, 1)
        assert select.select([answers], [], [], 0.5)[0] == []  # the clock's next flush is 30 s away
        flusher.stop()
        assert json.loads(answers.readline()) == {"flushed": 3, "calls": 1}
    writer.close()


def test_barriers_asked_now_through_the_recorder_do_not_wait_for_its_clock(stack):
    """Six barriers one after another: on the writer's clock each waits about its half second; asked now, none
    does, and each still counts the session's calls on disk."""
    root, _, rec = stack
    session = f"now-{uuid.uuid4().hex[:6]}"
    assert httpx.post(f"{rec.config.url}/s/{session}/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
    control = RecorderControl(rec.config.url)

    def six(now: bool) -> float:
        start = time.monotonic()
        assert [control.flush(session, now=now) for _ in range(6)] == [1] * 6
        return time.monotonic() - start

    assert six(now=False) > 6 * 0.6 * FLUSH_INTERVAL_S  # each waits for the clock's next tick
    assert six(now=True) < 6 * 0.4 * FLUSH_INTERVAL_S
    assert len(session_calls_on_disk(root, session)) == 1


def test_the_runner_asks_now_only_with_a_harness_slot_spare(stack, tmp_path, monkeypatch):
    """One rollout with two slots: its barrier is asked now (the batch waits on it with the machine idle); the
    slots say spare exactly while fewer harnesses run than there are slots."""
    slots = HarnessSlots(2)
    assert slots.spare()
    with slots:
        assert slots.spare()
        with slots:
            assert not slots.spare()
        assert slots.spare()
    asked = barriers_asked_now(monkeypatch)
    root, _, rec = stack
    [task] = load_tasks(toml_task(tmp_path / "tasks", "hs", "return {'a': 1.0}"))
    runner = LocalRunner(PythonHarness(code=CALL_MODEL), rec.config.url, root, parallel=2, retries=0,
                         workdir=tmp_path)
    with DatasetWriter(root, source="runner") as writer:
        [outcome] = runner.run([Rollout(task, 0)], writer)
    assert outcome.status == "success", outcome.error
    assert asked == [True]


def test_a_recorder_forge_run_started_goes_with_it(tmp_path):
    """forge-run killed outright (kill -9) leaves no `forge-record serve` behind, and what it recorded is on disk."""
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from forgerl.runners.serve import upstream_recorder\n"
        "with upstream_recorder(Path(sys.argv[1]), 'http://127.0.0.1:9') as url:\n"
        "    print(url, flush=True)\n"
        "    time.sleep(600)\n")
    runner = subprocess.Popen([sys.executable, str(script), str(tmp_path / "data")], stdout=subprocess.PIPE, text=True)
    try:
        url = runner.stdout.readline().strip()
        assert RecorderControl(url).ready()
        [recorder] = child_pids(runner.pid)
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        assert wait_gone([recorder], timeout=30), "the recorder outlived the runner that started it"
        assert not RecorderControl(url).ready()
        assert (tmp_path / "data" / "forgerl.json").exists()
        assert not list((tmp_path / "data" / "_writers").glob("*.lock")), "its writer did not close"
    finally:
        runner.kill()
