"""`forge-convert`: turn a recorded dataset into veRL SFT, RL, token-level shards, ATIF trajectories or OTLP traces."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from forgerl.cli import run_verb
from forgerl.errors import UserError
from forgerl.schema.attempts import Scope
from forgerl.schema.staging import local_copy
from forgerl.schema.storage import local_only, locate

from . import drift, otel
from .filters import Filters
from .pipeline import TARGETS, Options, convert
from .solve_rate import SolveRate

EPILOG = """\
modes:
  thread    one sample per segment (a run of calls that extend each other's
            conversation), loss on every assistant turn generated in it:
            each model output is trained exactly once.
  per-call  one sample per model call, loss only on that call's output
            (--to tokens only: veRL's MultiTurnSFTDataset puts loss on every
            assistant message of a row, so per-call rows would train each
            turn again in every later call; verl-sft refuses it).

outputs (under OUT, written aside and renamed into place at the end):
  train/ val/        parquet shards (verl-sft, verl-rl, tokens) or one ATIF
                     JSON per session (atif); split by hash of session id
  manifest.json      input version, converter version, tokenizer hash, the
                     filters applied (--solve-rate with its scope), counts,
                     and the drift report (template vs engine ids)
  verl_config.yaml   data.* keys for veRL (verl-sft, verl-rl)
  traces.jsonl       otel: one OTLP/JSON ExportTraceServiceRequest per session
                     (OpenTelemetry GenAI spans; POST a line to a collector's
                     /v1/traces); the filters do not apply to it

environment:
  FORGE_CONVERT_MEMORY  DuckDB's memory limit (default 512MB); sessions are read
                        in id ranges whose calls fit a quarter of it
