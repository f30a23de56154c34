"""`forge-convert DATA --to otel --out DIR`: every session as OTLP spans, one JSON line per session.

Each line of `DIR/traces.jsonl` is an OTLP `ExportTraceServiceRequest` in the
protobuf JSON mapping (`google.protobuf.json_format`), with trace and span ids
as hex strings as OTLP/JSON wants them (the plain mapping writes base64), so a
line can be POSTed as is to any collector's `/v1/traces` with
`Content-Type: application/json`. The spans are `recorder/otel.py`'s mapping,
fed the calls in the order the recorder wrote them, so they are the spans a
live `--otlp` export sent, id for id, the root's outcome included (forge-run
sends the live root itself, built by the same `replay`, as it writes the
outcome: `recorder/otlp.py`). `--otel-content` adds message content as the
live flag does.
`DIR/manifest.json` counts sessions, spans and each span kind.
"""

from __future__ import annotations

import base64
import json
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import json_format

from forgerl.recorder.otel import CALL_COLUMNS, PART_COLUMNS, SEMCONV, export_request, replay, tool_parts
from forgerl.schema.records import MessageMemo, call_messages
from forgerl.schema.store import read_table

from .shards import Output
from .source import check_dataset

ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def otlp_json(request: Any) -> str:
    """A request in OTLP/JSON: the protobuf JSON mapping with hex trace and span ids."""
    value = json_format.MessageToDict(request)
    for resource in value.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ID_FIELDS:
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(value, separators=(",", ":"))


def _parts(root: Path, content: bool) -> tuple[dict[str, dict[str, tuple]], dict[str, dict[str, str]]]:
    """session -> {part hash: (type, tool call id, tool name, is_error)} for the tool calls and results; with
    `content`, also session -> {part hash: part JSON} for every part (to rebuild messages)."""
    parts = read_table(root, "messages", ["session_id", *PART_COLUMNS, *(["part"] if content else [])])
    by_session: dict[str, dict[str, str]] = defaultdict(dict)
    if content:
        columns = (parts.column(c).to_pylist() for c in ("session_id", "part_hash", "part"))
        for session, part_hash, part in zip(*columns):
            by_session[session][part_hash] = part
    parts = parts.filter(pc.is_in(parts.column("part_type"), pa.array(["tool_call", "tool_result"])))
    rows: dict[str, list[dict]] = defaultdict(list)
    for r in parts.to_pylist():
        rows[r["session_id"]].append(r)
    return defaultdict(dict, {s: tool_parts(r) for s, r in rows.items()}), by_session


def _messages(parts: dict[str, str], memo: MessageMemo) -> Callable[[dict], tuple[list, list]]:
    """A call's input and output messages, rebuilt from its session's parts."""
    return lambda row: (call_messages(row, parts, "input", memo), call_messages(row, parts, "output", memo))


def export(root: Path, out: Path, content: bool = False) -> dict[str, Any]:
    """Write `out/traces.jsonl` and `out/manifest.json` (built aside, renamed into place); the manifest. With
    `content` the call spans carry message content (`forgerl.recorder.otel_content`)."""
    check_dataset(root)
    calls = read_table(root, "calls", [*CALL_COLUMNS, *(f"{d}_{c}" for d in ("input", "output")
                                                        for c in ("refs", "msg", "roles", "extra"))]).to_pylist()
    sessions = read_table(root, "sessions", ["session_id", "harness"]).to_pylist()
    harness = {r["session_id"]: r["harness"] for r in sessions}
    outcomes: dict[str, dict] = {}  # a session's last outcome (forge-run writes one per session)
    for r in read_table(root, "outcomes").to_pylist():
        known = outcomes.get(r["session_id"])
        if known is None or (r["t_end"] and (known["t_end"] is None or r["t_end"] >= known["t_end"])):
            outcomes[r["session_id"]] = r
    parts, full = _parts(root, content)
    memo = MessageMemo()
    by_session: dict[str, list[dict]] = defaultdict(list)
    for row in calls:
        by_session[row["session_id"]].append(row)
    kinds: Counter = Counter()
    traced = 0
    output = Output(out)
    try:
        with output.path("traces.jsonl").open("w") as f:
            for session in sorted(by_session):
                said = _messages(full[session], memo) if content else None
                trace, spans = replay(session, by_session[session], parts[session], said)
                spans += trace.finish(outcomes.get(session), harness.get(session))
                if spans:  # a session of model calls (not only probes)
                    kinds.update(s.name.split(" ")[0] for s in spans)
                    f.write(otlp_json(export_request(spans)) + "\n")
                    traced += 1
        manifest = {"target": "otel", "semconv": SEMCONV, "content": content, "sessions": traced,
                    "spans": sum(kinds.values()), "span_kinds": dict(sorted(kinds.items()))}
        output.write_json("manifest.json", manifest)
        output.commit()
        return manifest
    except BaseException:
        output.abort()
        raise
