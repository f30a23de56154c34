"""The learn task family (benchmarks/learn/) and its teacher (examples/learn_teacher.py).

Fast: the committed tasks are exactly what generate.py writes and forgerl loads
them; train and held-out are disjoint, held-out combinations are unseen while
every value is seen; every task's grade() passes on the workspace the teacher's
command leaves and fails on the untouched one and on the other family's command
with the same values; the replay baseline is measured the same way.
Slow: the teacher recorded through real `forge-run` with Claude Code and pi, along
both production paths (vendor-API upstream, token policy server), then
`forge-convert --to tokens`; the recorded prompt names the tasks' fixed workdir, no random folder.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forgerl.runners.grade_code import run_grade
from forgerl.runners.loader import load_tasks
from forgerl.runners.tasks import Task
from forgerl.schema.store import read_table

from conftest import REPO
from learn_teacher import (COMMANDS, TOKENIZER_DIR, Action, TeacherPolicyServer, parse_task, qwen_turn, replay_action,
                           script)
from learn_probe import grade as probe_grade
from scripted_upstream import ScriptedUpstream

LEARN = REPO / "benchmarks" / "learn"
BIN = Path(sys.executable).parent
SIBLING = {"replace": "append", "append": "replace", "copy": "rename", "rename": "copy"}  # same values, other family


def tasks(split: str) -> list[Task]:
    return load_tasks(LEARN / split)


def actions(split: str) -> dict[str, Action]:
    return {t.id: parse_task(t.prompt) for t in tasks(split)}


def solved(task: Task, tmp_path: Path, command: str | None) -> float:
    """grade() on a fresh workspace of `task` after `command` ran there (None: untouched)."""
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir()
    for f in task.files:
        shutil.copy(f.source, ws / f.dest)
    if command is not None:
        subprocess.run(["bash", "-c", command], cwd=ws, check=True)
    return run_grade(task.grader, [], str(ws))["solved"]


def test_generate_rewrites_the_committed_files(tmp_path):
    subprocess.run([sys.executable, str(LEARN / "generate.py"), "--out", str(tmp_path)], check=True)
    made = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    committed = {p.relative_to(LEARN): p.read_bytes() for d in ("train", "heldout", "assets")
                 for p in (LEARN / d).rglob("*") if p.is_file()}
    assert made == committed
    assert (len(tasks("train")), len(tasks("heldout"))) == (40, 16)


def test_split_is_disjoint_balanced_and_heldout_combinations_unseen():
    train, heldout = actions("train"), actions("heldout")
    assert all(train.values()) and all(heldout.values()), "the teacher must read every prompt"
    assert not set(train) & set(heldout)
    assert not set(train.values()) & set(heldout.values()), "a held-out (family, values) combination is in train"
    counts = Counter(a.family for a in train.values())
    assert len(counts) >= 4 and len(set(counts.values())) == 1, counts
    assert Counter(a.family for a in heldout.values()) == Counter({f: 4 for f in counts})
    seen = {(a.family, slot, value) for a in train.values() for slot, value in a.values}
    assert all((a.family, slot, value) in seen for a in heldout.values() for slot, value in a.values)

    def wording(task: Task) -> str:
        return re.sub(r"\b[\w-]+\.txt\b|(?<=word )\w+", "_", task.prompt)

    train_wordings = {wording(t) for t in tasks("train")}
    new = [t.id for t in tasks("heldout") if wording(t) not in train_wordings]
    assert len(new) == 8, new
    assert not any("/" in t.prompt or "workspace" in t.prompt.lower() for t in tasks("train") + tasks("heldout"))


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_grade_passes_only_on_what_the_teacher_command_leaves(split, tmp_path):
    for task in tasks(split):
        action = parse_task(task.prompt)
        assert solved(task, tmp_path, None) == 0.0, task.id
        assert solved(task, tmp_path, action.command) == 1.0, task.id
        other = COMMANDS[SIBLING[action.family]].format(**dict(action.values))
        assert solved(task, tmp_path, other) == 0.0, (task.id, other)


def test_replay_baseline_solves_one_train_task_and_no_heldout(tmp_path):
    """The issue's baseline: the most common training trajectory, whatever the prompt says."""
    replay = replay_action()
    assert replay == parse_task(next(t.prompt for t in tasks("train") if t.id == "learn-train-append-00"))
    rates = {split: sum(solved(t, tmp_path, replay.command) for t in tasks(split)) / len(tasks(split))
             for split in ("train", "heldout")}
    assert rates == {"train": 1 / 40, "heldout": 0.0}


