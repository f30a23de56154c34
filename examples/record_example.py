"""Record the bundled example dataset: `.venv/bin/python examples/record_example.py analysis/example`.

Plays every scenario of tests/analysis_scenarios.py three times (sessions `<name>-a1..a3`)
with the SDK clients through the real recorder (in-process, over loopback)
against the scripted upstream (beside this script), adds graded outcomes the way a runner would,
and compacts the result into a few files small enough to keep in git.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the scenarios the analysis tests use

import analysis_scenarios as scenarios  # noqa: E402
from scripted_upstream import ScriptedUpstream  # noqa: E402

from forgerl.recorder.proxy import BackgroundRecorder, RecorderConfig  # noqa: E402
from forgerl.schema.maintenance import compact  # noqa: E402
from forgerl.schema.writer import DatasetWriter  # noqa: E402

ATTEMPTS = 3
# scenario -> (task, reward per attempt); None = infra_error (not an attempt).
GRADES: dict[str, tuple[str, tuple[float | None, ...]]] = {
    "cc-verify": ("fix-calc", (1.0, 1.0, 0.5)),
    "cc-recover2": ("make-test-pass", (0.5, 1.0, 1.0)),
    "cc-giveup-parallel": ("summarise", (0.0, 0.0, 0.25)),
    "cc-subagent": ("update-config", (1.0, 0.5, 1.0)),
    "cc-errors-out": ("list-files", (None, 0.0, 1.0)),
    "codex-patch": ("greet", (1.0, 1.0, 1.0)),
}


def record(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    rows = []
    with ScriptedUpstream(scenarios.script) as up:
        config = RecorderConfig.one_upstream(out, up.url)
        with BackgroundRecorder(config):
            for attempt in range(1, ATTEMPTS + 1):
                for s in scenarios.scenarios():
                    session = f"{s.session}-a{attempt}"
                    scenarios.play(s, f"{config.url}/s/{session}")
                    if s.session in GRADES:
                        task, rewards = GRADES[s.session]
                        reward = rewards[attempt - 1]
                        rows.append(scenarios.outcome(s, session, task, attempt, reward,
                                                      "infra_error" if reward is None else None))
    with DatasetWriter(out, source="runner") as w:
        for row in rows:
            w.add_outcome(row)
    compact(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="examples/record_example.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    record(args.out)
    print(f"recorded {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
