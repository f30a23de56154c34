"""`forge-analyze`: measure harness behaviour over a recorded dataset with DuckDB.

    forge-analyze report DATASET [--by COLUMN] [--out report.html] [--task-ids FILE | --task-glob GLOB]
    forge-analyze compare DATASET --a COLUMN=VALUE --b COLUMN=VALUE [--per COLUMN] [--task-ids FILE] [--json]
    forge-analyze sql DATASET "SELECT ..." [--format table|csv|json]
    forge-analyze views
    forge-analyze pass-rates DATASET [--policy-version V] [--harness H] [--model M]
    forge-analyze view DATASET [--listen 127.0.0.1:8765] [--tokenizer PATH_OR_NAME]

Bad input (not a dataset, an unknown --by, a SQL error) is one line on
stderr and exit status 2; nothing is written.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from decimal import Decimal
from pathlib import Path

import duckdb

from forgerl import printer
from forgerl.cli import run_verb
from forgerl.converters.tokenizer import load_tokenizer
from forgerl.converters.tokens import Renderer
from forgerl.errors import UserError
from forgerl.schema.attempts import Scope, pass_rate_rows

from . import connect
from .compare import Side, compare, compare_per
from .groups import FIXED, OUTCOME
from .pass_rates import rates_table
from .gui import screenshot_strip
from .report import build, comparison_table, pass_rate_table, per_group_table, table, to_html
from .tasksets import TaskSet
from .viewer.server import DEFAULT_LISTEN, parse_listen, serve
from .views import VIEWS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge-analyze", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="behaviour metrics per group: a terminal table and an HTML report")
    report.add_argument("dataset")
    report.add_argument("--by", default="harness", help=f"group sessions by {', '.join(FIXED)}, an outcome column "
                                                        f"({', '.join(OUTCOME)}) or a label key (default harness)")
    report.add_argument("--out", help="write a self-contained HTML report with plots here")
    _threads_option(report)
    report.add_argument("--viewer", metavar="URL", help="link group names to `forge-analyze view` at this URL")
    report.add_argument("--screenshots", metavar="SESSION", help="show this session's screenshots as a strip in "
                        "the HTML report (GUI agents; needs --out)")
    _task_set_options(report, "the held-out tasks: the pass-rate learning curves split them from the rest (train), "
                              "and the first-vs-last comparison runs on them")
    sql = sub.add_parser("sql", help="run a query with every table and view registered")
    sql.add_argument("dataset")
    sql.add_argument("query")
    sql.add_argument("--format", default="table", help="table (default), csv or json")
    sub.add_parser("views", help="list the views and what each holds")
    rates = sub.add_parser("pass-rates", help="per-task pass rates: tasks solved never, sometimes, always",
                           description="Per task, harness, model and policy version: scored attempts, passed, "
                                       "pass rate and whether the policy solves it never, sometimes or always (RL "
                                       "trains on 'sometimes': forge-convert --solve-rate MIN:MAX, which reads the "
                                       "same rates).")
    rates.add_argument("dataset")
    rates.add_argument("--policy-version", help="only this policy version ('(none)' for untagged outcomes)")
    rates.add_argument("--harness", help="only this harness")
    rates.add_argument("--model", help="only this model")
    cmp = sub.add_parser("compare", help="two slices paired per task, with bootstrap confidence intervals",
                         description="Compare the sessions of --a with those of --b on the tasks both hold: every "
                                     "behaviour rate, pass@k and pass^k, each side's value and B - A with percentile "
                                     "intervals from a paired task-level bootstrap (analysis/README.md).")
    cmp.add_argument("dataset")
    cmp.add_argument("--a", required=True, metavar="COLUMN=VALUE", help="side A, e.g. policy_version=v1 "
                                                                         "(any --by column of report)")
    cmp.add_argument("--b", required=True, metavar="COLUMN=VALUE", help="side B, e.g. policy_version=v5")
    cmp.add_argument("--confidence", type=float, default=0.95, help="interval confidence (default 0.95)")
    cmp.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    cmp.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0): same seed, same intervals")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.add_argument("--per", metavar="COLUMN", help="compare within each value of this column (e.g. harness): "
                                                     "one row per value, pass@1 of each side and B - A")
    _task_set_options(cmp, "compare only on these tasks (e.g. the held-out ones)")
    view = sub.add_parser("view", help="browse sessions, calls and token-level samples in a local web app")
    view.add_argument("dataset")
    view.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                      help=f"where to serve (default {DEFAULT_LISTEN}, loopback only; port 0 picks a free one)")
    view.add_argument("--tokenizer", help="tokenizer path or name with a chat template: decodes the token view "
                                          "and re-renders samples to show drift from the engine's ids")
    _threads_option(view)
    return parser


def _task_set_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--task-ids / --task-glob, read with `TaskSet.from_options`."""
    parser.add_argument("--task-ids", metavar="FILE", help=f"a file of task ids, one a line: {what}")
    parser.add_argument("--task-glob", metavar="GLOB", help="the task ids matching this shell pattern, instead of "
                                                            "--task-ids")


