"""Shared fixtures: a scripted upstream, `forge-record serve` as a real process, dataset polling, a real S3 server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.compute as pc
import pytest

from forgerl.recorder.control import RecorderControl
from forgerl.recorder.proxy import free_port
from forgerl.schema import files, store

REPO = Path(__file__).resolve().parent.parent
# The scripted model server is the demo's (examples/scripted_upstream.py); tests and the modules beside
# them import it as `scripted_upstream`.
sys.path.insert(0, str(REPO / "examples"))
FORGE_RECORD = shutil.which("forge-record") or str(Path(sys.executable).with_name("forge-record"))


class RecorderProcess:
    """`forge-record serve` in a subprocess: the real CLI, killable with -9."""

    def __init__(self, out: Path, upstream: str | None, *extra: str, env: dict[str, str] | None = None,
                 secret: str = ""):
        self.out = out
        self.secret = secret  # the control endpoints' (--hold-keys)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [FORGE_RECORD, "serve", *(["--upstream", upstream] if upstream else []),
                     "--listen", f"127.0.0.1:{self.port}", "--out", str(out), *extra]
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> RecorderProcess:
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            RecorderControl(self.url, secret=self.secret).wait_ready(60, alive=lambda: self.proc.poll() is None)
        except RuntimeError:
            self.proc.kill()
            raise RuntimeError(f"forge-record serve did not start: {self.proc.stdout.read()}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        return self.proc.stdout.read() if self.proc else ""

    def base(self, session: str) -> str:
        return f"{self.url}/s/{session}"


def session_calls(root: Path, session: str, n: int, timeout: float = 10.0) -> list[dict]:
    """Poll the dataset until `session` has at least `n` calls (the writer flushes every 0.5 s)."""
    deadline = time.time() + timeout
    rows: list[dict] = []
    while time.time() < deadline:
        if (root / files.MANIFEST).exists():
            calls = store.read_table(root, "calls")
            rows = calls.filter(pc.equal(calls.column("session_id"), session)).to_pylist()
            if len(rows) >= n:
                return sorted(rows, key=lambda r: (r["t_start"], r["seq"]))
        time.sleep(0.1)
    raise AssertionError(f"session {session}: {len(rows)} calls recorded, expected {n}")


def session_parts(root: Path, session: str) -> dict[str, str]:
    parts = store.read_table(root, "messages")
    parts = parts.filter(pc.equal(parts.column("session_id"), session))
    return dict(zip(parts.column("part_hash").to_pylist(), parts.column("part").to_pylist()))


@pytest.fixture
def scripted():
    """Factory for scripted upstreams, stopped after the test."""
    from scripted_upstream import ScriptedUpstream
    started = []

    def make(script=None, **kwargs):
        up = ScriptedUpstream(script, **kwargs).start()
        started.append(up)
        return up

    yield make
    for up in started:
        up.stop()


@pytest.fixture
def recorder(tmp_path):
    """Factory: `recorder(upstream_url, *extra_args)` -> a started RecorderProcess."""
    started = []

    def make(upstream: str, *extra: str, out: Path | None = None) -> RecorderProcess:
        rec = RecorderProcess(out or tmp_path / "data", upstream, *extra).start()
        started.append(rec)
        return rec

    yield make
    for rec in started:
        rec.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """SeaweedFS's S3 server on loopback (`s3_server.py`), one for the whole run."""
    import s3_server as seaweed
    server = seaweed.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def s3_root(s3_server, monkeypatch) -> str:
    """A fresh `s3://` dataset root on the test server, with the standard AWS variables set to reach it."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}/data"


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
