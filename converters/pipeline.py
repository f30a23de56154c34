"""One conversion run: sessions -> segments -> samples -> rows, with manifest and drift report."""

from __future__ import annotations

import gc
import hashlib
import sys
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import duckdb
import numpy as np
import pyarrow as pa

from forgerl.errors import UserError
from forgerl.schema.messages import canonical_json
from forgerl.schema.templates import template_sha256

from . import atif as atif_out
from . import verl
from .drift import DriftReport
from .filters import Filters
from .joins import join_outcomes
from .samples import Mode, samples
from .shards import Output, SeenSet, ShardWriter, split_of
from .source import check_dataset, connect, iter_sessions, readable
from .threads import segment_session
from .tokenizer import load_tokenizer, tokenizer_hash
from .tokens import Renderer, has_engine_ids, tokenize, token_row
from .vision import ImagePads, image_bytes, sample_images

TARGETS = ("verl-sft", "verl-rl", "tokens", "atif")

TOKEN_SCHEMA = pa.schema([
    ("sample_id", pa.string()), ("session_id", pa.string()), ("segment_id", pa.string()),
    ("segment_index", pa.int32()), ("segment_reason", pa.string()), ("parent_segment", pa.string()),
    ("parent_position", pa.int32()), ("mode", pa.string()), ("harness", pa.string()), ("model", pa.string()),
    ("api", pa.string()), ("policy_version", pa.string()), ("call_ids", pa.list_(pa.string())),
    ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
    ("response_mask", pa.list_(pa.int8())), ("logprobs", pa.list_(pa.float32())), ("reward", pa.float64()),
    ("retokenized", pa.bool_()), ("template_consistent", pa.bool_()), ("images", pa.list_(pa.string())),
    ("num_tokens", pa.int32()), ("num_turns", pa.int32()),
])


class UsageError(UserError):
    """Options that do not fit together."""


class ToolsAbsentError(UserError):
    """Training rows would hold tool calls whose definitions the requests never sent."""


@dataclass
class Options:
    target: str
    mode: Mode = "thread"
    tokenizer: str | None = None
    harnesses: frozenset[str] = frozenset()
    filters: Filters = field(default_factory=Filters)
    val_fraction: float = 0.05
    dedupe: bool = True
    tokens_from: str = "engine"
    shard_bytes: int = 128 * 1024 * 1024
    agent_name: str = "forgerl_harness"
    max_length: int = 32768
    drift: str = "sample"
    progress: bool = True
    allow_tools_absent: bool = False


def check_options(opts: Options) -> None:
    if opts.target not in TARGETS:
        raise UsageError(f"unknown --to {opts.target!r}; choose from {', '.join(TARGETS)}, otel")  # otel: cli.py
    if opts.target == "verl-sft" and opts.mode == "per-call":
        raise UsageError("--to verl-sft --mode per-call would train each turn once per later call "
                         "(veRL puts loss on every assistant message): use --mode thread, or --to tokens")
    if opts.target == "tokens" and not opts.tokenizer:
        raise UsageError("--to tokens needs --tokenizer")
    if not 0 <= opts.val_fraction < 1:
        raise UsageError("--val-fraction must be in [0, 1)")


class _Writers:
    def __init__(self, output: Output, target: str, shard_bytes: int):
        self.output, self.target, self.shard_bytes = output, target, shard_bytes
        self.writers: dict[tuple[str, str], ShardWriter] = {}

    def add(self, split: str, row: dict[str, Any], prefix: str = "part") -> None:
        key = (split, prefix)
        if key not in self.writers:
            schema = TOKEN_SCHEMA if self.target == "tokens" else None
            self.writers[key] = ShardWriter(self.output.path(split), prefix, schema, self.shard_bytes)
        self.writers[key].add(row)

    def close(self) -> dict[str, list[str]]:
        files: dict[str, list[str]] = {}
        for (split, _), writer in sorted(self.writers.items()):
            writer.close()
            files.setdefault(split, []).extend(str(p.relative_to(self.output.tmp)) for p in writer.files)
        return files

    def discard(self) -> None:
        """After a failure: no shard is still being written when the output is removed."""
        for writer in self.writers.values():
            writer.discard()


def _dedupe_key(target: str, row: dict[str, Any]) -> bytes:
    if target == "tokens":
        return np.asarray(row["input_ids"], np.int32).tobytes() + b"|" + np.asarray(row["loss_mask"], np.int8).tobytes()
    if target == "verl-sft":
        return canonical_json([row["messages"], row["tools"]]).encode()
    return canonical_json([row["prompt"], row["data_source"]]).encode()


