"""The README's MLflow screenshot: a Claude Code session with a subagent, exported live, in MLflow's trace view.

    .venv/bin/python examples/otel_mlflow_screenshot.py [OUT.png]   # default converters/otel-mlflow.png

Starts MLflow's tracking server (`.venv-mlflow`, `make test` builds it), records
the tests' scripted Claude Code session (the main agent delegates to a subagent
through the `Agent` tool) with `forge-record run --otlp`, and has headless
Chromium (Debian's `chromium`, `make browser`) take the trace's page.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

from convert_harness_fixtures import CLAUDE_FLAGS, CLAUDE_RUNS, claude_script  # noqa: E402
from mlflow_server import MlflowServer  # noqa: E402
from scripted_upstream import ScriptedUpstream  # noqa: E402

BIN = Path(sys.executable).parent


def main(out: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="otel-shot-") as tmp, MlflowServer(Path(tmp) / "mlflow") as mlflow:
        base = Path(tmp)
        experiment = mlflow.experiment("claude-code-subagent")
        for folder in ("work", "home"):
            (base / folder).mkdir()
        env = {**os.environ, "HOME": str(base / "home"), "ANTHROPIC_API_KEY": "sk-ant-api03-screenshotscreenshot",
               "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "OTEL_EXPORTER_OTLP_HEADERS": f"x-mlflow-experiment-id={experiment}"}
        with ScriptedUpstream(claude_script) as up:
            subprocess.run([str(BIN / "forge-record"), "run", "--out", str(base / "data"), "--session", "count-files",
                            "--upstream", up.url, "--otlp", mlflow.url, "--",
                            str(ROOT / "node_modules" / ".bin" / "claude"), *CLAUDE_RUNS[0], *CLAUDE_FLAGS],
                           cwd=base / "work", env=env, check=True, stdin=subprocess.DEVNULL)
        [trace] = mlflow.traces(experiment)
        page = f"{mlflow.url}/#/experiments/{experiment}/traces?selectedEvaluationId={trace['trace_id']}"
        for _ in range(2):  # the first visit shows MLflow's onboarding tips once (the profile remembers them)
            subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--user-data-dir={base / 'chromium'}", "--window-size=1500,900",
                            "--virtual-time-budget=20000", f"--screenshot={out.resolve()}", page],
                           check=True, capture_output=True)
    print(f"screenshot -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "converters" / "otel-mlflow.png"))
