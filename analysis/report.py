"""`forge-analyze report` and `compare`: behaviour metrics per group, and comparisons, as terminal and HTML tables.

The numbers come from `groups.metrics_by` / `pass_curve_by` (the
`metrics_by_*` views for the fixed groups), `tool_calls` and `compare.py`;
plots are matplotlib figures inlined as SVG, so the HTML file needs nothing
but itself. When the dataset holds two or more policy versions the page adds
"what changed": the first version against the last with paired bootstrap
intervals, and each behaviour's learning curve over the versions per harness;
and the pass rate per policy version per harness with its interval
(`learning.py`), split held-out / train when a task set is given (the
comparison then runs on the held-out tasks).
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlencode

import duckdb
from rich.table import Table

from forgerl import printer
from forgerl.errors import UserError

from . import groups
from .compare import Comparison, Side, compare, learning_curves, natural_key, policy_versions
from .learning import Point, pass_rate_curves
from .tasksets import TaskSet

# (column, header, format) of the terminal and HTML tables.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sessions", "sessions", "int"),
    ("turns", "turns", "int"),
    ("verification_rate", "verify", "pct"),
    ("verify_latency_turns", "verify lat", "num"),
    ("recovery_rate", "recover", "pct"),
    ("give_up_rate", "give up", "pct"),
    ("turns_to_recover", "to recover", "num"),
    ("tool_coverage", "coverage", "pct"),
    ("plan_completion", "plan done", "pct"),
    ("pass_at_1", "pass@1", "pct"),
    ("input_tokens", "in tok", "int"),
    ("output_tokens", "out tok", "int"),
    ("cache_read_tokens", "cache rd", "int"),
    ("cache_write_tokens", "cache wr", "int"),
    ("cost_usd", "cost $", "usd"),
)
BAR_METRICS = ("verification_rate", "recovery_rate", "tool_coverage", "plan_completion", "pass_at_1")
LEARNING_METRICS = ("verification_rate", "recovery_rate", "tool_coverage", "plan_completion", "pass_at_1")


@dataclass
class Report:
    by: str
    groups: list[dict]
    curves: list[dict]
    tools: list[dict]
    sessions: int
    changes: Comparison | None = None  # first policy version against the last, when there are two or more
    learning: list[dict] | None = None  # metrics per harness and policy version (`compare.learning_curves`)
    pass_rates: list[Point] | None = None  # pass rate per harness, split and version (`learning.pass_rate_curves`)
    task_set: TaskSet | None = None  # the held-out tasks the pass rates split by and `changes` is restricted to


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def build(con: duckdb.DuckDBPyConnection, by: str = "harness", task_set: TaskSet | None = None) -> Report:
    """Compute everything the report shows (`by`: any `groups.choices`, else UserError; `con` best from
    `connect(materialize=True)`; `task_set`: the held-out tasks, UserError if the dataset grades none of them)."""
    if task_set is not None:
        task_set.check(con)
    expr = groups.column(con, by)
    tools_sql = (f"SELECT grp, tool_name, kind, count(*) AS calls FROM tool_calls JOIN (SELECT session_id, "
                 f"{groups.key(expr)} AS grp FROM session_groups) USING (session_id) "
                 f"GROUP BY ALL ORDER BY grp, calls DESC, tool_name")
    report = Report(by=by, groups=_rows(con, groups.metrics_by(expr, by)),
                    curves=_rows(con, groups.pass_curve_by(expr, by)), tools=_rows(con, tools_sql),
                    sessions=con.execute("SELECT count(*) FROM session_metrics").fetchone()[0], task_set=task_set)
    versions = policy_versions(con)
    if len(versions) >= 2 or task_set is not None:
        report.pass_rates = pass_rate_curves(con, task_set)
    if len(versions) >= 2:
        report.learning = learning_curves(con)
        try:
            report.changes = compare(con, Side("policy_version", versions[0]), Side("policy_version", versions[-1]),
                                     task_set=task_set)
        except UserError:  # the two versions share no task: the curves still show, the paired deltas cannot
            report.changes = None
    return report


def _fmt(value, kind: str) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    if kind == "pct":
        return f"{100 * value:.0f}%"
    if kind == "num":
        return f"{value:.2f}"
    if kind == "usd":
        return f"{value:.4f}"
    return f"{int(value):,}"


def table(report: Report) -> Table:
    """The per-group metrics as a table (what `forge-analyze report` prints)."""
    headers = [report.by, *(h for _, h, _ in COLUMNS)]
    body = [[str(g[report.by]), *(_fmt(g[c], k) for c, _, k in COLUMNS)] for g in report.groups]
    return printer.table(headers, body, caption=None if body else "(no sessions)")


def pass_rate_cells(report: Report) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the learning curves: pass rate per harness, split and policy version."""
    headers = ["harness", "split", "policy", "tasks", "attempts", "passed", "pass rate", "95% CI"]
    rows = [[p.harness, p.split, p.policy_version, str(p.tasks), str(p.attempts), str(p.passed),
             _fmt(p.pass_rate, "pct"), _ci(p.interval, "pct")] for p in report.pass_rates or []]
    return headers, rows