def convert(root: Path, out: Path, opts: Options, source: str | None = None) -> dict[str, Any]:
    """Run the conversion; everything appears at `out` at the end, or nothing. `source`: the dataset the manifest
    names, where `root` is a local copy of it (an s3:// input, `schema.staging`)."""
    check_options(opts)
    dataset_manifest = check_dataset(root)
    tokenizer = load_tokenizer(opts.tokenizer) if opts.tokenizer else None
    # The manifest's sha256 of the tokenizer is taken on a thread: hashlib releases the GIL. DuckDB's start
    # holds it, so the template's compile beside it made both slower (they took turns at the GIL).
    pool = ThreadPoolExecutor(1, thread_name_prefix="forgerl-hash")
    try:
        hashing = pool.submit(tokenizer_hash, tokenizer) if tokenizer is not None else None
        con = connect(root)
        renderer = Renderer(tokenizer) if tokenizer is not None else None
        pads = ImagePads.from_tokenizer_dir(opts.tokenizer, tokenizer) if tokenizer is not None else None
    finally:
        pool.shutdown(wait=False)
    output = Output(out)
    writers = _Writers(output, opts.target, opts.shard_bytes)
    try:
        with _startup_frozen():
            manifest = _run(root, con, output, writers, opts, renderer, pads, dataset_manifest, hashing)
        manifest["input"]["dataset"] = source or manifest["input"]["dataset"]
        output.write_json("manifest.json", manifest)
        output.commit()
        return manifest
    except BaseException:
        writers.discard()
        output.abort()
        raise


@contextmanager
def _startup_frozen() -> Iterator[None]:
    """The cycle collector leaves what the process holds before the run alone (imported modules, the
    tokenizer: transformers' object graph). Reading a dataset builds objects in bulk, which sets off full
    collections, and each one over that graph cost ~60 ms. A process that froze its own objects keeps them."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _run(root: Path, con: duckdb.DuckDBPyConnection, output: Output, writers: _Writers, opts: Options,
         renderer: Renderer | None, pads: ImagePads | None, dataset_manifest: dict,
         tokenizer_sha: Future[str] | None) -> dict:
    counts: Counter = Counter()
    dropped: Counter = Counter()
    drift = DriftReport(renderer, opts.drift, pads)
    seen = SeenSet(output.path("dedupe.sqlite")) if opts.dedupe else None
    progress = _progress(opts.progress)
    filters = opts.filters.with_pass_rates(root)
    with readable(root):
        joins = join_outcomes(con)
    joins.refuse_broken()
    for session in iter_sessions(root, con, joins.outcomes, harnesses=set(opts.harnesses) or None):
        counts["sessions_read"] += 1
        progress.update(1)
        reason = filters.session_reason(session)
        if reason:
            dropped[reason] += 1
            continue
        segments = segment_session(session)
        if not segments:
            dropped["no trainable calls"] += 1
            continue
        counts["sessions"] += 1
        counts["segments"] += len(segments)
        counts.update(f"segments_{s.reason}" for s in segments)
        for seg in segments:
            absent = sum(bool(call.row.get("tools_absent")) for call in seg.calls)
            counts["tools_absent_calls"] += absent
            counts["tools_absent_segments"] += absent > 0
        split = split_of(session.session_id, opts.val_fraction)
        if opts.target == "atif":
            output.path(split).mkdir(exist_ok=True)
            doc = atif_out.session_trajectory(session, segments)
            name = hashlib.sha256(session.session_id.encode()).hexdigest()[:16]
            output.path(split, f"{name}.json").write_text(canonical_json(doc) + "\n")
            counts[f"rows_{split}"] += 1
            continue
        drift.thread_breaks += sum(s.reason == "token_break" for s in segments)
        if opts.target in ("tokens", "verl-sft"):
            last_of = {s.index: s.last for s in segments}
            for seg in segments:  # a token break's history check compares with the call it broke from
                before = last_of.get(seg.parent) if seg.reason == "token_break" else None
                drift.check_segment(seg.segment_id, seg.calls, True, before)
        for sample in samples(session, segments, opts.mode if opts.target == "tokens" else "thread"):
            reason = opts.filters.sample_reason(sample)
            if reason:
                dropped[reason] += 1
                continue
            counts["samples"] += 1
            for row, prefix in _rows(opts, renderer, pads, sample, drift, counts):
                if seen is not None and not seen.add(_dedupe_key(opts.target, row)):
                    counts["duplicates_dropped"] += 1
                    continue
                writers.add(split, row, prefix)
                counts[f"rows_{split}"] += 1
    progress.close()
    if seen is not None:
        seen.close()
    files = writers.close()
    _check_tools_absent(opts, counts)
    if counts["sessions"] == 0:
        raise UsageError("nothing to convert: no session passed the filters" if dropped
                         else "nothing to convert: the dataset has no trainable calls")
    _config(output, opts, files)
    return {
        "converter": "forge-convert", "converter_version": _version(), "created_at": datetime.now(timezone.utc),
        "input": {"dataset": str(root.resolve()), "schema_version": dataset_manifest["schema_version"],
                  "created_at": dataset_manifest.get("created_at")},
        "target": opts.target, "mode": opts.mode if opts.target == "tokens" else "thread",
        "tokenizer": None if renderer is None else {"name": opts.tokenizer, "sha256": tokenizer_sha.result(),
                                                     "chat_template_sha256": _template_hash(renderer.tokenizer)},
        "options": {"val_fraction": opts.val_fraction, "dedupe": opts.dedupe, "tokens_from": opts.tokens_from,
                    "drift": opts.drift, "harnesses": sorted(opts.harnesses),
                    "allow_tools_absent": opts.allow_tools_absent, "filters": opts.filters.describe()},
        "counts": dict(counts), "dropped": dict(dropped), "joins": joins.report(), "files": files,
        "drift": drift.to_dict() if renderer is not None else None,
    }


def _template_hash(tokenizer: Any) -> str:
    """The sha256 of the template rows were rendered with (`forgerl.schema.templates`: a folder's template is
    the text it holds, which `LocalTokenizer` and transformers both read; of named templates, the default)."""
    template = tokenizer.chat_template
    return template_sha256(template["default"] if isinstance(template, dict) else template)


def _check_tools_absent(opts: Options, counts: Counter) -> None:
    """Refuse training rows whose tool calls come without the tools' definitions, unless asked for them."""
    if counts["tools_absent_calls"] and opts.target != "atif" and not opts.allow_tools_absent:
        raise ToolsAbsentError(
            f"{counts['tools_absent_calls']} calls in {counts['tools_absent_segments']} segments hold tool calls but "
            f"their requests defined no tools (calls.tools_absent; e.g. Codex run with its own default model): "
            f"record with a named model, leave those sessions out (--harness, --since), or pass "
            f"--allow-tools-absent to emit them without definitions")


