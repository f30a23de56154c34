"""The entry point of a rollout pod: the same workspace, sandbox and grading as the local runner, inside a pod.

    python -m forgerl.runners.pod     (configured by environment, set from the pod template)

FORGE_TASKS (task file/folder as mounted in the pod), FORGE_TASK_ID,
FORGE_ATTEMPT, FORGE_HARNESS, FORGE_RECORDER_URL, FORGE_SESSION_ID,
FORGE_DATASET (the dataset root the recorder writes, mounted read-only: the
transcript for grade() is built from it), FORGE_MODEL, FORGE_TIMEOUT_S,
FORGE_WORKDIR (default /work), FORGE_RESULT_PATH (default /dev/termination-log).

grade() runs here, in the pod, against the pod's workspace, once the
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

from forgerl.recorder.writer_process import RecorderFailure

from .grading import GradeInput
from .harnesses import RunContext, get_harness
from .local import PASSTHROUGH_ENV
from .rollout import InfraError, grade_session, prepare_workspace, verdict_of
from .sandbox import Sandbox
from .tasks import find_task

RESULT_PREFIX = "FORGE_RESULT "
RECORDER_FAILURE = "recorder_failure"  # the result status that stops the run
TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a termination message


def _fit(result: dict) -> str:
    """The result as JSON within the termination-message limit (the final answer is cut first)."""
    text = json.dumps(result, ensure_ascii=False)
    if len(text.encode()) > TERMINATION_LIMIT and result.get("final_answer"):
        result = {**result, "final_answer": None}
        text = json.dumps(result, ensure_ascii=False)
    return text


def run_pod(env: dict[str, str]) -> dict:
    task = find_task(Path(env["FORGE_TASKS"]), env["FORGE_TASK_ID"])
    harness = get_harness(env["FORGE_HARNESS"])
    work = Path(env.get("FORGE_WORKDIR", "/work"))
    workspace, home = work / "workspace", work / "home"
    home.mkdir(parents=True, exist_ok=True)
    session = env["FORGE_SESSION_ID"]
    try:
        prepare_workspace(task, workspace)
        layout = task.layout(work, workspace, in_image=True)  # a Harbor task, in its own image: its verifier
        cwd = Path(layout.workdir) if layout else workspace
        agent_s = float(env.get("FORGE_TIMEOUT_S") or task.timeout_s)
        # The pod isolates the network (NetworkPolicy); a layout's mount namespace comes with the jail's others.
        with Sandbox(work, env["FORGE_RECORDER_URL"], isolate_network=layout is not None) as sandbox:
            keys = {k: v for k, v in env.items() if k in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
            ctx = RunContext(task.prompt, cwd, home, sandbox.base_url, session, env.get("FORGE_MODEL", ""), keys,
                             mcp_servers=task.mcp_servers)
            argv, harness_env = harness.full_command(harness.find(), ctx)
            run_env = {k: env[k] for k in PASSTHROUGH_ENV if k in env} | harness_env
            try:
                sandbox.confine(argv, run_env, cwd, cpu_s=task.cpu_s, memory_mb=task.memory_mb, layout=layout,
                                harness_timeout_s=agent_s)
            except OSError as e:
                raise InfraError(f"sandbox failed to start: {e}") from None
            result = sandbox.run(layout.wall_clock_s(agent_s) if layout else agent_s)
        verdict = verdict_of(layout)
        final_answer = harness.final_answer(result.stdout, ctx)
        run = GradeInput(Path(env["FORGE_DATASET"]), session, workspace, final_answer, verdict=verdict)
        scores = grade_session(task, run, env["FORGE_RECORDER_URL"])
    except InfraError as e:
        return {"session": session, "status": "infra_error", "error": str(e)}
    except RecorderFailure as e:
        return {"session": session, "status": RECORDER_FAILURE, "error": str(e)}
    return {"session": session, "status": "graded", "scores": scores,
            "timed_out": verdict.agent_timed_out if verdict else result.timed_out,
            "returncode": result.returncode, "seconds": round(result.seconds, 3), "enforced": sandbox.enforced,
            "final_answer": final_answer, **(layout.outcome_notes(verdict) if layout else {})}


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
