"""Secrets never reach disk; kill -9 mid-stream loses nothing older than a second."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import anthropic
import httpx
import pyarrow.parquet as pq

from forgerl.recorder.scripted import Turn, sequence
from forgerl.schema import store, tables
from forgerl.schema.records import decompress

from conftest import session_calls

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
    rec.proc.send_signal(signal.SIGKILL)
    rec.proc.wait()
    killed_at = time.time()
    for t in threads:
        t.join(timeout=5)
    due = sorted(i for i, t in done.items() if t < killed_at - 1.0)
    assert len(due) >= 10, f"only {len(due)} streams had finished a second before the kill"
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
    for table in tables.TABLES:
        for f in store.data_files(rec.out, table):
            pq.read_table(f)
    assert not list((rec.out / "_inflight").glob("*.parquet"))