def pass_rate_table(report: Report) -> Table:
    """The learning curves as a table (what `forge-analyze report` prints after the metrics)."""
    headers, rows = pass_rate_cells(report)
    split = "" if report.task_set is None else f"; held-out = {report.task_set}, train = the other tasks"
    return printer.table(headers, rows, left=3, caption=None if rows else "(no graded attempts with a policy version)",
                         title=f"pass rate per policy version (mean over tasks; 95% task bootstrap{split})")


# --- plots ------------------------------------------------------------------------------------


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog and doctype: inline SVG needs neither


def _figure(width: float = 7.5, height: float = 3.6, ncols: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, ncols, figsize=(width, height), sharey=ncols > 1)
    return fig, ax


def metric_bars(report: Report) -> str:
    fig, ax = _figure()
    n = max(len(report.groups), 1)
    width = 0.8 / n
    for i, g in enumerate(report.groups):
        values = [g[m] if g[m] is not None and g[m] == g[m] else 0.0 for m in BAR_METRICS]
        xs = [j + i * width for j in range(len(BAR_METRICS))]
        ax.bar(xs, values, width, label=str(g[report.by]))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(BAR_METRICS))],
                  [h for c, h, _ in COLUMNS if c in BAR_METRICS])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rate")
    ax.set_title(f"Behaviour metrics per {report.by}")
    if report.groups:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no sessions in this dataset", ha="center", va="center", transform=ax.transAxes)
    return _svg(fig)


def pass_curves(report: Report) -> str:
    fig, ax = _figure()
    groups: dict[str, list[dict]] = {}
    for row in report.curves:
        groups.setdefault(str(row[report.by]), []).append(row)
    for name, rows in groups.items():
        ks = [r["k"] for r in rows]
        line = ax.plot(ks, [r["pass_at_k"] for r in rows], marker="o", label=f"{name} pass@k")[0]
        ax.plot(ks, [r["pass_pow_k"] for r in rows], marker="s", linestyle="--", color=line.get_color(),
                label=f"{name} pass^k")
    if not groups:
        ax.text(0.5, 0.5, "no graded outcomes in this dataset", ha="center", va="center", transform=ax.transAxes)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k (attempts)")
    ax.set_ylabel("mean over tasks")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("pass@k and pass^k")
    if groups:
        ax.legend(fontsize=8)
    return _svg(fig)


