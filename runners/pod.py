"""The entry point of a rollout pod: the same workspace, sandbox and grading as the local runner, inside a pod.

    python -m forgerl.runners.pod     (configured by environment, set from the pod template)

FORGE_TASKS (task file/folder as mounted in the pod), FORGE_TASK_ID,
FORGE_ATTEMPT, FORGE_HARNESS, FORGE_RECORDER_URL, FORGE_SESSION_ID,
FORGE_DATASET (the dataset root the recorder writes, mounted read-only: the
transcript for grade() is built from it), FORGE_MODEL, FORGE_TIMEOUT_S,
FORGE_WORKDIR (default /work), FORGE_RESULT_PATH (default /dev/termination-log),
FORGE_JUDGE_URL and FORGE_JUDGE_MODEL (`forge-run --judge`),
FORGE_USER_MODEL_URL and FORGE_USER_MODEL_NAME (`forge-run --user-model`, for
a task with a persona: its dialogue is held here). The harness's key variable
(ANTHROPIC_API_KEY, OPENAI_API_KEY, ...) holds the rollout's capability token,
set by the runner (forge-run's default), which the pod also presents at its
session's flush barrier; with `forge-run --pass-keys` it holds the real key,
from the pod template's Secret. The judge's and the user model's keys are
not in this container: FORGE_JUDGE_URL and FORGE_USER_MODEL_URL are loopback
URLs of the pod's `model-keys` sidecar, which holds the keys and adds them
(`model_keys.py`; deploy/README.md).

The rollout itself is `attempt.run_attempt`, as on the local runner: a task's
services start in the jail's own namespaces inside the pod, a Harbor task's
verifier runs after the agent, and grade() runs here, in the pod, against the pod's workspace, once the
recorder acknowledges the session's calls on disk. The result (scores, an
infra error, or a recorder failure, which stops the whole run) is written as
JSON to the termination message (what the runner reads) and printed as the
last log line after `FORGE_RESULT `. The exit status is 0 whenever a result
was written, so a non-zero exit or a pod without a result means the pod
itself failed (an infra failure).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from forgerl.harnesses import Key, get_harness
from forgerl.recorder.credentials import PREFIX
from forgerl.recorder.writer_process import RecorderFailure

from .attempt import AttemptConfig, inherited, run_attempt
from .grading import Judge
from .rollout import InfraError
from .simulated_user import UserModel
from .loader import find_task

RESULT_PREFIX = "FORGE_RESULT "
RECORDER_FAILURE = "recorder_failure"  # the result status that stops the run
RESULT_KEYS = ("session", "status", "scores", "timed_out", "error")  # the rest of a result: the outcome's extra
TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a termination message
NOTES_CUT = "notes_cut"  # in a termination message that had to leave out the outcome's notes


def _fit(result: dict) -> str:
    """The result as JSON within the termination-message limit: the final answer is cut first, then the rest of
    the outcome's notes (`NOTES_CUT`: the runner reads them from the `FORGE_RESULT` log line)."""
    text = json.dumps(result, ensure_ascii=False)
    for keep in (lambda k: k != "final_answer", lambda k: k in (*RESULT_KEYS, "returncode")):
        if len(text.encode()) <= TERMINATION_LIMIT:
            break
        result = {k: v for k, v in result.items() if keep(k)} | {NOTES_CUT: True}
        text = json.dumps(result, ensure_ascii=False)
    return text


def logged_result(logs: str | None, session: str) -> dict | None:
    """The whole result from the pod's `FORGE_RESULT` log line, if the log holds this session's."""
    for line in reversed((logs or "").splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX):])
            except json.JSONDecodeError:
                return None
            return result if isinstance(result, dict) and result.get("session") == session else None
    return None


def pod_config(env: dict[str, str]) -> AttemptConfig:
    """The attempt's configuration from the pod's environment (set by `KubernetesRunner.pod_manifest`)."""
    harness = get_harness(env["FORGE_HARNESS"])
    judge = Judge(env["FORGE_JUDGE_URL"], env["FORGE_JUDGE_MODEL"]) if env.get("FORGE_JUDGE_URL") else None
    user = (UserModel(env["FORGE_USER_MODEL_URL"], env["FORGE_USER_MODEL_NAME"])
            if env.get("FORGE_USER_MODEL_URL") else None)
    keys = {harness.key.env: env[harness.key.env]} if isinstance(harness.key, Key) and env.get(harness.key.env) else {}
    token = next((v for v in keys.values() if v.startswith(PREFIX)), "")  # opens this session's flush barrier
    return AttemptConfig(harness, harness.find(), env["FORGE_RECORDER_URL"], Path(env["FORGE_DATASET"]),
                         model=env.get("FORGE_MODEL", ""), keys=keys,
                         base_env=inherited(env), timeout_s=float(env.get("FORGE_TIMEOUT_S") or 0) or None,
                         judge=judge, in_pod=True, user=user, recorder_secret=token)


def run_pod(env: dict[str, str]) -> dict:
    task = find_task(Path(env["FORGE_TASKS"]), env["FORGE_TASK_ID"])
    session = env["FORGE_SESSION_ID"]
    try:
        done = run_attempt(pod_config(env), task, session, Path(env.get("FORGE_WORKDIR", "/work")))
    except InfraError as e:
        return {"session": session, "status": "infra_error", "error": str(e)}
    except RecorderFailure as e:
        return {"session": session, "status": RECORDER_FAILURE, "error": str(e)}
    return {"session": session, "status": "graded", "scores": done.scores, "timed_out": done.timed_out,
            **done.extra()}


def main() -> int:
    # The kubelet stops a deleted or expired pod with SIGTERM: leave through the sandbox's clean-up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    result = run_pod(dict(os.environ))
    text = _fit(result)
    Path(os.environ.get("FORGE_RESULT_PATH", "/dev/termination-log")).write_text(text)
    print(RESULT_PREFIX + json.dumps(result, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
