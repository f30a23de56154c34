"""Gemini CLI's replayed turns continue the thread: the real CLI against a scripted upstream that, as the Gemini API
does, names no function call.

When Gemini CLI sends the model's `functionCall` back, it adds an `id` of its
own (`write_file_<ms>_<n>`) and, within the active tool loop,
`thoughtSignature: "skip_thought_signature_validator"` (its
`ensureActiveLoopHasThoughtSignatures`): neither was the model's. The
recording keeps both, as sent; the segmenter must still see the replay as the
answer it repeats, so a 2-call tool loop is one segment, one sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forgerl.harnesses import node_path

from conftest import session_calls, session_parts
from convert_fixtures import TOKENIZER_DIR, convert, rows
from harness_checks import needs, record_trapped, tool_results
from scripted_upstream import Request, ToolCall, Turn

pytestmark = pytest.mark.slow
KEY = "AIzaSyForgeGeminiTestKeyGeminiTestKey12"
MODEL = "gemini-2.5-pro"
SYNTHETIC = "skip_thought_signature_validator"  # Gemini CLI's SYNTHETIC_THOUGHT_SIGNATURE


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    gemini = needs("gemini")
    base = tmp_path_factory.mktemp("gemini-replay")
    proof = base / "work" / "proof.txt"
    acts = [ToolCall("write_file", {"file_path": str(proof), "content": "forgerl proof\n"}, id=""),
            ToolCall("read_file", {"file_path": str(proof)}, id="")]

    def script(request: Request) -> Turn:
        done = tool_results(request)
        return Turn(text="The file says: forgerl proof") if done >= len(acts) else Turn(tool_calls=[acts[done]])

    return record_trapped(base, "gr", script, [str(gemini), "--yolo", "--output-format", "json", "-m", MODEL, "-p",
                                               "Write proof.txt, then read it back."],
                          {"GEMINI_API_KEY": KEY, "PATH": node_path()})


def _parts(data: Path, refs: list[str]) -> list[dict]:
    by_hash = session_parts(data, "gr")
    return [json.loads(by_hash[ref]) for ref in refs]


def test_a_two_call_tool_loop_is_one_segment(recorded, tmp_path):
    r, data = recorded["run"], recorded["data"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert recorded["hits"] == [], "Gemini CLI reached past the recorder"
    calls = sorted(session_calls(data, "gr", 3), key=lambda c: (c["t_start"], c["seq"]))
    assert len(calls) == 3
    # the model named no call; the replay the CLI sent carries its id and the made-up signature, kept as sent
    made = [p for p in _parts(data, calls[0]["output_refs"]) if p["type"] == "tool_call"]
    assert len(made) == 1 and "call_id" not in made[0]
    (replayed,) = [p for p in _parts(data, calls[1]["input_refs"]) if p["type"] == "tool_call"]
    assert replayed["call_id"] and replayed["extra"] == {"thoughtSignature": SYNTHETIC}
    assert {k: v for k, v in replayed.items() if k not in ("call_id", "extra")} == made[0]
    # ...and the thread holds: one segment, each call continuing the one before
    assert [(c["segment_index"], c["segment_reason"]) for c in calls] == [(0, "start")] * 3
    assert [c["continues_call"] for c in calls] == [None, calls[0]["call_id"], calls[1]["call_id"]]
    convert(data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", "gemini-cli")
    (row,) = rows(tmp_path / "t")
    assert (row["segment_id"], row["num_turns"]) == ("gr:0", 3)
