"""Secrets never reach disk; kill -9 mid-stream loses nothing older than a second."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import anthropic
import httpx
import pyarrow.parquet as pq

from forgerl.schema import files, store, tables
from forgerl.schema.records import decompress

from conftest import session_calls
from scripted_upstream import Turn, sequence

ANTHROPIC_KEY = "sk-ant-api03-Zq9vTESTKEYtestkeyTESTKEY0123456789abcdef"
OPENAI_KEY = "sk-proj-Tq7TESTKEYtestkeyTESTKEY0123456789abcdef"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
ENV_SECRET = "hunter2-correct-horse-battery"
COOKIE = "session=cookiesecretcookiesecret42"


def every_value_on_disk(root: Path):
    """Every Parquet value decompressed (zstd raw columns too), and every other file's bytes."""
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        if path.suffix != ".parquet":
            yield str(path), path.read_bytes()
            continue
        table = pq.read_table(path)
        for name in table.column_names:
            for value in table.column(name).to_pylist():
                if value is None:
                    continue
                if isinstance(value, bytes):
                    raw = decompress(value) if name.endswith("_raw") else value
                    yield f"{path}:{name}", raw
                else:
                    yield f"{path}:{name}", json.dumps(value, default=str).encode()


def test_secrets_never_reach_disk(scripted, recorder):
    up = scripted(sequence(Turn(text=f"I found {OPENAI_KEY} in the repo", thinking="look at keys")))
    rec = recorder(up.url)
    client = anthropic.Anthropic(base_url=rec.base("secret"), api_key=ANTHROPIC_KEY,
                                 default_headers={"Cookie": COOKIE})
    tool_output = f"cat .env\nDATABASE_PASSWORD={ENV_SECRET}\nAWS_ACCESS_KEY_ID={AWS_KEY}\nDEBUG=1\n"
    messages = [{"role": "user", "content": "deploy it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                   "input": {"command": "cat .env"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": tool_output}]}]
    with client.messages.stream(model="m", max_tokens=50, messages=messages) as s:
        reply = s.get_final_message()
    signature = reply.content[0].signature
    client.messages.create(model="m", max_tokens=50, messages=messages)
    rows = session_calls(rec.out, "secret", 2)
    rec.stop()
    assert up.log[0].headers.get("x-api-key") == ANTHROPIC_KEY  # the upstream did get the key
    found = {secret: [where for where, data in every_value_on_disk(rec.out) if secret.encode() in data]
             for secret in (ANTHROPIC_KEY, OPENAI_KEY, AWS_KEY, ENV_SECRET, COOKIE, "cookiesecret")}
    assert all(not where for where in found.values()), found
    # Redaction keeps what replay needs and what analysis reads.
    assert signature and signature.encode() in decompress(rows[0]["response_raw"])
    assert "DEBUG=1" in decompress(rows[0]["request_raw"]).decode()
    assert "DATABASE_PASSWORD=[REDACTED]" in decompress(rows[0]["request_raw"]).decode()
    headers = json.loads(rows[0]["request_headers"])
    assert headers["x-api-key"] == "[REDACTED]"


def test_custom_redaction_rules(scripted, recorder, tmp_path):
    rules = tmp_path / "rules.txt"
    rules.write_text("# employee ids\nEMP-[0-9]{6}\n")
    up = scripted()
    rec = recorder(up.url, "--redact-rules", str(rules))
    httpx.post(rec.base("rules") + "/v1/chat/completions", timeout=10,
               json={"model": "m", "messages": [{"role": "user", "content": "look up EMP-123456"}]})
    row = session_calls(rec.out, "rules", 1)[0]
    assert b"EMP-123456" not in decompress(row["request_raw"])
    assert "EMP-123456" not in row["response"]


def stream_one(base: str, i: int, done: dict, lock: threading.Lock) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"stream {i}"}]}
    try:
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", f"{base}/s/kill-{i}/v1/chat/completions", json=body) as r:
                for _ in r.iter_raw():
                    pass
        with lock:
            done[i] = time.time()
    except httpx.HTTPError:
        pass


