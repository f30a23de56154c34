"""The recorder's writer process: redaction, parsing and Parquet writes, away from the proxy.

mitmproxy runs its event loop on one thread. Recording work on other threads
of the same process competes with that loop for the GIL, which under load
shows up as added time-to-first-token and lost throughput. So the proxy
process only taps bytes (`CapturedCall.tap`), and a `WriterClient` thread
hands each call to this child process in batches, 20 times a second:

- *start* when the call's request is in,
- *progress* for open calls four times a second, so a crash keeps their
  partial bytes,
- *finish* with the rest of the response, the times and the error,
- *flush* for a session (`WriterClient.flush`): the per-session barrier the
  runner grades after (`control.py`).

The child owns the `DatasetWriter`. It redacts before anything is written,
flushes at least every half second, and snapshots open calls to
`_inflight/`, so a call finished more than a second before any crash is on
disk. It also owns the flush clock (`Flusher`), so that a failed write is
seen: the child reports it on its stdout (one JSON line per event, after the
`ready` line: `{"flushed": token, "calls": n}` or `{"failed": why}`) and
exits non-zero, and the proxy stops forwarding rather than pass on calls it
cannot record.

No call is dropped silently. One that cannot be recorded whole (building its
rows raised, or a codec did: `capture.CodecBug`) is a *call failure*: its
traceback goes to the log (stderr, redacted), what is left of it is stored
(its raw bytes and times, where even that works), and its session's flush
barriers fail (`"call_failures": [why, ...]` beside `"calls"`; `CallsFailed`),
so the runner retries the rollout as an infra error instead of grading a
transcript with a hole. The child ends with `{"call_failures": n}` and exits 1
if n > 0; `forge-record` prints the count and exits non-zero too.

Lifetime: the child reads its stdin until EOF. The proxy closes that pipe on a
clean stop. If the proxy dies, even by kill -9, the kernel closes it. Either
way the child writes everything it holds (open calls as incomplete) and
exits, so it never outlives the proxy by more than that last flush. It runs in
a session of its own, so a Ctrl-C or a signal to the proxy's process group
cannot stop it before the proxy has handed over its last calls.

    python -m forgerl.recorder.writer_process DATASET_ROOT   # started by WriterClient
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import BinaryIO, Iterator

from forgerl.errors import UserError

from .capture import BUG, CapturedCall, CodecBug

_HEADER = struct.Struct(">Q")
READY = b"ready"
PIPE_SIZE = 1 << 20
FLUSH_INTERVAL_S = 0.5
FAILURES_LISTED = 5  # a barrier names this many of its session's failed calls, then counts the rest


class RecorderFailure(UserError, OSError):
    """Calls can no longer be recorded (the writer process died, a write failed): stop, never forward unrecorded.

    Not a bug in forgerl but a failing machine (a killed process, a full disk): the verbs say it in one line
    and exit non-zero. A serve that fails mid-run keeps the dataset it made (`proxy.serve`).
    """


class CallsFailed(RuntimeError):
    """Calls of a session could not be recorded whole (a bug, logged with its traceback): its flush barrier says
    which and why, and a rollout on it is an infra error rather than graded on what was recorded."""

    @classmethod
    def of(cls, session: str, failures: list[str]) -> CallsFailed:
        listed = "; ".join(failures[:FAILURES_LISTED])
        more = f" (and {len(failures) - FAILURES_LISTED} more)" if len(failures) > FAILURES_LISTED else ""
        return cls(f"{len(failures)} call{'s' if len(failures) != 1 else ''} of session {session!r} could not be "
                   f"recorded whole (the recorder's log has the tracebacks): {listed}{more}")


def _write_frame(pipe: BinaryIO, batch: list) -> None:
    data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_HEADER.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _read_frames(pipe: BinaryIO) -> Iterator[list]:
    """Batches until EOF; a frame cut short by the sender's death ends the stream."""
    while True:
        header = pipe.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(header)
        data = pipe.read(size)
        if len(data) < size:
            return
        yield pickle.loads(data)


# ------------------------------------------------------------------ proxy side


