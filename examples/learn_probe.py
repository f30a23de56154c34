"""A fast proxy of the learning loop's held-out eval: greedy decoding with the torch model, no harness, no vLLM.

Why: serving a checkpoint with vLLM and running 16 held-out tasks in two
harnesses takes ~10 minutes here; tuning the student needs seconds. For each
harness in the shards, one recorded teacher row is the template: its prompt
(every token before the first loss token) with the train task's sentence
swapped for each probed task's sentence, tokenized as the harness sends it
(the chat template's special tokens split the pieces). The model decodes
greedily up to `<|im_end|>`; the command in its tool call is checked against
the teacher's (`learn_teacher.parse_task`): exact, the family's verb, and each
value. The template row's rollout-specific text (a workspace path) stays: the
proxy does not see a harness's turn-to-turn changes, only the first turn.

    python examples/learn_probe.py CKPT --shards SHARDS [--split heldout] [--harness pi] [--show]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from forgerl.runners.loader import load_tasks
from learn_teacher import COMMANDS, parse_task

LEARN = Path(__file__).resolve().parents[1] / "benchmarks" / "learn"
_COMMAND = re.compile(r'"command": "((?:[^"\\]|\\.)*)"')


def templates(shards: Path) -> dict[str, tuple[str, str]]:
    """Per harness: the first teacher row's prompt text (before its first loss token) and that task's sentence."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    manifest = json.loads((shards / "manifest.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(manifest["tokenizer"]["name"])
    prompts = {t.id: t.prompt for t in load_tasks(LEARN / "train")}
    out: dict[str, tuple[str, str]] = {}
    for path in sorted((shards / "train").rglob("*.parquet")):
        for row in pq.read_table(path, columns=["harness", "session_id", "input_ids", "loss_mask"]).to_pylist():
            task = next((t for t in prompts if row["session_id"].startswith(t + "-")), None)
            if row["harness"] in out or task is None:
                continue
            first = row["loss_mask"].index(1)
            out[row["harness"]] = (tokenizer.decode(row["input_ids"][:first]), prompts[task])
    return out


def decode(model, tokenizer, prompt: str, max_new: int) -> str:
    """Greedy continuation of `prompt` up to `<|im_end|>` or `max_new` tokens."""
    import torch

    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=end, pad_token_id=end)
    return tokenizer.decode(got[0, ids.shape[1]:], skip_special_tokens=False)


def grade(expected: str, family: str, values: dict[str, str], answer: str) -> dict[str, bool]:
    """Exact command, right verb, every value in its place (by the family's command pattern)."""
    found = _COMMAND.search(answer)
    command = json.loads(f'"{found[1]}"') if found else ""
    words, pattern = command.split(), COMMANDS[family].split()
    slots = {w.strip("{}"): i for i, w in enumerate(pattern) if w.startswith("{")}
    operators = [w for w in pattern if w in (">", ">>")]  # echo's redirection tells replace from append
    return {"exact": command == expected,
            "family": words[:1] == pattern[:1] and [w for w in words if w in (">", ">>")] == operators,
            "values": all(i < len(words) and words[i] == values[k] for k, i in slots.items())}


def probe(ckpt: Path, shards: Path, split: str, harnesses: list[str], max_new: int,
          show: bool = False) -> dict[str, dict[str, float]]:
    """Per harness: the share of `split`'s tasks with the exact command, the right family, the right values."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    tasks = sorted(load_tasks(LEARN / split), key=lambda t: t.id)
    result = {}
    for harness, (prompt, sentence) in templates(shards).items():
        if harnesses and harness not in harnesses:
            continue
        marks = {"exact": 0, "family": 0, "values": 0}
        for task in tasks:
            action = parse_task(task.prompt)
            answer = decode(model, tokenizer, prompt.replace(sentence, task.prompt), max_new)
            got = grade(action.command, action.family, dict(action.values), answer)
            marks = {k: marks[k] + got[k] for k in marks}
            if show:
                print(f"{harness} {task.id}: {'ok ' if got['exact'] else 'BAD'} want {action.command!r} "
                      f"got {answer[:120]!r}")
        result[harness] = {k: v / len(tasks) for k, v in marks.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="learn_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", type=Path, help="a checkpoint folder (forge-train sft --engine torch --out)")
    parser.add_argument("--shards", type=Path, required=True, help="the teacher's tokens shards (the templates)")
    parser.add_argument("--split", default="heldout", choices=("train", "heldout"))
    parser.add_argument("--harness", action="append", default=[], help="only these harnesses (default: all)")
    parser.add_argument("--max-new", type=int, default=64, help="tokens a decode may take (default 64)")
    parser.add_argument("--show", action="store_true", help="print every task's answer")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    for harness, marks in probe(args.ckpt, args.shards, args.split, args.harness, args.max_new, args.show).items():
        print(f"{harness} {args.split}: " + " ".join(f"{k} {v:.3f}" for k, v in marks.items()))
    print(f"probe: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