def test_kill_minus_9_during_50_streams(scripted, recorder, tmp_path):
    long_reply = sequence(Turn(text=" ".join(f"word{i}" for i in range(100))))
    up = scripted(long_reply, chunks=50, chunk_delay=0.02)  # each stream ~1 s
    rec = recorder(up.url)
    done: dict[int, float] = {}
    lock = threading.Lock()
    threads = []
    for i in range(50):
        t = threading.Thread(target=stream_one, args=(rec.url, i, done, lock), daemon=True)
        t.start()
        threads.append(t)
        time.sleep(0.06)  # starts spread over 3 s: some finished, some mid-stream at the kill
    time.sleep(0.3)
    writers = child_pids(rec.proc.pid)
    assert writers, "forge-record serve has no writer process"
    rec.proc.send_signal(signal.SIGKILL)
    rec.proc.wait()
    killed_at = time.time()
    for t in threads:
        t.join(timeout=5)
    due = sorted(i for i, t in done.items() if t < killed_at - 1.0)
    assert len(due) >= 10, f"only {len(due)} streams had finished a second before the kill"
    # The writer process sees its pipe close, writes what it holds, and exits: it does not linger.
    assert wait_gone(writers, timeout=15), f"writer process {writers} outlived the killed recorder"
    # Restart on the same directory: dead writers' in-flight calls are recovered as incomplete.
    again = recorder(up.url, out=rec.out)
    again.stop()
    calls = store.read_table(rec.out, "calls")
    by_session = {}
    for row in calls.to_pylist():
        by_session.setdefault(row["session_id"], []).append(row)
    for i in due:
        rows = by_session.get(f"kill-{i}", [])
        assert len(rows) == 1 and rows[0]["complete"] and rows[0]["error"] is None, (i, rows)
    unfinished = [rows[0] for s, rows in by_session.items() if int(s.split("-")[1]) not in done]
    assert unfinished and all(not r["complete"] and r["error"] for r in unfinished)
    # Open calls keep the bytes the writer process had received before the kill.
    assert any(r["response_raw"] and b"word" in decompress(r["response_raw"]) for r in unfinished)
    for table in tables.TABLES:
        for f in files.data_files(rec.out, table):
            pq.read_table(f)
    assert not list((rec.out / "_inflight").glob("*.parquet"))


def test_kill_minus_9_of_recorder_and_writer_process(scripted, recorder):
    """Both processes die at once: the writer's in-flight snapshot is recovered on restart."""
    up = scripted(sequence(Turn(text=" ".join(f"word{i}" for i in range(100)))), chunks=50, chunk_delay=0.04)
    rec = recorder(up.url)
    done: dict[int, float] = {}
    lock = threading.Lock()
    threads = [threading.Thread(target=stream_one, args=(rec.url, i, done, lock), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    time.sleep(1.2)  # every stream mid-way (each ~2 s): several in-flight snapshots written
    writers = child_pids(rec.proc.pid)
    for pid in [rec.proc.pid, *writers]:
        os.kill(pid, signal.SIGKILL)
    rec.proc.wait()
    assert wait_gone(writers, timeout=5)
    for t in threads:
        t.join(timeout=5)
    assert list((rec.out / "_inflight").glob("*.parquet")), "no in-flight snapshot was on disk"
    again = recorder(up.url, out=rec.out)
    again.stop()
    rows = store.read_table(rec.out, "calls").to_pylist()
    assert len(rows) == 8 and all(not r["complete"] and r["error"] for r in rows), rows
    assert all(r["response_raw"] and b"word" in decompress(r["response_raw"]) for r in rows)
    assert not list((rec.out / "_inflight").glob("*.parquet"))


def child_pids(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(Path(f"/proc/{p}").exists() and "zombie" not in _state(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _state(pid: int) -> str:
    try:
        return next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State"))
    except (OSError, StopIteration):
        return "zombie"
