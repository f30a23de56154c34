"""The recorder `forge-run` starts: `forge-record serve` as a process of its own, for one round.

With `--upstream` it forwards each call to the model API origin; with
`--policy` (serve mode) it renders each call with the policy's chat template,
asks the policy for token ids and answers in the harness's own API, recording
token ids and logprobs with every call. Either way it runs in its own
process, not on a thread of the runner: its event loop then never waits for
the GIL while the runner's threads set up, read and grade rollouts, so a
harness's model calls are not slowed by the rollouts around it, and the two
do not spend CPU handing the GIL back and forth (`bench/runner.py`). The
runner starts it on a free loopback port, knows it is up from its readiness
endpoint (`recorder/control.py`), and stops it afterwards.

Given a `secret` (`forge-run --hold-keys`) the recorder holds the model-API
keys (`recorder/credentials.py`): it starts with `--hold-keys`, the real keys
in its environment and the secret beside them, and `rollout_keys` registers
each rollout with it and gives the harness its token where the key goes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from forgerl.errors import UserError
from forgerl.harnesses import Harness, Key
from forgerl.recorder.control import RecorderControl
from forgerl.recorder.credentials import MAX_TTL_S, SECRET_ENV
from forgerl.recorder.proxy import free_port
from forgerl.recorder.writer_process import RecorderFailure

from .jail import die_with_parent

STOP_TIMEOUT_S = 30
READY_TIMEOUT_S = 120  # serve mode loads the tokenizer first
USAGE_STATUS = 2  # what every forge-* verb exits with on bad input (`forgerl.cli.run_verb`)
_PROG = re.compile(r"^forge-record( serve)?(: error)?: ")  # how it starts that line


def forge_record() -> str:
    beside = Path(sys.executable).with_name("forge-record")
    return str(beside) if beside.exists() else shutil.which("forge-record") or "forge-record"


def upstream_recorder(out: Path, upstream: str, policy_version: str = "", redact_rules: str = "",
                      secret: str = "") -> Iterator[str]:
    """`forge-record serve --upstream URL` (every API to one origin) for the duration; yields its URL."""
    return recorder_process(out, ["--upstream", upstream], policy_version, redact_rules, secret)


def policy_recorder(out: Path, policy: str, tokenizer: str, served_model: str,
                    policy_version: str = "", redact_rules: str = "", secret: str = "",
                    sampling: tuple[float, float, int] = (1.0, 1.0, 1024)) -> Iterator[str]:
    """`forge-record serve --policy ...` for the duration, sampling at (temperature, top-p) with at most max-tokens
    a turn; yields its URL."""
    temperature, top_p, max_tokens = sampling
    return recorder_process(out, ["--policy", policy, "--tokenizer", tokenizer, "--served-model", served_model,
                                  "--temperature", str(temperature), "--top-p", str(top_p),
                                  "--max-tokens", str(max_tokens)],
                            policy_version, redact_rules, secret)


@contextmanager
def recorder_process(out: Path, options: list[str], policy_version: str = "", redact_rules: str = "",
                     secret: str = "") -> Iterator[str]:
    """`forge-record serve OPTIONS` on a free loopback port, writing `out`, until the block ends; yields its URL.
    `redact_rules`: a file of extra redaction regexes (`--redact-rules`). `secret`: it holds the keys
    (`--hold-keys`, the secret in its environment); its control endpoints want the secret.

    Bad input it reports (exit status 2) is a `UserError` with its message; any other failure to start a
    RuntimeError with its last log line.
    """
    port = free_port()
    cmd = [forge_record(), "serve", *options, "--listen", f"127.0.0.1:{port}", "--out", str(out)]
    if policy_version:
        cmd += ["--policy-version", policy_version]
    if redact_rules:
        cmd += ["--redact-rules", redact_rules]
    if secret:
        cmd += ["--hold-keys"]
    env = {**os.environ, SECRET_ENV: secret} if secret else None  # the model-API keys are in os.environ
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=_ends_with_this_thread)
    log: deque[str] = deque(maxlen=20)
    drain = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)  # keep draining its log
    drain.start()
    url = f"http://127.0.0.1:{port}"
    try:
        RecorderControl(url, secret=secret).wait_ready(READY_TIMEOUT_S, alive=lambda: proc.poll() is None)
    except (RuntimeError, RecorderFailure) as e:  # exited, never ready, or ready but not recording
        proc.kill()
        status = proc.wait()
        drain.join()
        said = log[-1].strip() if log else str(e)
        if status == USAGE_STATUS:
            raise UserError(_PROG.sub("", said)) from None
        raise RuntimeError(f"forge-record serve {options[0]} did not start: {said}") from None
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ends_with_this_thread() -> None:
    """In the recorder's process before exec: SIGTERM once the thread that started it is gone, so a runner killed
    outright (kill -9) does not leave its recorder listening; it still writes what it holds before it exits."""
    die_with_parent(signal.SIGTERM)


@contextmanager
def rollout_keys(harness: Harness, recorder_url: str, secret: str, session: str, ttl_s: float) -> Iterator[dict]:
    """The environment that gives a rollout's harness its key: with a `secret` (a recorder holding the keys), a
    token for `session` in the harness's key variable, valid `ttl_s` (capped at a day) and revoked when the block
    ends (after the rollout's final flush barrier); without one, nothing (the harness's key is the user's)."""
    if not secret or not isinstance(harness.key, Key):
        yield {}
        return
    control = RecorderControl(recorder_url, secret=secret)
    token = control.register(session, min(int(ttl_s), MAX_TTL_S))
    try:
        yield {harness.key.env: token}
    finally:
        control.close(session)