def tool_distribution(report: Report) -> str:
    fig, ax = _figure(height=max(2.5, 0.5 * (len({t["grp"] for t in report.tools}) + 2)))
    kinds_by_group: dict[str, dict[str, int]] = {}
    for t in report.tools:
        per = kinds_by_group.setdefault(str(t["grp"]), {})
        per[t["kind"]] = per.get(t["kind"], 0) + t["calls"]
    all_kinds = sorted({k for per in kinds_by_group.values() for k in per})
    names = list(kinds_by_group)
    left = [0] * len(names)
    for kind in all_kinds:
        values = [kinds_by_group[n].get(kind, 0) for n in names]
        ax.barh(names, values, left=left, label=kind)
        left = [a + b for a, b in zip(left, values)]
    if not names:
        ax.text(0.5, 0.5, "no tool calls in this dataset", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("tool calls")
    ax.set_title(f"Tool calls by kind per {report.by}")
    if names:
        ax.legend(fontsize=8, ncol=4)
    return _svg(fig)


def learning_plot(report: Report) -> str:
    """One panel per behaviour metric: its value per policy version (x, in natural order), a line per harness."""
    rows = report.learning or []
    versions = sorted({r["policy_version"] for r in rows}, key=natural_key)
    fig, axes = _figure(3 * len(LEARNING_METRICS), 3, ncols=len(LEARNING_METRICS))
    for ax, metric in zip(axes, LEARNING_METRICS):
        for harness in dict.fromkeys(r["harness"] for r in rows):
            points = [(versions.index(r["policy_version"]), r[metric]) for r in rows
                      if r["harness"] == harness and r[metric] is not None and r[metric] == r[metric]]
            if points:
                ax.plot(*zip(*points), marker="o", label=harness)
        ax.set_xticks(range(len(versions)), versions, rotation=45, fontsize=8)
        ax.set_title(_header(metric), fontsize=10)
        ax.set_ylim(-0.02, 1.05)
    axes[0].set_ylabel("rate")
    axes[-1].legend(fontsize=8)
    return _svg(fig)


def pass_rate_plot(report: Report) -> str:
    """One panel per split (held-out, train; or all): pass rate per policy version with its interval as an error
    bar, a line per harness (shifted a little sideways, so the bars do not hide each other)."""
    points = report.pass_rates or []
    versions = sorted({p.policy_version for p in points}, key=natural_key)
    splits = list(dict.fromkeys(p.split for p in points)) or ["all"]
    harnesses = list(dict.fromkeys(p.harness for p in points))
    fig, axes = _figure(4.5 * len(splits), 3.4, ncols=len(splits))
    for ax, split in zip(axes if len(splits) > 1 else [axes], splits):
        for i, harness in enumerate(harnesses):
            line = [p for p in points if p.harness == harness and p.split == split]
            if not line:
                continue
            shift = 0.05 * (i - (len(harnesses) - 1) / 2)
            xs = [versions.index(p.policy_version) + shift for p in line]
            ys = [p.pass_rate for p in line]
            err = [[y - (p.interval.low if p.interval else y) for p, y in zip(line, ys)],
                   [(p.interval.high if p.interval else y) - y for p, y in zip(line, ys)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=harness)
        ax.set_xticks(range(len(versions)), versions, fontsize=8)
        ax.set_title(f"{split} tasks", fontsize=10)
        ax.set_xlabel("policy version")
        ax.set_ylim(-0.02, 1.05)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    (axes[0] if len(splits) > 1 else axes).set_ylabel("pass rate")
    return _svg(fig)


# --- comparisons --------------------------------------------------------------------------------


def _header(metric: str) -> str:
    return next((h for c, h, _ in COLUMNS if c == metric), metric)


def _kind(metric: str) -> str:
    """How a comparison metric prints: rates as percentages, pass@k and pass^k too, the rest as numbers."""
    if metric.startswith("pass"):
        return "pct"
    return {"turns": "num", "cost_usd": "usd"}.get(metric, next((k for c, _, k in COLUMNS if c == metric), "num"))


def _ci(interval, kind: str) -> str:
    return "-" if interval is None else f"[{_fmt(interval.low, kind)}, {_fmt(interval.high, kind)}]"


def _delta(value, kind: str) -> str:
    text = _fmt(value, kind)
    return text if text == "-" or text.startswith("-") else "+" + text


def comparison_cells(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a comparison: each side's value and interval, the difference and its interval."""
    pct = f"{100 * c.confidence:g}%"
    headers = ["metric", f"A {c.a}", f"{pct} CI", f"B {c.b}", f"{pct} CI", "B - A", f"{pct} CI", "tasks"]
    rows = [[_header(r.metric), _fmt(r.a, k), _ci(r.a_ci, k), _fmt(r.b, k), _ci(r.b_ci, k), _delta(r.delta, k),
             _ci(r.delta_ci, k), str(r.tasks)] for r in c.rows for k in [_kind(r.metric)]]
    return headers, rows


def comparison_table(c: Comparison) -> Table:
    """The comparison as a table (what `forge-analyze compare` prints)."""
    headers, rows = comparison_cells(c)
    return printer.table(headers, rows, title=f"{c.a} (A) vs {c.b} (B): {len(c.tasks)} paired tasks, paired task "
                         f"bootstrap, {c.resamples} resamples, seed {c.seed}")


def per_group_table(comparisons: list[Comparison], per: str, notes: list[str]) -> Table:
    """`compare --per`: one row per group, pass@1 of each side and B - A with their intervals (the behaviour
    metrics are in `--json`); groups that could not be paired are listed under it."""
    first = comparisons[0]
    pct = f"{100 * first.confidence:g}% CI"
    headers = [per, "tasks", f"A {first.a}", pct, f"B {first.b}", pct, "B - A", pct]
    rows = []
    for c in comparisons:
        r = c.row("pass@1")
        cells = ["-"] * 6 if r is None else [_fmt(r.a, "pct"), _ci(r.a_ci, "pct"), _fmt(r.b, "pct"),
                                             _ci(r.b_ci, "pct"), _delta(r.delta, "pct"), _ci(r.delta_ci, "pct")]
        rows.append([c.where[0].value, str(len(c.tasks) if r is None else r.tasks), *cells])
    on = "" if first.task_set is None else f" on {first.task_set}"
    return printer.table(headers, rows, caption="\n".join(notes) or None,
                         title=f"pass@1 per {per}{on}: {first.a} (A) vs {first.b} (B), paired task bootstrap, "
                               f"{first.resamples} resamples, seed {first.seed}")


# --- HTML -------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
th{background:#f3f3f3}figure{margin:1.5em 0}figcaption{font-size:13px;color:#555}
.tools td:nth-child(2),.tools td:nth-child(3),.tools th:nth-child(2),.tools th:nth-child(3){text-align:left}"""


def _group_cell(report: Report, value: object, viewer: str | None) -> str:
    """A group's name, linked to the viewer's sessions list filtered to it when a viewer URL is given."""
    text = html.escape(str(value))
    if viewer is None:
        return f"<td>{text}</td>"
    return f'<td><a href="{html.escape(viewer)}#/?{urlencode({report.by: str(value)})}">{text}</a></td>'


def _html_table(table_id: str, headers: list[str], rows: list[list[str]]) -> str:
    esc = html.escape
    return (f'<table id="{table_id}"><tr>' + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>" +
            "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def pass_rate_section(report: Report) -> str:
    """The learning curves: pass rate per policy version per harness (held-out and train apart), table and plot."""
    if report.pass_rates is None:
        return ""
    split = ("" if report.task_set is None else
             f" Held-out: {html.escape(str(report.task_set))}; train: every other task.")
    return ('<h2 id="learning">Pass rate per policy version</h2>'
            f"<p>Mean over tasks of each task's pass rate (infra errors are not attempts), with 95% intervals from "
            f"a task-level bootstrap (analysis/README.md).{split}</p>"
            + _html_table("pass-rates", *pass_rate_cells(report)) +
            f'<figure id="pass-rate-curves" class="plot">{pass_rate_plot(report)}<figcaption>Pass rate per policy '
            "version, one line per harness, error bars the 95% intervals.</figcaption></figure>")


def what_changed(report: Report) -> str:
    """The "what changed" section: first against last policy version with intervals, and the learning curves."""
    if report.learning is None:
        return ""
    esc = html.escape
    parts = ['<h2 id="what-changed">What changed across policy versions</h2>']
    on = "" if report.task_set is None else f" of {esc(str(report.task_set))}"
    if report.changes is None:
        parts.append(f"<p>The first and last policy versions share no task{on}, so no paired deltas.</p>")
    else:
        c = report.changes
        parts.append(f"<p>{esc(str(c.a))} (A) against {esc(str(c.b))} (B) on the {len(c.tasks)} tasks{on} both "
                     f"attempted: {100 * c.confidence:g}% percentile intervals from a paired task-level bootstrap "
                     f"({c.resamples} resamples, seed {c.seed}; analysis/README.md).</p>")
        parts.append(_html_table("changes", *comparison_cells(c)))
    parts.append(f'<figure id="learning-curves" class="plot">{learning_plot(report)}<figcaption>Each behaviour '
                 "per policy version, one line per harness: how fast each harness learns.</figcaption></figure>")
    return "".join(parts)


def to_html(report: Report, title: str, viewer: str | None = None, screenshots: str = "") -> str:
    """A self-contained page: metrics table, bars, pass@k curves, tool distribution, per-tool counts.

    `viewer` is the URL of a running `forge-analyze view` of the same dataset: group names link to its list;
    `screenshots` a session's screenshot strip (`gui.screenshot_strip`), shown after the metrics."""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in [report.by, *(h for _, h, _ in COLUMNS)])
    rows = "".join("<tr>" + _group_cell(report, g[report.by], viewer) +
                   "".join(f"<td>{esc(_fmt(g[c], k))}</td>" for c, _, k in COLUMNS) + "</tr>" for g in report.groups)
    tool_rows = "".join(f"<tr><td>{esc(str(t['grp']))}</td><td>{esc(str(t['tool_name']))}</td>"
                        f"<td>{esc(t['kind'])}</td><td>{t['calls']}</td></tr>" for t in report.tools)
    plots = [("metric-bars", metric_bars(report), "Rates per group (see analysis/README.md for definitions)."),
             ("pass-curves", pass_curves(report), "pass@k (solid) and pass^k (dashed), unbiased estimators, "
                                                  "mean over the group's tasks, k up to their fewest attempts; infra errors excluded."),
             ("tool-kinds", tool_distribution(report), "Tool calls per kind (kinds.py maps tool names to kinds).")]
    figures = "".join(f'<figure id="{pid}" class="plot">{svg}<figcaption>{esc(cap)}</figcaption></figure>'
                      for pid, svg, cap in plots)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{esc(title)}</h1>"
            f"<p>{report.sessions} sessions, grouped by {esc(report.by)}; generated {stamp}.</p>"
            f"<table id=\"metrics\"><tr>{head}</tr>{rows}</table>{screenshots}{figures}{pass_rate_section(report)}"
            f"{what_changed(report)}"
            f"<h2>Calls per tool</h2><table class=\"tools\"><tr><th>{esc(report.by)}</th><th>tool</th><th>kind</th>"
            f"<th>calls</th></tr>{tool_rows}</table></body></html>\n")
