"""Outcomes already in the dataset: what a resumed run skips, and the pass@k / pass^k table.

pass@k and pass^k come from `forgerl.analysis.reliability` (the project's one
implementation). Whether a run passed is its benchmark's rule, stored per
outcome row (`Task.passes`): QwenClawBench and forgerl TOML tasks at reward
1.0, ClawEval at task score >= 0.75. Infra failures are not attempts; for
benchmarks that count missing trials as failed (ClawEval's `score_summary.py`
does), a task with fewer than k scored attempts is padded with failures up to
k. The table's footer states each benchmark's rule.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rich.table import Table

from forgerl import printer
from forgerl.analysis.reliability import counting_missing, pass_at_k, pass_pow_k
from forgerl.schema.files import MANIFEST
from forgerl.schema.store import read_table

from .tasks import Task

FINISHED = ("success", "failed", "timeout")


def outcome_rows(root: Path, harness: str, model: str, policy_version: str) -> list[dict]:
    """The outcomes of one harness, model ("": the harness's own choice) and policy version."""
    if not (root / MANIFEST).exists():
        return []
    rows = read_table(root, "outcomes", ["task_id", "attempt", "harness", "model", "policy_version", "status",
                                          "reward", "passed"]).to_pylist()
    return [r for r in rows if r["harness"] == harness and (r["model"] or "") == model
            and (r["policy_version"] or "") == policy_version]


def finished(root: Path, harness: str, model: str, policy_version: str) -> set[tuple[str, int]]:
    """(task, attempt) pairs with a final outcome for this harness, model and policy version: a run with
    another model into the same dataset runs every attempt again."""
    return {(r["task_id"], r["attempt"]) for r in outcome_rows(root, harness, model, policy_version)
            if r["status"] in FINISHED}


def pass_table(rows: list[dict], k: int, tasks: dict[str, Task] | None = None) -> list[dict]:
    """Per task: its outcomes' model(s), n scored attempts, c passed, mean reward, pass@1, pass@k, pass^k (None
    when n < k, unless the task's benchmark counts missing trials as failed)."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_task[r["task_id"]].append(r)
    table = []
    for task, runs in sorted(by_task.items()):
        scored = [r for r in runs if r["status"] in FINISHED]
        n, c = len(scored), sum(bool(r["passed"]) for r in scored)
        pad = tasks is not None and task in tasks and tasks[task].missing_trials_fail
        trials = counting_missing(n, k) if pad else n
        table.append({"task": task, "model": ", ".join(sorted({r.get("model") or "unknown" for r in runs})),
                      "n": n, "passed": c, "infra": len(runs) - n,
                      "mean_reward": sum(r["reward"] for r in scored) / n if n else None,
                      "pass@1": pass_at_k(n, c, 1) if n else None,
                      f"pass@{k}": pass_at_k(trials, c, k) if trials >= k else None,
                      f"pass^{k}": pass_pow_k(trials, c, k) if trials >= k else None})
    return table


def pass_rules(tasks: list[Task]) -> list[str]:
    """One line per benchmark among `tasks`: when a run passes, and what else its numbers mean."""
    return list(dict.fromkeys(t.pass_rule() for t in tasks))


def rate_rows(table: list[dict], harness: str, policy_version: str) -> list[dict]:
    """`pass_table`'s tasks with a scored attempt, as the rows of `analysis.pass_rates` (forge-run's closing table)."""
    return [{"task": r["task"], "harness": harness, "model": r["model"], "policy_version": policy_version or "(none)",
             "n": r["n"],
             "passed": r["passed"], "pass_rate": r["passed"] / r["n"], "mean_reward": r["mean_reward"]}
            for r in table if r["n"]]


def pass_at_k_table(table: list[dict], k: int, rules: list[str] = ()) -> Table:
    """`pass_table` as forge-run prints it, each benchmark's pass rule (`pass_rules`) under it."""
    cols = ["task", "n", "passed", "infra", "mean_reward", "pass@1", f"pass@{k}", f"pass^{k}"]
    cols = list(dict.fromkeys(cols))  # k == 1: pass@1 once
    rows = [["-" if r[c] is None else f"{r[c]:.3f}" if isinstance(r[c], float) else r[c] for c in cols] for r in table]
    return printer.table(cols, rows, caption="\n".join(rules) or None)
