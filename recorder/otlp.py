"""Live OTLP/HTTP export of recorded sessions (`--otlp URL`), from the writer process.

The writer process (`writer_process.py`) hands each call row it writes to
`OtlpExporter.call`, which builds its spans (`otel.SessionTrace`, the mapping
`forge-convert --to otel` uses, so ids match) and puts them on a bounded
queue without waiting; a thread of its own POSTs them as protobuf to
`URL/v1/traces`. The proxy never waits on any of it, and neither does the
writer's Parquet work: when the queue is full or a POST fails (collector down,
slow past `timeout`, a non-2xx answer) the spans are dropped and counted, and
the count is logged when the writer exits. A session's agent and root spans
are sent after it has been idle `idle_s` seconds (120), or when the writer
exits; a session that goes on after that keeps its ids (its later calls'
spans join the same trace), but its root keeps the end it was sent with.

Where a runner writes the sessions' outcomes (`forge-run`, `forge-train rl`:
`FORGE_OTLP_ROOTS=runner`, which their recorders inherit) the writer sends no
agent or root span at all: the runner does, with the outcome, as it writes it
(`end_session`): it replays the session's stored calls through the same
mapping as `forge-convert --to otel`, so its root is the offline export's,
outcome and times included. A recorder without a runner (`forge-record`
alone) keeps the idle end.

`forge-record serve/run --otlp URL`, `forge-run --otlp URL` and `forge-train rl
--otlp URL` set `FORGE_OTLP_URL` for the writer process they start (the
recorder's child inherits it). Headers come from the standard
`OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_TRACES_HEADERS`
(`key=value,key2=value2`, values URL-encoded), the POST timeout from
`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` / `OTEL_EXPORTER_OTLP_TIMEOUT` (ms,
default 10 s). `--otel-content` (`FORGE_OTLP_CONTENT=1`) adds message content
(`otel_content.py`).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import urllib3

from forgerl.errors import UserError
from forgerl.schema.messages import Message
from forgerl.schema.records import CallRecord
from forgerl.schema.sessions import session_rows

from .otel import (CALL_COLUMNS, PART_COLUMNS, Parts, SessionTrace, ToolUses, export_request, replay, tool_parts,
                   tool_uses)
from .otel_content import value_limit

URL_ENV = "FORGE_OTLP_URL"
ROOTS_ENV = "FORGE_OTLP_ROOTS"  # "runner": the runner ends each session's trace with its outcome (`end_session`)
CONTENT_ENV = "FORGE_OTLP_CONTENT"  # "1": --otel-content
HEADER_ENVS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")  # the later one wins per key
TIMEOUT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")  # milliseconds, first set wins
TIMEOUT_S = 10.0  # the OTLP exporter default
IDLE_S = 120.0
KEPT_SESSIONS = 1024  # ended sessions whose state is kept, so a call arriving late still finds its parents
QUEUE_SPANS = 10_000
BATCH_SPANS = 512
LINGER_S = 0.5


def configure_export(args: argparse.Namespace, outcomes: bool = False) -> None:
    """`--otlp URL [--otel-content]` (`add_otlp_flag`): the writer processes this process starts (and their
    recorders' children: forge-run's `forge-record serve`, Ray workers of a local cluster started afterwards)
    export there, message content included if asked. `outcomes`: this process writes the sessions' outcomes
    and ends their traces itself (`OtlpExporter.end_session`); the writers leave agent and root spans to it."""
    url = args.otlp
    if args.otel_content and not url:
        raise UserError("--otel-content adds message content to the spans --otlp URL sends: give --otlp too")
    if not url:
        return
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
        raise UserError(f"--otlp {url!r}: give the collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318")
    export_timeout_s()  # a bad timeout or limit is refused here, not in the writer process
    value_limit()
    os.environ[URL_ENV] = url
    os.environ[CONTENT_ENV] = "1" if args.otel_content else ""
    os.environ[ROOTS_ENV] = "runner" if outcomes else ""


def add_otlp_flag(parser: argparse.ArgumentParser) -> None:
    """The `--otlp URL` option every recording verb shares."""
    parser.add_argument("--otlp", default="", metavar="URL",
                        help="also send each recorded session live as OpenTelemetry GenAI spans to this OTLP/HTTP "
                             "collector (POST URL/v1/traces, protobuf; headers from $OTEL_EXPORTER_OTLP_HEADERS); "
                             "a slow or down collector never holds recording up: spans are dropped and counted")
    parser.add_argument("--otel-content", action="store_true",
                        help="with --otlp: put each call's new messages, its answer, instructions and tool "
                             "definitions on its span (redacted as recorded; images as blob references)")


def export_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """Each POST's timeout, from the standard variables (milliseconds; the first set wins, each set one must be
    valid), else `TIMEOUT_S`."""
    env = os.environ if env is None else env
    given = []
    for var in TIMEOUT_ENVS:
        if env.get(var):
            try:
                given.append(float(env[var]))
            except ValueError:
                given.append(0.0)
            if given[-1] <= 0:
                raise UserError(f"${var}={env[var]!r}: give the OTLP export timeout in milliseconds, e.g. 10000")
    return given[0] / 1000 if given else TIMEOUT_S


def otlp_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Headers from the standard OTLP variables (`k=v,k2=v2`, URL-encoded values)."""
    env = os.environ if env is None else env
    headers: dict[str, str] = {}
    for var in HEADER_ENVS:
        for item in env.get(var, "").split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip():
                headers[key.strip()] = unquote(value.strip())
    return headers


