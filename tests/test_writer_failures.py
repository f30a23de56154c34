"""The writer never drops a call silently (issue 30).

A call the recorder cannot record whole is logged with its traceback, stored
as far as it can be (its raw bytes), fails its session's flush barrier (so the
rollout is an infra error, retried), and makes `forge-record serve` exit
non-zero saying how many. What the upstream got wrong (a body that is not
JSON) stays the call's own error, as before, and fails nothing.

Everything is real: `forge-record serve` in a process of its own with its
writer process, the scripted upstream, sockets, the local runner. The faults
are a corrupt file dropped into the dataset mid-run (reading a session's
history then raises while its call's rows are built), and a codec bug
injected into the writer process (`tests/faults/sitecustomize.py`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import RecorderProcess, session_calls
from forgerl.recorder.control import RecorderControl
from forgerl.recorder.writer_process import CallsFailed, RecorderFailure
from forgerl.runners.local import LocalRunner
from forgerl.runners.rollout import Rollout
from forgerl.runners.loader import load_tasks
from forgerl.schema.store import read_table
from forgerl.schema.writer import DatasetWriter
from runner_fixtures import CALL_MODEL, PythonHarness, toml_task
from scripted_upstream import Request, Turn

FAULTS = Path(__file__).resolve().parent / "faults"
MARKER = "trip-the-codec-7f3a"  # what the injected codec bug raises on


def chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def codec_bug_env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH")) if p),
            "FORGERL_TEST_CODEC_BUG": MARKER}


def says_the_marker_when_asked(request: Request) -> Turn:
    return Turn(text=f"here it is: {MARKER}" if "say the marker" in str(request.body) else "fine")


def test_a_codec_bug_keeps_the_raw_call_fails_its_barrier_and_the_exit_status(scripted, tmp_path):
    up = scripted(says_the_marker_when_asked)
    rec = RecorderProcess(tmp_path / "data", up.url, env=codec_bug_env()).start()
    control = RecorderControl(rec.url)
    try:
        sent = {
            "bug-request": httpx.post(rec.base("bug-request") + "/v1/chat/completions", json=chat(MARKER),
                                      timeout=30),
            "bug-response": httpx.post(rec.base("bug-response") + "/v1/chat/completions",
                                       json=chat("say the marker"), timeout=30),
            "fine": httpx.post(rec.base("fine") + "/v1/chat/completions", json=chat("hi"), timeout=30),
        }
        upstream_fault = httpx.post(rec.base("upstream-nonjson") + "/v1/chat/completions", json=chat("hi"),
                                    headers={"x-scripted-fault": "nonjson"}, timeout=30)
        # The harness got its answers: a bug in recording them is not in its way.
        assert all(r.status_code == 200 for r in sent.values())
        assert MARKER in sent["bug-response"].json()["choices"][0]["message"]["content"]
        assert upstream_fault.content == b"not json"

        for session, what in (("bug-request", "parsing the request"), ("bug-response", "reading the response")):
            for _ in range(2):  # every barrier of the session says so, not only the first
                with pytest.raises(CallsFailed) as failed:
                    control.flush(session)
                said = str(failed.value)
                assert f"1 call of session {session!r} could not be recorded whole" in said
                assert f"forgerl bug: the chat codec {what} raised RuntimeError: injected codec bug" in said
                assert "its raw bytes are kept" in said
            [row] = session_calls(rec.out, session, 1)
            assert f"call {row['call_id']} (seq " in said  # it names the call
            assert f"forgerl bug: the chat codec {what} raised" in row["error"]
            assert "could not normalise" not in row["error"]
            assert row["request_raw"] and row["response_raw"], "the raw call is kept"
        assert control.flush("fine") == 1
        # The upstream's own fault is the call's error, as the harness saw it: recorded, nothing failed.
        assert control.flush("upstream-nonjson") == 1
        [row] = session_calls(rec.out, "upstream-nonjson", 1)
        assert "not JSON" in row["error"] and "forgerl bug" not in row["error"]
    finally:
        log = rec.stop()
    assert rec.proc.returncode == 1, log
    assert log.count("Traceback (most recent call last)") >= 2, log
    assert "RuntimeError: injected codec bug in parse_request" in log
    assert "RuntimeError: injected codec bug in parse_response" in log
    assert "forge-record: 2 calls could not be recorded whole" in log


def test_a_call_whose_rows_cannot_be_built_makes_the_rollout_an_infra_error(scripted, tmp_path):
    up = scripted()
    rec = RecorderProcess(tmp_path / "data", up.url).start()
    try:
        assert httpx.post(rec.base("before") + "/v1/chat/completions", json=chat("hi"), timeout=30).status_code == 200
        assert RecorderControl(rec.url).flush("before") == 1
        # Mid-run, a file that is not Parquet lands among the calls: a new session's history cannot be read, so
        # its calls' segments cannot be placed, nor their rows built.
        (rec.out / "calls" / "zz-corrupt.parquet").write_bytes(b"not parquet at all")
        [task] = load_tasks(toml_task(tmp_path / "tasks", "wf", "return {'a': 1.0}"))
        runner = LocalRunner(PythonHarness(code=CALL_MODEL), rec.url, rec.out, retries=1, workdir=tmp_path)
        with DatasetWriter(rec.out, source="runner") as writer:
            [outcome] = runner.run([Rollout(task, 0)], writer)
    finally:
        log = rec.stop()
    assert outcome.status == "infra_error" and outcome.scores is None
    assert outcome.extra["tries"] == 2, "retried as infra errors are"
    assert outcome.error.count("could not be recorded whole") == 2, outcome.error
    assert "forgerl bug: recording it raised ArrowInvalid" in outcome.error
    assert "it is lost" in outcome.error  # not even raw: the same read fails
    [row] = read_table(rec.out, "outcomes").to_pylist()
    assert row["status"] == "infra_error" and "could not be recorded whole" in row["error"]
    assert len(up.log) == 3, "both tries reached the model: the harness was not in the way"
    assert rec.proc.returncode == 1, log
    assert log.count("Traceback (most recent call last)") >= 2 and "pyarrow.lib.ArrowInvalid" in log, log
    assert "forge-record: 2 calls could not be recorded whole" in log


def test_a_failed_parquet_write_is_logged_with_its_traceback(scripted, recorder):
    """Writing a file failing loses every row it held: final, as `test_handshake` shows (the recorder stops
    forwarding and exits non-zero); here, that its log says where it failed."""
    rec = recorder(scripted().url)
    shutil.rmtree(rec.out / "messages")
    (rec.out / "messages").write_text("")  # a file where the folder was: the next messages file cannot be written
    assert httpx.post(rec.base("w") + "/v1/chat/completions", json=chat("hi"), timeout=30).status_code == 200
    with pytest.raises(RecorderFailure, match="flush failed"):
        RecorderControl(rec.url).flush("w")
    assert rec.proc.wait(timeout=30) != 0
    log = rec.stop()
    assert "Traceback (most recent call last)" in log and "in flush" in log, log