def _rows(opts: Options, renderer: Renderer | None, pads: ImagePads | None, sample, drift: DriftReport,
          counts: Counter):
    if opts.target == "tokens":
        prefer_engine = opts.tokens_from == "engine"
        parts = [] if prefer_engine and has_engine_ids(sample) else sample.image_parts  # engine ids hold the pads
        sized = [p.blob_hash for p in parts if p.blob_hash and not (p.width and p.height)]
        images = sample_images(pads, parts, sample.session.blob_bytes(sized), sample.session.session_id,
                               opts.tokenizer)
        ts = tokenize(renderer, sample, prefer_engine=prefer_engine, images=images)
        if ts is not None:
            drift.note_tokens(ts)
            counts["retokenized" if ts.retokenized else "engine_ids"] += 1
            yield token_row(ts), "part"
    elif opts.target == "verl-sft":
        parts = sample.image_parts
        hashes = [p.blob_hash for p in parts if p.blob_hash]
        row = verl.sft_row(sample, image_bytes(parts, sample.session.blob_bytes(hashes), sample.session.session_id))
        yield row, "mm" if "images" in row else "part"
    elif opts.target == "verl-rl":
        if sample.segment.parent is None:
            row = verl.rl_row(sample, opts.agent_name, counts["rl_rows"])
            if row is not None:
                counts["rl_rows"] += 1
                yield row, "part"


def _config(output: Output, opts: Options, files: dict[str, list[str]]) -> None:
    if opts.target not in ("verl-sft", "verl-rl"):
        return
    template = verl.SFT_CONFIG if opts.target == "verl-sft" else verl.RL_CONFIG
    paths = {split: [str(output.out / f) for f in names] for split, names in files.items()}
    dataset_path, dataset_name = verl.SFT_DATASET_CLASS
    text = template.format(train=paths.get("train", []), val=paths.get("val", []), max_length=opts.max_length,
                           agent=opts.agent_name, dataset_path=dataset_path, dataset_name=dataset_name)
    output.path("verl_config.yaml").write_text(text)


def _version() -> str:
    try:
        return metadata.version("forgerl")
    except metadata.PackageNotFoundError:
        return "unknown"


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool):
    if not enabled or not sys.stderr.isatty():
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(desc="sessions", unit="session", file=sys.stderr)
