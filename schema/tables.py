"""Arrow schemas of the dataset tables, defined once, with matching `datasets.Features`.

Tables (each a folder of Parquet files under the dataset root):
- sessions: one row per (writer, session) the first time a writer sees a session, and again when
            more specific evidence names its harness; readers see one row per session
            (`sessions_view`), and `compact` keeps only that row.
- calls:    one row per model call: raw exchange (redacted, zstd), reassembled
            response, timings, usage, token ids, and ordered references to parts.
- messages: one row per distinct content part per session, keyed by part_hash.
- blobs:    image and other large payload bytes, once per session, by hash.
- outcomes: one row per graded rollout (runners): task, attempt, status,
            reward in [0, 1], per-check scores; joins calls on session_id.

A call's input is `input_refs` (part hashes, in order) with `input_msg` giving
each part's message index, `input_roles` each message's role and
`input_extra` each message's vendor layout hints (JSON or null); output the same.
Each trainable call carries its place in the session's threads (`schema/segments.py`,
computed once as the call is written): segment index, why the segment started,
its parent segment, and the call it continues; and whether it holds tool calls
while its request defined no tools (`tools_absent`); and, for calls a policy served
(`forge-record serve`), how many call-shaped spans of its text did not parse as a tool call and
stayed text (`malformed_tool_calls`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # importing `datasets` costs ~2 s; only `features()` needs it
    import datasets

SCHEMA_VERSION = 4
TS = pa.timestamp("us", tz="UTC")

SESSIONS = pa.schema([
    ("session_id", pa.string()),
    ("first_seen", TS),
    ("harness", pa.string()),
    ("user_agent", pa.string()),
    ("source", pa.string()),
    ("labels", pa.string()),
    ("writer_id", pa.string()),
    ("harness_rank", pa.int32()),
    ("harness_evidence", pa.string()),
])

CALLS = pa.schema([
    ("call_id", pa.string()),
    ("session_id", pa.string()),
    ("seq", pa.int64()),
    ("writer_id", pa.string()),
    ("api", pa.string()),
    ("method", pa.string()),
    ("path", pa.string()),
    ("upstream", pa.string()),
    ("status", pa.int32()),
    ("error", pa.string()),
    ("complete", pa.bool_()),
    ("streamed", pa.bool_()),
    ("t_start", TS),
    ("t_first_byte", TS),
    ("t_end", TS),
    ("model_requested", pa.string()),
    ("model_returned", pa.string()),
    ("stop_reason", pa.string()),
    ("input_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("cache_read_tokens", pa.int64()),
    ("cache_write_tokens", pa.int64()),
    ("reasoning_tokens", pa.int64()),
    ("request_headers", pa.string()),
    ("response_headers", pa.string()),
    ("request_params", pa.string()),
    ("tools", pa.string()),
    ("request_raw", pa.binary()),
    ("response_raw", pa.binary()),
    ("response", pa.string()),
    ("input_refs", pa.list_(pa.string())),
    ("input_msg", pa.list_(pa.int32())),
    ("input_roles", pa.list_(pa.string())),
    ("input_extra", pa.list_(pa.string())),
    ("output_refs", pa.list_(pa.string())),
    ("output_msg", pa.list_(pa.int32())),
    ("output_roles", pa.list_(pa.string())),
    ("output_extra", pa.list_(pa.string())),
    ("prompt_token_ids", pa.list_(pa.int32())),
    ("completion_token_ids", pa.list_(pa.int32())),
    ("completion_logprobs", pa.list_(pa.float32())),
    ("policy_version", pa.string()),
    ("segment_index", pa.int32()),
    ("segment_reason", pa.string()),
    ("parent_segment", pa.int32()),
    ("parent_position", pa.int32()),
    ("continues_call", pa.string()),
    ("tools_absent", pa.bool_()),
    ("malformed_tool_calls", pa.int32()),
])

MESSAGES = pa.schema([
    ("part_hash", pa.string()),
    ("session_id", pa.string()),
    ("call_id", pa.string()),
    ("direction", pa.string()),
    ("role", pa.string()),
    ("part_type", pa.string()),
    ("text", pa.string()),
    ("tool_name", pa.string()),
    ("tool_call_id", pa.string()),
    ("arguments", pa.string()),
    ("is_error", pa.bool_()),
    ("blob_hash", pa.string()),
    ("media_type", pa.string()),
    ("signature", pa.string()),
    ("part", pa.string()),
])

BLOBS = pa.schema([
    ("blob_hash", pa.string()),
    ("session_id", pa.string()),
    ("media_type", pa.string()),
    ("size", pa.int64()),
    ("data", pa.binary()),
])

OUTCOMES = pa.schema([
    ("session_id", pa.string()),
    ("task_id", pa.string()),
    ("attempt", pa.int32()),
    ("harness", pa.string()),
    ("model", pa.string()),
    ("policy_version", pa.string()),
    ("status", pa.string()),
    ("reward", pa.float64()),
    ("passed", pa.bool_()),
    ("scores", pa.string()),
    ("graded", pa.string()),
    ("error", pa.string()),
    ("runner", pa.string()),
    ("t_start", TS),
    ("t_end", TS),
    ("extra", pa.string()),
    ("writer_id", pa.string()),
])

OUTCOME_STATUSES: tuple[str, ...] = ("success", "failed", "timeout", "infra_error")

TABLES: dict[str, pa.Schema] = {
    "sessions": SESSIONS,
    "calls": CALLS,
    "messages": MESSAGES,
    "blobs": BLOBS,
    "outcomes": OUTCOMES,
}

COLUMN_DOCS: dict[str, str] = {
    "messages.direction": "output if the part was first seen in a model response, else input",
    "messages.part": "the whole Part as canonical JSON (forgerl.schema.messages.Part.from_dict)",
    "calls.request_raw": "request body, secrets redacted, zstd-compressed; each image's base64 replaced by "
                         "forgerl-blob:sha256:<hex> (its blob; forgerl.recorder.images.restore_request puts it back)",
    "calls.response_raw": "response bytes as received (raw SSE when streamed), redacted, zstd",
    "calls.response": "reassembled response body as JSON (what a non-streaming call returns)",
    "calls.input_tokens": "uncached input tokens; total input = input + cache_read + cache_write",
    "sessions.harness_rank": "how specific the evidence naming the harness is: 0 none, 1 a generic SDK or "
                             "runtime User-Agent, 2 the harness's own User-Agent or header, 3 its system prompt "
                             "or tool set; the highest rank (latest on ties) names the session",
    "sessions.harness_evidence": "what named the harness (e.g. user-agent:claude-cli, system-prompt)",
    "calls.segment_index": "the thread segment this call belongs to, numbered per session from 0 in order of "
                           "first call; null for calls that hold no model turn (errors, no output)",
    "calls.segment_reason": "why the segment started: start, subagent, compaction, tools_changed, "
                            "edited_history, token_break, new_conversation",
    "calls.parent_segment": "the segment this one came from (its reward reaches it too); null for roots",
    "calls.parent_position": "how many of the parent's calls preceded this segment's first call",
    "calls.continues_call": "the call whose conversation (and token ids, when served) this call extends",
    "calls.tools_absent": "the input or output holds tool calls or results, but the request defined no tools "
                          "(Codex with its own default model): no training row can show the model their "
                          "definitions; null for calls recorded without a parsed exchange",
    "calls.malformed_tool_calls": "serve mode: call-shaped spans of the generated text that did not parse as a "
                                  "tool call in the policy's format and were answered as text; null for calls "
                                  "no forgerl gateway served (or recorded before schema v4)",
    "outcomes.status": "success | failed (graded, reward < 1 or harness error) | timeout | infra_error "
                       "(never scored: retried, then discarded from training and pass@k)",
    "outcomes.reward": "weighted mean of the graded parts, in [0, 1]; null for infra_error",
    "outcomes.passed": "reward == 1.0 (QwenClawBench's pass rule, used by pass@k / pass^k)",
    "outcomes.scores": "JSON object: every per-check score the grader returned",
    "outcomes.graded": "JSON object: which parts were graded (automated, judge) and which were not",
}


def _feature(dtype: pa.DataType) -> datasets.features.FeatureType:
    import datasets

    if pa.types.is_list(dtype):
        return datasets.List(_feature(dtype.value_type))
    if pa.types.is_timestamp(dtype):
        return datasets.Value("timestamp[us, tz=UTC]")
    return datasets.Value(str(dtype) if not pa.types.is_binary(dtype) else "binary")


def features(table: str) -> datasets.Features:
    """The `datasets.Features` that match a table's Arrow schema exactly."""
    import datasets

    return datasets.Features({f.name: _feature(f.type) for f in TABLES[table]})