def test_qwen_turn_reads_the_rendered_chat():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tools = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {}}}]
    prompt = "Copy todo.txt to draft.txt."
    chat = [{"role": "system", "content": "Tools are listed in <tools></tools>."}, {"role": "user", "content": prompt}]

    def render(messages, tools=tools):
        return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    act = qwen_turn(render(chat))
    assert act == '<tool_call>\n{"name": "bash", "arguments": {"command": "cp todo.txt draft.txt"}}\n</tool_call>'
    done = chat + [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "bash", "arguments": {"command": "cp todo.txt draft.txt"}}}]},
        {"role": "tool", "content": ""}]
    assert qwen_turn(render(done)) == "Done."
    assert qwen_turn(render(chat, tools=None)) == "File task"  # a side call: no shell tool offered
    replay = qwen_turn(render(chat), replay_action())
    assert "echo cloud >> tasks.txt" in replay


def test_the_probe_grades_the_command_in_a_tool_call():
    def call(command: str) -> str:
        return f'<tool_call>\n{json.dumps({"name": "bash", "arguments": {"command": command}})}\n</tool_call>'

    append = {"f": "notes.txt", "w": "cloud"}
    marks = [probe_grade("echo cloud >> notes.txt", "append", append, call(c)) for c in
             ("echo cloud >> notes.txt", "echo cloud > notes.txt", "echo river >> notes.txt", "cp notes.txt x")]
    assert [(m["exact"], m["family"], m["values"]) for m in marks] == [
        (True, True, True), (False, False, True), (False, True, False), (False, False, False)]
    copy = {"a": "notes.txt", "b": "todo.txt"}
    assert probe_grade("cp notes.txt todo.txt", "copy", copy, call("cp todo.txt notes.txt")) == {
        "exact": False, "family": True, "values": False}  # the order matters
    assert not any(probe_grade("cp notes.txt todo.txt", "copy", copy, "Done.").values())  # no tool call


# --- slow: real harnesses through forge-run, both paths ----------------------------------------------

CASES = [("claude-code", "upstream", "learn-train-replace-00"), ("claude-code", "policy", "learn-train-copy-00"),
         ("pi", "upstream", "learn-train-rename-00"), ("pi", "policy", "learn-train-append-00")]


@pytest.mark.slow
@pytest.mark.parametrize("harness,path,task_id", CASES)
def test_teacher_recorded_through_forge_run_converts_to_tokens(harness, path, task_id, tmp_path):
    from transformers import AutoTokenizer
    out, shards = tmp_path / "data", tmp_path / "shards"
    server = ScriptedUpstream(script()) if path == "upstream" else TeacherPolicyServer(served_model="teacher")
    with server:
        how = (["--upstream", server.url] if path == "upstream" else
               ["--policy", server.url, "--tokenizer", str(TOKENIZER_DIR), "--served-model", "teacher"])
        r = subprocess.run([str(BIN / "forge-run"), str(LEARN / "train"), "--task", task_id, "--harness", harness,
                            *how, "--out", str(out)], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    [outcome] = read_table(out, "outcomes").to_pylist()
    assert (outcome["status"], outcome["reward"]) == ("success", 1.0), outcome
    assert json.loads(outcome["extra"])["final_answer"] == "Done."
    seconds = (outcome["t_end"] - outcome["t_start"]).total_seconds()
    print(f"{harness} via {path}: one rollout {seconds:.1f} s")

    started = time.monotonic()
    c = subprocess.run([str(BIN / "forge-convert"), str(out), "--to", "tokens", "--tokenizer", str(TOKENIZER_DIR),
                        "--out", str(shards), "--val-fraction", "0"], capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr[-3000:]
    counts = json.loads((shards / "manifest.json").read_text())["counts"]
    assert counts["rows_train"] == 1 and counts["retokenized" if path == "upstream" else "engine_ids"] == 1, counts
    [row] = pq.read_table(shards / "train").to_pylist()
    trained = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    said = tokenizer.decode(trained)
    command = parse_task(load_tasks(LEARN / "train" / f"{task_id.split('-', 2)[2]}.toml")[0].prompt).command
    assert json.dumps(command) in said and "Done." in said and row["reward"] == 1.0, said
    # The task's fixed workdir: the prompt names /workspace (Claude Code: its memory folder under the fixed HOME),
    # never the rollout's random temp folder, so every rollout's prompt is the same up to the task.
    prompt = tokenizer.decode(row["input_ids"])
    assert "forgerl-rollout" not in prompt and "/workspace" in prompt
    assert ("/agent-home/.claude/projects/-workspace/" in prompt) == (harness == "claude-code")
    print(f"{harness} via {path}: forge-convert {time.monotonic() - started:.1f} s")
