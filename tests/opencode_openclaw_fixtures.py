"""What the OpenCode and OpenClaw end-to-end tests share beyond tests/harness_checks.py: the tool loop's answer
and the check of `forge-run --policy script:` of task_00043."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convert_fixtures import TOKENIZER_DIR
from harness_checks import forge_run
from runner_fixtures import NOVEL_ANSWER, NOVEL_SCORE, NOVEL_TASK

ANSWER = "proof.txt says: forgerl"


def check_policy_task(harness: str, folder: Path) -> None:
    """`forge-run --policy script:` of task_00043 (graded on the answer text, 3 of 8 checks) with the harness's
    default model: graded so, with the policy's answer as the final answer, from one recorded policy call."""
    script = folder / "turns.json"
    script.write_text(json.dumps([NOVEL_ANSWER]))
    row, _, calls = forge_run(NOVEL_TASK, harness, folder / "data", "--policy", f"script:{script}", "--tokenizer",
                              str(TOKENIZER_DIR), "--served-model", "qwen3-policy")
    calls = [c for c in calls if c["session_id"] == row["session_id"]]
    assert row["reward"] == pytest.approx(NOVEL_SCORE) and row["model"] == "gpt-5.4"
    assert json.loads(row["extra"])["final_answer"] == NOVEL_ANSWER
    assert len(calls) == 1 and calls[0]["completion_token_ids"] and calls[0]["policy_version"] == "qwen3-policy"
