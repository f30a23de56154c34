"""`forge-run --policy`: harnesses answered by a policy through `forge-record serve --policy` (serve mode).

The recorder's serve mode renders each call with the policy's chat template,
asks the policy for token ids and answers in the harness's own API, recording
token ids and logprobs with every call. The runner starts it as its own
process on a free loopback port for a round, knows it is up from its
readiness endpoint (`recorder/control.py`), and stops it afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from forgerl.recorder.control import RecorderControl
from forgerl.recorder.proxy import free_port
from forgerl.recorder.writer_process import RecorderFailure

STOP_TIMEOUT_S = 30
READY_TIMEOUT_S = 120  # loading the tokenizer comes first


def forge_record() -> str:
    beside = Path(sys.executable).with_name("forge-record")
    return str(beside) if beside.exists() else shutil.which("forge-record") or "forge-record"


@contextmanager
def policy_recorder(out: Path, policy: str, tokenizer: str, served_model: str,
                    policy_version: str = "") -> Iterator[str]:
    """`forge-record serve --policy ...` for the duration; yields its URL."""
    port = free_port()
    cmd = [forge_record(), "serve", "--policy", policy, "--tokenizer", tokenizer, "--served-model", served_model,
           "--listen", f"127.0.0.1:{port}", "--out", str(out)]
    if policy_version:
        cmd += ["--policy-version", policy_version]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: deque[str] = deque(maxlen=20)
    drain = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)  # keep draining its log
    drain.start()
    url = f"http://127.0.0.1:{port}"
    try:
        RecorderControl(url).wait_ready(READY_TIMEOUT_S, alive=lambda: proc.poll() is None)
    except (RuntimeError, RecorderFailure) as e:  # exited, never ready, or ready but not recording
        proc.kill()
        proc.wait()
        drain.join()
        raise RuntimeError(f"forge-record serve --policy did not start: {log[-1].strip() if log else e}") from None
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