def traces_url(url: str) -> str:
    """The collector's OTLP/HTTP traces path: `URL/v1/traces` unless URL already ends so."""
    url = url.rstrip("/")
    return url if url.endswith("/v1/traces") else f"{url}/v1/traces"


@dataclass
class _Session:
    trace: SessionTrace
    seen: float = 0.0  # monotonic time of its last call
    harness: str | None = None
    ended: bool = False  # its root span was sent


def _parts(messages: list[Message]) -> Parts:
    return ((p.type, p.call_id, p.tool_name, p.is_error) for m in messages for p in m.parts)


class OtlpExporter:
    """Spans of the calls the writer writes, sent on a thread; `sent` and `dropped` count spans. `ends_roots`
    False (`FORGE_OTLP_ROOTS=runner`): it sends no agent or root span of its own; `end_session` does."""

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, idle_s: float = IDLE_S,
                 max_queue: int = QUEUE_SPANS, timeout: float = TIMEOUT_S, content: bool = False,
                 ends_roots: bool = True) -> None:
        self.url = traces_url(url)
        self.content, self.ends_roots = content, ends_roots
        self.headers = {**(headers or {}), "Content-Type": "application/x-protobuf"}
        self.idle_s, self.timeout = idle_s, timeout
        self.sent = self.dropped = 0
        self._queue: queue.Queue = queue.Queue(max_queue)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}  # insertion order: the oldest first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="forgerl-otlp", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OtlpExporter | None:
        """An exporter to `$FORGE_OTLP_URL`, or None when it is not set. The environment is read when called, not
        bound at import: HF datasets' `map(num_proc=...)` replaces the `os.environ` object with a copy."""
        env = os.environ if env is None else env
        url = env.get(URL_ENV, "")
        return cls(url, headers=otlp_headers(env), timeout=export_timeout_s(env), content=env.get(CONTENT_ENV) == "1",
                   ends_roots=env.get(ROOTS_ENV) != "runner") if url else None

    @staticmethod
    def runner_ends_roots(env: Mapping[str, str] | None = None) -> bool:
        """Whether this process's runner is to end its sessions' traces (`end_session`)."""
        env = os.environ if env is None else env
        return bool(env.get(URL_ENV)) and env.get(ROOTS_ENV) == "runner"

    def call(self, row: Mapping[str, Any], record: CallRecord, harness: str | None) -> None:
        """A call row as written (and the record it came from): its spans join the queue (or are counted
        dropped)."""
        ex = record.exchange
        tools = tool_uses(_parts(ex.output), _parts(ex.input)) if ex is not None else ToolUses()
        content = (ex.input, ex.output) if self.content and ex is not None else None
        with self._lock:
            session = self._sessions.pop(row["session_id"], None) or _Session(SessionTrace(row["session_id"]))
            self._sessions[row["session_id"]] = session  # now the newest
            session.seen, session.harness = time.monotonic(), harness or session.harness
            spans = session.trace.add(row, tools, content)
        self._put(spans)

    def end_session(self, dataset: Path, session_id: str, outcome: Mapping[str, Any] | None) -> None:
        """Send a finished session's agent and root spans, the root carrying `outcome` (its `outcomes` row, as
        written; None for a try that has none): rebuilt from the session's stored calls, which must be durable
        (the runner's flush barrier), by `otel.replay`, as the offline export builds them."""
        calls = session_rows(dataset, "calls", session_id, [*CALL_COLUMNS, "input_refs", "output_refs"])
        parts = session_rows(dataset, "messages", session_id, list(PART_COLUMNS)).to_pylist()
        harness = session_rows(dataset, "sessions", session_id, ["harness"]).column("harness").to_pylist()
        trace, _ = replay(session_id, calls.to_pylist(), tool_parts(parts))  # the call spans went out from the writer
        self._put(trace.finish(outcome, harness[-1] if harness else None))

    def close(self) -> None:
        """End every session's trace, send what the queue holds (each POST within `timeout`), log the counts."""
        self._end_sessions(0.0)
        self._stop.set()
        self._thread.join()
        print(f"forgerl: OTLP export to {self.url}: {self.sent} spans sent, {self.dropped} dropped",
              file=sys.stderr, flush=True)

    def _put(self, spans: list) -> None:
        for span in spans:
            try:
                self._queue.put_nowait(span)
            except queue.Full:
                self._count_dropped(1)

    def _count_dropped(self, n: int) -> None:
        with self._lock:
            self.dropped += n

    def _end_sessions(self, idle_s: float) -> None:
        """Send the agent and root spans of the sessions idle `idle_s` s (once: a session that goes on after
        it keeps its ids, and its root the end it was sent with; none where the runner ends roots), and forget
        the oldest ended ones."""
        now, spans = time.monotonic(), []
        with self._lock:
            for session in self._sessions.values():
                if not session.ended and now - session.seen >= idle_s:
                    session.ended = True
                    spans += session.trace.finish(harness=session.harness) if self.ends_roots else []
            ended = [sid for sid, session in self._sessions.items() if session.ended]
            for sid in ended[: max(0, len(ended) - KEPT_SESSIONS)]:
                del self._sessions[sid]
        self._put(spans)

    def _run(self) -> None:
        with urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=self.timeout)) as client:
            while True:
                stopping = self._stop.is_set()
                batch = self._take(0 if stopping else 1.0)
                if batch and not self._post(client, batch) and stopping:
                    self._count_dropped(len(self._take(0, everything=True)))  # no waiting out a dead collector
                    return
                if not batch and stopping:
                    return
                if not stopping:
                    self._end_sessions(self.idle_s)

    def _take(self, wait: float, everything: bool = False) -> list:
        """Up to a batch of spans: the first within `wait` s, then what else comes within `LINGER_S` (one POST
        for the spans of several calls: a POST costs the writer several times what building a call's spans
        does); with no `wait`, what is queued now (all of it: `everything`)."""
        batch = []
        try:
            batch.append(self._queue.get(timeout=wait) if wait else self._queue.get_nowait())
            until = time.monotonic() + (LINGER_S if wait else 0.0)
            while everything or len(batch) < BATCH_SPANS:
                left = until - time.monotonic()
                batch.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
        except queue.Empty:
            pass
        return batch

    def _post(self, client: urllib3.PoolManager, spans: list) -> bool:
        body = export_request(spans).SerializeToString()
        try:
            ok = 200 <= client.request("POST", self.url, body=body, headers=self.headers).status < 300
        except urllib3.exceptions.HTTPError:
            ok = False
        if ok:
            self.sent += len(spans)
        else:
            self._count_dropped(len(spans))
        return ok
