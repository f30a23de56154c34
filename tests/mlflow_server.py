"""MLflow's tracking server (PyPI `mlflow`, in `.venv-mlflow`: its pins are not ours; `make test` builds it from
requirements-mlflow.lock) as the OTLP receiver the export tests send to, and its own client reading traces back.

The server keeps a SQLite store and takes OTLP/HTTP at `/v1/traces` (protobuf
or JSON), filing each trace under the experiment its `x-mlflow-experiment-id`
header names. `traces` runs MLflow's `MlflowClient.search_traces` in that venv
and returns what it read as plain JSON.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import BinaryIO

import pytest

from conftest import REPO
from forgerl.recorder.proxy import free_port

PYTHON = REPO / ".venv-mlflow" / "bin" / "python"
READ = """
import json, sys
from mlflow import MlflowClient
out = []
for t in MlflowClient(sys.argv[1]).search_traces(locations=[sys.argv[2]], max_results=500):
    out.append({"trace_id": t.info.trace_id, "state": str(t.info.state), "token_usage": t.info.token_usage,
                "spans": [{"name": s.name, "span_id": s.span_id, "parent_id": s.parent_id, "type": s.span_type,
                           "start_ns": s.start_time_ns, "end_ns": s.end_time_ns,
                           "attributes": {k: v for k, v in s.attributes.items() if not k.startswith("mlflow.")}}
                          for s in t.data.spans]})
print(json.dumps(out, default=str))
"""


class MlflowServer:
    """`mlflow server` on a free loopback port with a SQLite store under `root`; a context manager."""

    def __init__(self, root: Path) -> None:
        if not PYTHON.exists():
            pytest.fail(f"{PYTHON} missing: run `make test` (it builds .venv-mlflow from requirements-mlflow.lock)")
        self.root = root
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen | None = None
        self.log: BinaryIO | None = None

    def __enter__(self) -> MlflowServer:
        port = self.url.rsplit(":", 1)[1]
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = open(self.root / "server.log", "wb")
        self.proc = subprocess.Popen([str(PYTHON), "-m", "mlflow", "server", "--backend-store-uri",
                                      f"sqlite:///{self.root / 'mlflow.db'}", "--default-artifact-root",
                                      str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", port,
                                      "--workers", "1"], cwd=self.root, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2).read()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"mlflow server did not start:\n{(self.root / 'server.log').read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        if self.log is not None:
            self.log.close()

    def experiment(self, name: str) -> str:
        """A new experiment's id (MLflow's REST API)."""
        request = urllib.request.Request(f"{self.url}/api/2.0/mlflow/experiments/create",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, timeout=30).read())["experiment_id"]

    def post_json(self, line: str, experiment: str) -> int:
        """One OTLP/JSON request (a `forge-convert --to otel` line) to `/v1/traces`; the HTTP status."""
        request = urllib.request.Request(f"{self.url}/v1/traces", data=line.encode(), headers={
            "Content-Type": "application/json", "x-mlflow-experiment-id": experiment})
        return urllib.request.urlopen(request, timeout=30).status

    def traces(self, experiment: str) -> list[dict]:
        """Every trace of the experiment, read back through MLflow's own client."""
        done = subprocess.run([str(PYTHON), "-c", READ, self.url, experiment], capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)