class WriterClient:
    """The proxy's end: starts the writer process and ships calls to it from one thread.

    `open`, `finish`, `configure` and `flush` only append to a deque, so
    mitmproxy's hooks stay cheap; the thread does the serialising and the pipe
    writes. Another thread reads the child's answers: flush acknowledgements,
    or a failure. Once the child fails or dies, `failure` says why and
    `on_failure` is called once (from that thread). After `close`,
    `call_failures` is how many calls the child could not record whole.
    """

    def __init__(self, root: str | os.PathLike, *, tick: float = 0.05, progress_every: float = 0.25,
                 on_failure: Callable[[str], None] | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "forgerl.recorder.writer_process", str(root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        line = self.proc.stdout.readline().strip()
        if line != READY:
            self.proc.stdout.close()
            self.proc.stdin.close()
            self.proc.wait()
            if line.startswith(b"error: "):  # the root it was given cannot be opened: the user's to fix
                raise UserError(line.decode(errors="replace").removeprefix("error: "))
            raise RuntimeError(f"forgerl writer process exited with status {self.proc.returncode} (its traceback "
                               "is above)")
        try:  # room for a burst in the kernel, where it survives our death, rather than in our memory
            fcntl.fcntl(self.proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: the default size still works
        self.tick, self.progress_every = tick, progress_every
        self.failure: str | None = None
        self.call_failures = 0
        self._on_failure = on_failure
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self._acks: dict[int, tuple[Future, str]] = {}
        self._ack_lock = threading.Lock()
        self._events: deque[tuple[str, CapturedCall | None, object]] = deque()
        self._open: dict[str, tuple[CapturedCall, int, dict]] = {}  # the sender thread's alone
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="forgerl-writer-client", daemon=True)
        self._thread.start()
        self._reader = threading.Thread(target=self._listen, name="forgerl-writer-acks", daemon=True)
        self._reader.start()

    def next_seq(self) -> int:
        return next(self._seq)

    def configure(self, **settings: str) -> None:
        """Settings the writer process applies to calls from now on (`redact_rules`, `labels`, `images`)."""
        self._events.append(("config", None, settings))

    def open(self, call: CapturedCall) -> None:
        """The call's request is in: from now on a crash leaves it recoverable."""
        self._events.append(("open", call, None))

    def finish(self, call: CapturedCall, user_agent: str) -> None:
        """The call is over (`call.finish` was called); record it."""
        self._events.append(("finish", call, user_agent))

    def flush(self, session: str, now: bool = False) -> Future:
        """Make every call of `session` handed over so far durable; the future gets how many there are.

        The writer flushes on its clock, or at once with `now` (`Flusher.request`). It fails with
        `RecorderFailure` if the writer process fails first, and with `CallsFailed` if a call of `session`
        could not be recorded whole.
        """
        future: Future = Future()
        token = next(self._tokens)
        with self._ack_lock:
            if self.failure is not None:
                future.set_exception(RecorderFailure(self.failure))
                return future
            self._acks[token] = (future, session)
        self._events.append(("flush", None, (token, session, now)))
        self._wake.set()  # not a tick later: the runner is waiting
        return future

    def close(self, timeout: float = 60) -> None:
        """Hand over everything, then let the writer process write it and exit."""
        self._closing = True
        self._stop.set()
        self._wake.set()
        self._thread.join()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print("forgerl: writer process did not finish in time; its open calls stay recoverable", flush=True)
            self.proc.kill()
            self.proc.wait()
        self._reader.join()

    def _fail(self, why: str) -> None:
        """From here on nothing is recorded: fail every waiting flush and tell the proxy, once."""
        with self._ack_lock:
            if self.failure is not None:
                return
            self.failure = why
            waiting, self._acks = self._acks, {}
        print(f"forgerl: {why}; calls are no longer recorded", flush=True)
        for future, _ in waiting.values():
            future.set_exception(RecorderFailure(why))
        if self._on_failure is not None:
            self._on_failure(why)

    def _listen(self) -> None:
        """The child's answers, until it exits; an exit we did not ask for is a failure."""
        for line in self.proc.stdout:
            answer = json.loads(line)
            if "failed" in answer:
                self._fail(f"writer process failed: {answer['failed']}")
                continue
            if "flushed" not in answer:  # its last line, as it exits
                self.call_failures = answer["call_failures"]
                continue
            with self._ack_lock:
                future, session = self._acks.pop(answer["flushed"], (None, ""))
            if future is None:
                continue
            if answer.get("call_failures"):
                future.set_exception(CallsFailed.of(session, answer["call_failures"]))
            else:
                future.set_result(answer["calls"])
        self.proc.stdout.close()
        if not self._closing:
            self._fail(self._exit_reason())

    def _exit_reason(self) -> str:
        try:
            return f"writer process exited with status {self.proc.wait(5)}"
        except subprocess.TimeoutExpired:
            return "writer process stopped reading"

    def _run(self) -> None:
        next_progress = 0.0
        while True:
            self._wake.wait(self.tick)
            self._wake.clear()
            stopping = self._stop.is_set()
            now = time.monotonic()
            progress = stopping or now >= next_progress
            if progress:
                next_progress = now + self.progress_every
            batch = self._batch(progress)
            if batch and self.failure is None:
                try:
                    _write_frame(self.proc.stdin, batch)
                except (OSError, ValueError):  # its end of the pipe is closed: it is gone
                    self._fail(self._exit_reason())
            if stopping:
                return

    def _batch(self, progress: bool) -> list:
        batch: list = []
        while self._events:
            kind, call, extra = self._events.popleft()
            if call is None:  # config settings, or a flush's (token, session)
                batch.append((kind, extra) if kind == "config" else (kind, *extra))
                continue
            if call.call_id not in self._open:
                batch.append(("start", call.start_fields()))
                self._open[call.call_id] = (call, 0, {})
            if kind == "finish":
                _, sent, _ = self._open.pop(call.call_id)
                batch.append(("finish", call.call_id, call.state(), b"".join(call.chunks[sent:]), extra))
        if progress:
            for call_id, (call, sent, last) in self._open.items():
                n, state = len(call.chunks), call.state()
                if n > sent or state != last:
                    batch.append(("progress", call_id, state, b"".join(call.chunks[sent:n])))
                    self._open[call_id] = (call, n, state)
        return batch


# ------------------------------------------------------------------ writer side


class Flusher:
    """The writer process's flush clock: every `interval`, the file writes and open calls' snapshots together.

    A barrier (`request`) is acknowledged after the clock's next flush that
    starts after it returned (at most `interval` later), so the calls counted
    for it are on disk (each file fsynced, then renamed). Only a barrier asked
    `now` brings a flush forward: each flush writes a file per table whatever
    it holds, so a flush per barrier made the writer's work grow with the
    rollouts graded (about a rollout's 1 % of CPU at 4 harnesses on 2 cores),
    while on the clock the barriers of many rollouts share one. A runner
    grades off its harness's slot, so the wait costs a rollout latency, not
    throughput, while its other harnesses keep the machine busy; once a
    harness slot is free (a batch's last rollouts) it asks `now`, since then
    the machine would wait out the clock idle. A failed flush is final: the
    rows it held are lost, so it is reported and the process exits non-zero,
    and the proxy stops forwarding.
    """

    def __init__(self, writer, channel: BinaryIO, interval: float = FLUSH_INTERVAL_S):
        self.writer, self.channel, self.interval = writer, channel, interval
        self._pending: list[tuple[int, int, list[str]]] = []
        self._wake = threading.Condition()
        self._stop = self._now = False
        self._thread = threading.Thread(target=self._run, name="forgerl-flusher", daemon=True)
        self._thread.start()

    def request(self, token: int, calls: int, now: bool = False, failures: list[str] | None = None) -> None:
        """Acknowledge `token` with `calls` (and the session's call `failures`, if any) once everything added so far
        is on disk: after the clock's next flush, or one started at once (`now`)."""
        with self._wake:
            self._pending.append((token, calls, failures or []))
            if now:
                self._now = True
                self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._stop or self._now, self.interval)
                pending, self._pending = self._pending, []
                stopping, self._now = self._stop, False
            try:
                self.writer.flush()
            except Exception as e:
                traceback.print_exc()
                self.send({"failed": f"flush failed: {type(e).__name__}: {e}"})
                os._exit(3)  # rows are lost: no clean close that would pretend otherwise
            for token, calls, failures in pending:
                self.send({"flushed": token, "calls": calls, **({"call_failures": failures} if failures else {})})
            if stopping:
                return

    def send(self, answer: dict) -> None:
        """One answer to the proxy (the clock's thread, and the process's last line once the clock has stopped)."""
        try:
            self.channel.write(json.dumps(answer).encode() + b"\n")
            self.channel.flush()
        except OSError:
            pass  # the proxy is gone; stdin's EOF ends this process


class CallSink:
    """Rebuilds calls from messages and records them; runs in the writer process.

    `recorded` counts each session's calls handed to the writer, which a
    flush barrier (`barrier(token, calls, now, failures)`) reports once they
    are on disk, with `failures`, why each of the session's calls that could
    not be recorded whole was not; `failed` counts those of every session.
    """

    def __init__(self, writer, barrier: Callable[[int, int, bool, list[str]], None], exporter=None) -> None:
        from .redact import Redactor

        self.writer = writer
        self.exporter = exporter  # `otlp.OtlpExporter` (`--otlp URL`): gets each call row as written
        self.barrier = barrier
        self.redactor = Redactor()
        self.images = "keep"  # forge-record --images
        self.labels: dict | None = None
        self.calls: dict[str, CapturedCall] = {}
        self.recorded: Counter[str] = Counter()
        self.failures: dict[str, list[str]] = {}
        self.failed = 0

    def handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "config":
            self._configure(message[1])
        elif kind == "start":
            call = CapturedCall(**message[1])
            self.calls[call.call_id] = call
            self.writer.track(call.call_id, lambda full: call.to_record(self.redactor, full, self.images))
        elif kind == "progress":
            _, call_id, state, data = message
            self.calls[call_id].update(state, data)
        elif kind == "finish":
            _, call_id, state, data, user_agent = message
            call = self.calls.pop(call_id)
            call.update(state, data)
            self._record(call, user_agent)
        elif kind == "flush":
            _, token, session, now = message
            self.barrier(token, self.recorded[session], now, list(self.failures.get(session, ())))
        else:
            raise ValueError(f"unknown message {kind!r}")

    def _configure(self, settings: dict) -> None:
        from .redact import Redactor

        if "redact_rules" in settings:
            rules = settings["redact_rules"]
            self.redactor = Redactor.from_file(rules) if rules else Redactor()
        if "labels" in settings:
            self.labels = json.loads(settings["labels"]) if settings["labels"] else None
        if "images" in settings:
            self.images = settings["images"]

    def close(self) -> None:
        """Record the calls still open as they are (incomplete), through the same checks as finished ones."""
        for call in list(self.calls.values()):
            self._record(call, dict((k.lower(), v) for k, v in call.request_headers).get("user-agent", ""))
        self.calls.clear()

    def _record(self, call: CapturedCall, user_agent: str) -> None:
        from .harness import identify

        bug: CodecBug | None = None
        try:
            try:
                record = call.to_record(self.redactor, images=self.images)
            except CodecBug as e:  # what was read is stored; the bug is reported below
                record, bug = e.record, e
            hid = identify(record.request_headers or {}, record.exchange)
            self.writer.add_session(call.session_id, harness=hid.name, harness_rank=hid.rank,
                                    harness_evidence=hid.evidence, user_agent=user_agent, labels=self.labels)
            row = self.writer.add_call(record)
        except Exception as e:  # never let one odd call stop the recorder, nor pass unseen
            why = self.redactor.text(f"{BUG}: recording it raised {type(e).__name__}: {e}")
            self.fail(call, e, why, kept=self._keep_raw(call, why, user_agent))
            return
        self.recorded[call.session_id] += 1
        if bug is not None:
            self.fail(call, bug, str(bug), kept=True)
        if self.exporter is not None:
            self.exporter.call(row, record, hid.name)

    def _keep_raw(self, call: CapturedCall, why: str, user_agent: str) -> bool:
        """After a failure, store what the in-flight snapshot would: raw bytes and times, `why` as the error."""
        try:
            record = call.to_record(self.redactor, full=False, images=self.images)
            record.error = why
            self.writer.add_session(call.session_id, user_agent=user_agent, labels=self.labels)
            self.writer.add_call(record)
        except Exception as e:
            self.writer.untrack(call.call_id)
            self.log(f"forgerl: could not keep call {call.call_id} raw either", e)
            return False
        self.recorded[call.session_id] += 1
        return True

    def fail(self, call: CapturedCall | None, error: BaseException, why: str, kept: bool = False) -> None:
        """Count a call not recorded whole (`None`: a message that named no call we know), log it with its
        traceback, and have its session's barriers report `why`."""
        self.failed += 1
        if call is None:
            self.log(f"forgerl: {why}", error)
            return
        what = f"call {call.call_id} (seq {call.seq}): {why}; " + ("its raw bytes are kept" if kept else "it is lost")
        self.failures.setdefault(call.session_id, []).append(what)
        self.log(f"forgerl: session {call.session_id!r}: {what}", error)

    def log(self, line: str, error: BaseException) -> None:
        """A line and the traceback of `error` on stderr, the recorder's log, masked like every stored body."""
        text = "".join(traceback.format_exception(error))
        print(f"{line}\n{self.redactor.text(text)}", file=sys.stderr, end="", flush=True)


def main(argv: list[str] | None = None) -> int:
    from forgerl.schema.writer import DatasetWriter

    from .otlp import OtlpExporter

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m forgerl.recorder.writer_process DATASET_ROOT", file=sys.stderr)
        return 2
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed from here on is a log line, never the handshake
    try:
        # The Flusher owns the flush clock: the writer's own thread would only log a failed flush.
        writer = DatasetWriter(args[0], flush_interval=None)
    except (UserError, OSError) as e:  # bad root, newer schema: the proxy shows this line and stops (a bug: its
        channel.write(f"error: {e}\n".encode())  # traceback on stderr, and no line)
        channel.close()
        return 2
    channel.write(READY + b"\n")
    channel.flush()
    flusher = Flusher(writer, channel)
    sink = CallSink(writer, flusher.request, OtlpExporter.from_env())
    try:
        for batch in _read_frames(sys.stdin.buffer):
            for message in batch:
                try:
                    sink.handle(message)
                except Exception as e:  # one bad message must not lose the others; `_record` handles calls' own
                    sink.fail(None, e, f"{BUG}: the writer process could not handle a {message[0]!r} message")
    finally:
        sink.close()
        flusher.stop()
        writer.close()
        if sink.exporter is not None:
            sink.exporter.close()
    flusher.send({"call_failures": sink.failed})
    return 1 if sink.failed else 0


if __name__ == "__main__":
    sys.exit(main())