"""


def _date(value: str) -> datetime:
    when = datetime.fromisoformat(value)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forge-convert", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", type=Path, help="dataset root written by forge-record")
    p.add_argument("--to", required=True, help=f"output kind: {', '.join((*TARGETS, 'otel'))}")
    p.add_argument("--out", required=True, type=Path, help="output directory (replaced atomically)")
    p.add_argument("--tokenizer", help="tokenizer path or name with a chat template (needed for tokens; "
                                       "gives the drift report for verl-sft)")
    p.add_argument("--mode", choices=("thread", "per-call"), default="thread", help="sample mode (see below)")
    p.add_argument("--tokens-from", choices=("engine", "template"), default="engine",
                   help="engine: recorded token ids verbatim where every call has them (default); "
                        "template: always re-render (rows flagged retokenized)")
    p.add_argument("--drift", choices=drift.MODES, default="sample",
                   help=f"drift report: re-render the last call of a sample of segments (default: the first "
                        f"{drift.SAMPLE_FIRST}, then 1 in {drift.SAMPLE_EVERY} by segment-id hash), of every "
                        f"segment (last; its prompt holds the whole history), every call (all), or none")
    f = p.add_argument_group("filters")
    f.add_argument("--harness", action="append", default=[], help="keep these harnesses (repeatable)")
    f.add_argument("--model", action="append", default=[], help="keep samples of these models (repeatable)")
    f.add_argument("--since", type=_date, help="sessions started at or after (ISO date/time, UTC default)")
    f.add_argument("--until", type=_date, help="sessions started before")
    f.add_argument("--min-reward", type=float, help="sessions whose outcome reward is at least this")
    f.add_argument("--outcome", action="append", default=[], help="outcome status (success, failed, ...)")
    f.add_argument("--error-free", action="store_true", help="only sessions whose calls all succeeded")
    f.add_argument("--min-turns", type=int, help="samples with at least this many model calls")
    f.add_argument("--max-turns", type=int, help="samples with at most this many model calls")
    f.add_argument("--solve-rate", metavar="MIN:MAX",
                   help="sessions of tasks whose pass rate (passed / scored attempts in the dataset's outcomes, "
                        "per harness, model and policy version: forge-analyze pass-rates) lies in [MIN, MAX], e.g. "
                        "0.1:0.9 for RL on tasks solved sometimes (--to verl-rl); by default each session's task "
                        "is rated in the session's own harness, model and policy version")
    f.add_argument("--solve-rate-harness", metavar="H", help="--solve-rate counts the attempts in this harness")
    f.add_argument("--solve-rate-model", metavar="M", help="--solve-rate counts the attempts of this model")
    f.add_argument("--solve-rate-policy", metavar="V",
                   help="--solve-rate counts the attempts of this policy version ('(none)': untagged)")
    p.add_argument("--no-dedupe", action="store_true", help="keep identical samples")
    p.add_argument("--allow-tools-absent", action="store_true",
                   help="emit training rows whose tool calls come without tool definitions (calls.tools_absent); "
                        "refused by default, counted in the manifest either way")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of sessions in val/ (default 0.05)")
    p.add_argument("--shard-mb", type=int, default=128, help="target shard size in MB (default 128)")
    p.add_argument("--agent-name", default="forgerl_harness", help="agent_name of verl-rl rows")
    p.add_argument("--max-length", type=int, default=32768, help="max_length in the veRL config snippet")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--otel-content", action="store_true",
                   help="--to otel: put message content on the call spans (new messages, answer, instructions, "
                        "tool definitions; images as blob references)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.to == "otel":
        return run_verb("forge-convert", lambda: _export_otel(args))
    return run_verb("forge-convert", lambda: _convert(args, _options(args)))


def _export_otel(args: argparse.Namespace) -> int:
    local_only(args.dataset, "forge-convert --to otel")
    manifest = otel.export(args.dataset, args.out, args.otel_content)
    print(f"forge-convert: {manifest['sessions']} sessions, {manifest['spans']} spans -> {args.out}", file=sys.stderr)
    return 0


def _options(args: argparse.Namespace) -> Options:
    """The run's options (a bad --solve-rate is a UserError here, inside the verb's wrapper)."""
    filters = Filters(models=frozenset(args.model), since=args.since, until=args.until, min_reward=args.min_reward,
                      outcomes=frozenset(args.outcome), error_free=args.error_free, min_turns=args.min_turns,
                      max_turns=args.max_turns,
                      solve_rate=_solve_rate(args))
    return Options(target=args.to, mode=args.mode, tokenizer=args.tokenizer, harnesses=frozenset(args.harness),
                   filters=filters, val_fraction=args.val_fraction, dedupe=not args.no_dedupe,
                   tokens_from=args.tokens_from, shard_bytes=args.shard_mb * 1024 * 1024, agent_name=args.agent_name,
                   max_length=args.max_length, drift=args.drift, progress=not args.no_progress,
                   allow_tools_absent=args.allow_tools_absent)


def _solve_rate(args: argparse.Namespace) -> SolveRate | None:
    scope = Scope(harness=args.solve_rate_harness, model=args.solve_rate_model,
                  policy_version=args.solve_rate_policy)
    if args.solve_rate is None:
        if scope != Scope():
            raise UserError("--solve-rate-harness, --solve-rate-model and --solve-rate-policy need --solve-rate")
        return None
    return SolveRate.parse(args.solve_rate, scope)


def _convert(args: argparse.Namespace, opts: Options) -> int:
    with local_copy(args.dataset) as dataset:  # an s3:// input is staged: DuckDB reads local files only here
        staged = dataset is not args.dataset
        manifest = convert(Path(dataset), args.out, opts, source=locate(args.dataset)[1] if staged else None)
    counts = manifest["counts"]
    print(f"forge-convert: {counts.get('sessions', 0)} sessions, {counts.get('segments', 0)} segments, "
          f"{counts.get('rows_train', 0)} train + {counts.get('rows_val', 0)} val rows"
          f"{f' ({dups} duplicates dropped)' if (dups := counts.get('duplicates_dropped')) else ''} -> {args.out}",
          file=sys.stderr)
    if manifest.get("drift"):
        print("drift: " + json.dumps({k: v for k, v in manifest["drift"].items() if k != "examples"}),
              file=sys.stderr)
    return 0
