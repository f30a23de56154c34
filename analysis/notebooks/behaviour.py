# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Harness behaviour with forgerl's DuckDB views
#
# This notebook walks through the views of `forgerl.analysis` on the bundled example
# dataset (`analysis/example`: Claude Code-like, Codex-like and plain SDK sessions recorded
# through `forge-record`, with graded outcomes). Point `DATASET` at your own recording to
# run the same analysis on it. Definitions of every metric: `analysis/README.md`.

# %%
from pathlib import Path

import matplotlib.pyplot as plt

import forgerl.analysis
from forgerl.analysis import connect

DATASET = Path(forgerl.analysis.__file__).parent / "example"
con = connect(DATASET)
con.sql("SELECT count(*) AS sessions, sum(turns) AS turns, sum(tool_calls) AS tool_calls FROM session_metrics").df()

# %% [markdown]
# ## Tool calls and their kinds
# `tool_calls` has one row per tool call a model made, with its kind (from `kinds.TOOL_KINDS`),
# the file or command it targets, and whether it counts as a check.

# %%
con.sql("""SELECT session_id, turn, pos, tool_name, kind, target, check_kind
           FROM tool_calls WHERE session_id LIKE '%-a1' ORDER BY session_id, step""").df()

# %%
usage = con.sql("SELECT harness, kind, sum(calls) AS calls FROM tool_usage GROUP BY ALL ORDER BY ALL").df()
usage.pivot(index="harness", columns="kind", values="calls").fillna(0).plot.barh(stacked=True, figsize=(7, 3))
plt.title("Tool calls by kind")
plt.show()

# %% [markdown]
# ## Self-verification and error recovery
# A session verifies when a check (test, build, lint, running the script, re-reading) follows
# its last write. Failure episodes are runs of failed calls with the same intent (kind + target).

# %%
con.sql("SELECT * FROM verification ORDER BY session_id").df()

# %%
con.sql("SELECT * FROM recoveries ORDER BY session_id, failed_turn").df()

# %% [markdown]
# ## Everything per session, then per harness

# %%
con.sql("""SELECT session_id, harness, turns, verified, failure_episodes, recovered_episodes,
                  tool_coverage, plan_completion, human_turns, harness_turns, cost_usd
           FROM session_metrics ORDER BY session_id""").df()

# %%
by_harness = con.sql("SELECT * FROM metrics_by_harness").df()
metrics = ["verification_rate", "recovery_rate", "tool_coverage", "plan_completion", "pass_at_1"]
by_harness.set_index("harness")[metrics].plot.bar(figsize=(8, 3), ylim=(0, 1.05))
plt.title("Behaviour per harness")
plt.show()

# %% [markdown]
# ## Tokens and cost (cache reads and writes separate)

# %%
con.sql("""SELECT harness, sum(input_tokens) AS input, sum(output_tokens) AS output,
                  sum(cache_read_tokens) AS cache_read, sum(cache_write_tokens) AS cache_write,
                  round(sum(cost_usd), 4) AS cost_usd
           FROM session_metrics GROUP BY ALL ORDER BY ALL""").df()

# %% [markdown]
# ## Reliability: pass@k and pass^k
# Unbiased estimators over the attempts of each task (infra errors excluded), averaged per harness.

# %%
curves = con.sql("SELECT * FROM pass_curve_by_harness").df()
fig, ax = plt.subplots(figsize=(6, 3))
for harness, rows in curves.groupby("harness"):
    line, = ax.plot(rows["k"], rows["pass_at_k"], marker="o", label=f"{harness} pass@k")
    ax.plot(rows["k"], rows["pass_pow_k"], marker="s", linestyle="--", color=line.get_color(), label=f"{harness} pass^k")
ax.set_xlabel("k")
ax.legend()
plt.show()
assert curves["pass_at_k"].between(0, 1).all()

# %% [markdown]
# ## Comparing two slices, with uncertainty
# `compare` pairs two slices of the dataset per task and puts a paired task-level bootstrap
# interval (seeded, percentile; analysis/README.md) on each side and on the difference B - A,
# for every behaviour rate and for pass@k and pass^k. The same as
# `forge-analyze compare DATASET --a attempt=1 --b attempt=3`. The example's attempts replay the
# same scripts, so its behaviour differences are zero and only pass@1 moves; on a training run,
# compare `policy_version=v1` with `policy_version=v5`.

# %%
import pandas as pd

from forgerl.analysis.compare import Side, compare, learning_curves

c = compare(con, Side("attempt", "1"), Side("attempt", "3"), resamples=2000, seed=0)
deltas = pd.DataFrame([r.as_dict() for r in c.rows]).set_index("metric")
assert (deltas.loc["verification_rate", "delta"], deltas.loc["pass@1", "tasks"]) == (0.0, 5)
deltas

# %% [markdown]
# Learning curves: each behaviour per harness over a grouping column, here the attempt
# (`learning_curves(con)` defaults to `over="policy_version"`: how fast each harness learns).

# %%
curve = pd.DataFrame(learning_curves(con, over="attempt"))
metrics = ["verification_rate", "recovery_rate", "pass_at_1"]
fig, axes = plt.subplots(1, len(metrics), figsize=(9, 2.8), sharey=True)
for ax, metric in zip(axes, metrics):
    for harness, rows in curve[curve["attempt"] != "(none)"].groupby("harness"):
        ax.plot(rows["attempt"], rows[metric], marker="o", label=harness)
    ax.set_title(metric)
axes[0].legend()
plt.show()
