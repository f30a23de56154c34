"""`forge-analyze report`: the behaviour metrics per group as a terminal table and a self-contained HTML page.

The numbers come from the `metrics_by_*`, `pass_curve_by_*` and `tool_usage`
views; plots are matplotlib figures inlined as SVG, so the HTML file needs
nothing but itself.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlencode

import duckdb

from .views import GROUPS

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


@dataclass
class Report:
    by: str
    groups: list[dict]
    curves: list[dict]
    tools: list[dict]
    sessions: int


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def build(con: duckdb.DuckDBPyConnection, by: str = "harness") -> Report:
    """Compute everything the report shows (`by` must be one of `GROUPS`; `con` best from `connect(materialize=True)`)."""
    if by not in GROUPS:
        raise ValueError(f"unknown --by column {by!r}; choose one of: {', '.join(GROUPS)}")
    tools_sql = (f"SELECT {GROUPS[by]} AS grp, tool_name, kind, count(*) AS calls FROM tool_calls "
                 f"JOIN session_info USING (session_id) GROUP BY ALL ORDER BY grp, calls DESC, tool_name")
    return Report(by=by, groups=_rows(con, f"SELECT * FROM metrics_by_{by}"),
                  curves=_rows(con, f"SELECT * FROM pass_curve_by_{by}"), tools=_rows(con, tools_sql),
                  sessions=con.execute("SELECT count(*) FROM session_metrics").fetchone()[0])


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


def table(report: Report) -> str:
    """The per-group metrics as an aligned text table."""
    headers = [report.by, *(h for _, h, _ in COLUMNS)]
    body = [[str(g[report.by]), *(_fmt(g[c], k) for c, _, k in COLUMNS)] for g in report.groups]
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines += ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in body]
    if not body:
        lines.append("(no sessions)")
    return "\n".join(lines)


# --- plots ------------------------------------------------------------------------------------


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prolog and doctype: inline SVG needs neither


def _figure(width: float = 7.5, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
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


def to_html(report: Report, title: str, viewer: str | None = None) -> str:
    """A self-contained page: metrics table, bars, pass@k curves, tool distribution, per-tool counts.

    `viewer` is the URL of a running `forge-analyze view` of the same dataset: group names link to its list."""
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
            f"<table id=\"metrics\"><tr>{head}</tr>{rows}</table>{figures}"
            f"<h2>Calls per tool</h2><table class=\"tools\"><tr><th>{esc(report.by)}</th><th>tool</th><th>kind</th>"
            f"<th>calls</th></tr>{tool_rows}</table></body></html>\n")