def _threads_option(parser: argparse.ArgumentParser) -> None:
    """--threads for the verbs that run DuckDB over the whole dataset (report, view); read with `_threads`."""
    parser.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")


def _threads(args: argparse.Namespace) -> int | None:
    """DuckDB's worker threads (None: all cores); fewer than 1 is the user's error."""
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    return args.threads


def _report(args: argparse.Namespace) -> int:
    threads = _threads(args)
    out = Path(args.out) if args.out else None
    if out and not out.parent.is_dir():
        raise UserError(f"--out {out}: no such directory {out.parent}")
    if args.screenshots and not out:
        raise UserError("--screenshots draws into the HTML report: give --out too")
    task_set = TaskSet.from_options(args.task_ids, args.task_glob)  # a bad file fails before the dataset is read
    con = connect(args.dataset, threads=threads, materialize=True)
    report = build(con, args.by, task_set)
    strip = screenshot_strip(con, args.screenshots) if args.screenshots else ""
    title = f"forgerl behaviour report: {Path(args.dataset).resolve().name}"
    page = to_html(report, title, viewer=args.viewer, screenshots=strip) if out else None
    printer.show(table(report))
    if report.pass_rates is not None:
        print()
        printer.show(pass_rate_table(report))
    if out:
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(page)
        os.replace(tmp, out)
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _sql(args: argparse.Namespace) -> int:
    if args.format not in ("table", "csv", "json"):
        raise UserError(f"unknown --format {args.format!r}; choose table, csv or json")
    con = connect(args.dataset)
    try:  # the user's query: its errors are theirs (errors in our own views stay bugs)
        cur = con.execute(args.query)
        rows = cur.fetchall() if cur.description is not None else []
    except duckdb.Error as e:
        raise UserError(f"SQL error: {str(e).splitlines()[0]}") from None
    if cur.description is None:
        return 0
    names = [d[0] for d in cur.description]
    print(format_rows(names, rows, args.format))
    return 0


def format_rows(names: list[str], rows: list[tuple], fmt: str) -> str:
    """Rows as an aligned table, CSV or a JSON array of objects."""
    if fmt == "json":
        return json.dumps([dict(zip(names, r)) for r in rows], default=str, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    numeric = {name for i, name in enumerate(names)
               if all(isinstance(r[i], (int, float, Decimal)) and not isinstance(r[i], bool) for r in rows
                      if r[i] is not None)}
    return printer.text(printer.table(names, ([_cell(v) for v in r] for r in rows), left=set(names) - numeric))


def _cell(value: object, width: int = 60) -> str:
    """A value as a table cell: empty for NULL, cut to `width` characters."""
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _compare(args: argparse.Namespace) -> int:
    a, b = Side.parse(args.a, "--a"), Side.parse(args.b, "--b")
    task_set = TaskSet.from_options(args.task_ids, args.task_glob)  # a bad file fails before the dataset is read
    con = connect(args.dataset, materialize=True)
    if task_set is not None:
        task_set.check(con)
    options = dict(confidence=args.confidence, resamples=args.resamples, seed=args.seed, task_set=task_set)
    if args.per is None:
        c = compare(con, a, b, **options)
        if args.json:
            print(json.dumps(c.as_dict(), indent=2))
        else:
            printer.show(comparison_table(c))
        return 0
    done, notes = compare_per(con, a, b, args.per, **options)
    if args.json:
        print(json.dumps({"per": args.per, "groups": [{args.per: c.where[0].value, **c.as_dict()} for c in done],
                          "skipped": notes}, indent=2))
        return 0
    printer.show(per_group_table(done, args.per, notes))
    return 0


def _pass_rates(args: argparse.Namespace) -> int:
    scope = Scope(harness=args.harness, model=args.model, policy_version=args.policy_version)
    rows = pass_rate_rows(connect(args.dataset), scope)
    printer.show(rates_table(rows, f"pass rates per task ({scope}): {Path(args.dataset).resolve().name}"))
    return 0


def _views(args: argparse.Namespace) -> int:
    printer.show(printer.table(["view", "what it holds"], ([v.name, v.doc] for v in VIEWS), left=2))
    return 0


def _view(args: argparse.Namespace) -> int:
    parse_listen(args.listen)  # bad --listen or --threads fails before the dataset or tokenizer is loaded
    threads = _threads(args)
    renderer = Renderer(load_tokenizer(args.tokenizer)) if args.tokenizer else None  # bad name: UserError
    serve(Path(args.dataset), args.listen, renderer, threads)
    return 0


COMMANDS = {"report": _report, "sql": _sql, "views": _views, "compare": _compare, "view": _view,
            "pass-rates": _pass_rates}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_verb("forge-analyze", lambda: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
