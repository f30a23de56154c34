"""What the viewer reads, as DuckDB queries that page: the sessions index, one session, one call, raw bytes, blobs.

The sessions list is one small table per session (`INDEX_SQL`, built on first
use from the `session_info`, `session_costs` and `outcomes` views), paged by
keyset on the chosen sort key, so opening a page of a 1M-call dataset reads
~50 rows of it. Everything else is filtered by session id, which DuckDB
pushes into the Parquet scans (row groups hold runs of sessions). One
connection serves every request under a lock: the views' lookup tables are
registered on that connection only.

A call's page leads with what the call adds: `call` says how many of its
input messages repeat an earlier call's conversation (`repeated_history`),
so the page folds them.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import duckdb

from forgerl.errors import UserError
from forgerl.recorder.images import fill_images, image_size, restore_request
from forgerl.schema import duck
from forgerl.schema.records import MessageMemo, call_forms, call_messages, decompress
from forgerl.schema.segments import message_key, stored_segments, succeeded

from ..views import register

SORTS = {"time": "time_key", "cost": "cost_key", "reward": "reward_key"}
FILTERS = ("harness", "model", "task", "outcome", "policy_version")
PAGE = 50
# The views these queries read, with the views they read (binding every view costs seconds on a big dataset).
VIEWS_READ = frozenset({"session_info", "session_costs", "call_costs", "turns", "tool_calls", "tool_results"})
_FACET_LIMIT = 500
INLINE_BASE64 = 4096  # a raw request shows an image's base64 up to this many characters, else the image's size

# The latest outcome row of each session (a retried attempt supersedes the first).
INDEX_SQL = """
CREATE TABLE _viewer_sessions AS
WITH c AS (
  SELECT session_id, min(t_start) AS started, max(coalesce(t_end, t_start)) AS ended, count(*) AS calls,
         count(*) FILTER (WHERE error IS NOT NULL OR coalesce(status, 0) >= 400 OR NOT coalesce(complete, false))
           AS failed_calls
  FROM calls GROUP BY 1),
o AS (
  SELECT session_id, status AS outcome, reward FROM outcomes
  QUALIFY row_number() OVER (PARTITION BY session_id ORDER BY attempt DESC NULLS LAST, t_end DESC NULLS LAST) = 1),
s AS (SELECT session_id, labels FROM sessions)
SELECT i.session_id, i.harness, i.model, i.task, o.outcome, o.reward, i.policy_version, s.labels,
       c.started, c.ended, coalesce(c.calls, 0) AS calls, coalesce(c.failed_calls, 0) AS failed_calls,
       k.input_tokens, k.output_tokens, k.cache_read_tokens, k.cache_write_tokens, coalesce(k.cost_usd, 0) AS cost_usd,
       coalesce(epoch(c.started), 0) AS time_key, coalesce(k.cost_usd, 0) AS cost_key,
       coalesce(o.reward, -1) AS reward_key
FROM session_info i LEFT JOIN c USING (session_id) LEFT JOIN o USING (session_id)
LEFT JOIN s USING (session_id) LEFT JOIN session_costs k USING (session_id)
"""

LIST_COLUMNS = ("session_id", "harness", "model", "task", "outcome", "reward", "policy_version", "labels", "started",
                "calls", "failed_calls", "cost_usd")

CALL_COLUMNS = ("call_id", "seq", "api", "status", "error", "complete", "streamed", "t_start", "t_first_byte", "t_end",
                "model_requested", "model_returned", "stop_reason", "input_tokens", "output_tokens",
                "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "policy_version", "segment_index",
                "segment_reason", "parent_segment", "parent_position", "continues_call", "tools_absent")
_CALLS_SQL = f"""
SELECT {', '.join(CALL_COLUMNS)}, cost_usd, unpriced
FROM call_costs WHERE session_id = $sid ORDER BY t_start, seq, call_id
"""
_CONVERSATION = ("call_id", "input_refs", "input_msg", "input_roles", "input_extra", "output_refs", "output_msg",
                 "output_roles", "output_extra")
_CALL_DETAIL = ("session_id", "t_start", "seq", "segment_index", "continues_call", *_CONVERSATION, "request_params",
                "tools", "request_headers", "response_headers", "method", "path", "upstream")
# The conversation of each segment's latest call before a given call (a segment's later calls extend its
# earlier ones, so its latest holds every prefix the segment can share), or of the call the given one continues.
_EARLIER_SQL = f"""
SELECT {', '.join(_CONVERSATION)} FROM calls
WHERE session_id = $sid AND segment_index IS NOT NULL AND call_id <> $cid
  AND (CASE WHEN $continues IS NULL
            THEN t_start < $t OR (t_start = $t AND (seq < $seq OR (seq = $seq AND call_id < $cid)))
            ELSE call_id = $continues END)
QUALIFY row_number() OVER (PARTITION BY segment_index ORDER BY t_start DESC, seq DESC, call_id DESC) = 1
"""
# The session's tool calls in the order the model made them (turn, then position in the output), each with
# whether its result failed (`tool_results.failed`; NULL: no result came back) and a short target: a shell
# call's command line, else the file it names, else the view's target (a pattern, URL or the tool's name).
_TOOL_CALLS_SQL = """
SELECT tc.call_id, tc.tool_call_id, tc.tool_name, tc.via, tc.kind,
       left(CASE WHEN tc.kind = 'shell' THEN coalesce(tc.command_line, tc.target)
                 ELSE coalesce(tc.path, tc.target) END, 300) AS target,
       tc.check_kind, tc.writes_file, tr.failed, tr.exit_code
FROM tool_calls tc LEFT JOIN tool_results tr USING (session_id, call_key)
WHERE tc.session_id = $sid ORDER BY tc.step
"""


class NotFound(LookupError):
    """No such session, call or blob: the server answers 404."""


class BadRequest(UserError):
    """A request parameter the viewer cannot read (a sort, a number, a page cursor): the server answers 400."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and value != value:
        return None
    return value


def _records(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [{n: _jsonable(v) for n, v in zip(names, row)} for row in cur.fetchall()]


def encode_cursor(key: Any, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([key, session_id]).encode()).decode()


def decode_cursor(text: str) -> tuple[Any, str]:
    try:
        key, session_id = json.loads(base64.urlsafe_b64decode(text.encode()))
    except (ValueError, TypeError):  # not base64, not JSON or not a pair: the cursor was not one we wrote
        raise BadRequest(f"bad page cursor {text!r}") from None
    if isinstance(key, bool) or not isinstance(key, (int, float)) or not isinstance(session_id, str):
        raise BadRequest(f"bad page cursor {text!r}")  # every sort key is a number
    return key, session_id


def group_segments(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored thread segments of a session's calls (in call order), by index: each with its reason, the
    segment it came from and its calls' ids. Calls that hold no model turn have no segment and are left out."""
    return [{"index": s.index, "reason": s.reason, "parent": s.parent, "parent_position": s.parent_position,
             "calls": [c["call_id"] for c in s.calls]} for s in stored_segments(calls)]


def repeated_history(inputs: Sequence[tuple], earlier: Sequence[tuple[str, Sequence[tuple]]],
                     key: Callable[[tuple], str]) -> tuple[int, str | None]:
    """How many leading input messages (stored forms) repeat an earlier call's conversation (its input, then
    its output), and which call's: the longest such prefix. Forms are compared as stored, then by `key`
    (a harness may drop earlier reasoning or move cache hints when it resends history)."""
    best, best_call = 0, None
    for call_id, conversation in earlier:
        n = 0
        for mine, theirs in zip(inputs, conversation):
            if mine != theirs and key(mine) != key(theirs):
                break
            n += 1
        if n > best:
            best, best_call = n, call_id
    return best, best_call


def _as_sent(stored: bytes, blobs: dict[str, tuple[bytes, str | None]]) -> bytes | None:
    """A stored request as sent, every image put back from `blobs`; None when some image's bytes were not kept."""
    unkept: list[str | None] = []
    fill_images(stored, lambda digest: None if digest in blobs else unkept.append(digest))
    return None if unkept else restore_request(stored, lambda digest: blobs[digest][0])


class Dataset:
    """A dataset opened for the viewer: every query it answers, one at a time."""

    def __init__(self, root: str | os.PathLike, *, threads: int | None = None):
        self.root = root
        self.con = register(duck.connect(root, threads=threads), names=VIEWS_READ)
        self.lock = threading.Lock()
        self._indexed = False

    def _query(self, sql: str, params: dict[str, Any] | None = None, *, index: bool = False) -> list[dict[str, Any]]:
        """Rows of `sql` as dicts; `index`: the query reads `_viewer_sessions`, built here on first use."""
        with self.lock:
            if index and not self._indexed:
                self.con.execute(INDEX_SQL)
                self._indexed = True
            return _records(self.con.execute(sql, params or {}))

    def facets(self) -> dict[str, list[Any]]:
        """The values each list filter can take (the most frequent first), and the label key=value pairs."""
        out: dict[str, list[Any]] = {}
        for name in FILTERS:
            rows = self._query(f"SELECT {name} AS v, count(*) AS n FROM _viewer_sessions WHERE {name} IS NOT NULL "
                               f"GROUP BY 1 ORDER BY n DESC, v LIMIT {_FACET_LIMIT}", index=True)
            out[name] = [r["v"] for r in rows]
        rows = self._query(
            "SELECT k || '=' || json_extract_string(labels, '$.\"' || k || '\"') AS v, count(*) AS n FROM "
            "(SELECT labels, unnest(json_keys(labels)) AS k FROM _viewer_sessions WHERE labels IS NOT NULL "
            "AND json_type(labels) = 'OBJECT') GROUP BY 1 ORDER BY n DESC, v LIMIT " + str(_FACET_LIMIT), index=True)
        out["label"] = [r["v"] for r in rows if r["v"] is not None]
        return out

    def sessions(self, filters: dict[str, str], sort: str = "time", descending: bool = True,
                 after: str | None = None, limit: int = PAGE) -> dict[str, Any]:
        """One page of the sessions list, filtered and sorted; `next` is the cursor of the page after it."""
        if sort not in SORTS:
            raise BadRequest(f"unknown sort {sort!r}; choose one of: {', '.join(SORTS)}")
        key = SORTS[sort]
        where, params = ["TRUE"], {}
        for name in FILTERS:
            if filters.get(name):
                where.append(f"{name} = ${name}")
                params[name] = filters[name]
        if filters.get("label"):
            label_key, _, label_value = filters["label"].partition("=")
            where.append("json_extract_string(labels, '$.\"' || $label_key || '\"') = $label_value")
            params.update(label_key=label_key, label_value=label_value)
        if filters.get("q"):
            where.append("(strpos(lower(session_id), $q) > 0 OR strpos(lower(task), $q) > 0 OR session_id IN "
                         "(SELECT DISTINCT session_id FROM messages WHERE strpos(lower(text), $q) > 0 "
                         "OR strpos(lower(arguments), $q) > 0 OR strpos(lower(tool_name), $q) > 0))")
            params["q"] = filters["q"].lower()
        cmp = "<" if descending else ">"
        if after:
            params["after_key"], params["after_id"] = decode_cursor(after)
            where.append(f"({key} {cmp} $after_key OR ({key} = $after_key AND session_id {cmp} $after_id))")
        order = "DESC" if descending else "ASC"
        rows = self._query(f"SELECT {', '.join(LIST_COLUMNS)}, {key} AS _key FROM _viewer_sessions "
                           f"WHERE {' AND '.join(where)} ORDER BY {key} {order}, session_id {order} "
                           f"LIMIT {int(limit) + 1}", params, index=True)
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = encode_cursor(rows[-1]["_key"], rows[-1]["session_id"]) if more else None
        for r in rows:
            del r["_key"]
        return {"sessions": rows, "next": cursor}

    def session(self, session_id: str) -> dict[str, Any]:
        """The session's row of the index, its calls in order (narrow columns, cost) and its segments."""
        info = self._query("SELECT * EXCLUDE (time_key, cost_key, reward_key) FROM _viewer_sessions "
                           "WHERE session_id = $sid", {"sid": session_id}, index=True)
        if not info:
            raise NotFound(f"no session {session_id!r}")
        calls = self._query(_CALLS_SQL, {"sid": session_id})
        for n, call in enumerate(calls, 1):
            call["turn"] = n
            call["ok"] = succeeded(call)
        outcome = self._query("SELECT * EXCLUDE (writer_id) FROM outcomes WHERE session_id = $sid "
                              "ORDER BY attempt DESC NULLS LAST, t_end DESC NULLS LAST LIMIT 1", {"sid": session_id})
        return {"session": info[0], "outcome": outcome[0] if outcome else None, "calls": calls,
                "segments": group_segments(calls), "tool_calls": self._query(_TOOL_CALLS_SQL, {"sid": session_id})}

    def _call_row(self, call_id: str, session_id: str | None, columns: tuple[str, ...]) -> dict[str, Any]:
        """A call's columns; with its session id the scan skips the row groups of other sessions."""
        where, params = "call_id = $cid", {"cid": call_id}
        if session_id:
            where, params = where + " AND session_id = $sid", {**params, "sid": session_id}
        with self.lock:
            cur = self.con.execute(f"SELECT {', '.join(columns)} FROM calls WHERE {where} LIMIT 1", params)
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        if row is None:
            raise NotFound(f"no call {call_id!r}")
        return dict(zip(names, row))

    def call(self, call_id: str, session_id: str | None = None) -> dict[str, Any]:
        """One call's messages (input and output, rebuilt from the session's parts), how many of its input
        messages repeat an earlier call's conversation (`repeated`, from call `repeats`), tools, params,
        headers, and which of its tool results failed (the analysis definition, `tool_results.failed`)."""
        row = self._call_row(call_id, session_id, _CALL_DETAIL)
        sid = row["session_id"]
        earlier = self._query(_EARLIER_SQL, {"sid": sid, "cid": call_id, "t": row["t_start"], "seq": row["seq"],
                                             "continues": row["continues_call"]})
        refs = sorted({*row["input_refs"], *row["output_refs"],
                       *(ref for e in earlier for ref in (*e["input_refs"], *e["output_refs"]))})
        parts = {r["part_hash"]: r["part"] for r in self._query(
            "SELECT part_hash, any_value(part) AS part FROM messages WHERE session_id = $sid "
            "AND list_contains($refs, part_hash) GROUP BY 1", {"sid": sid, "refs": refs})}
        failed = {r["tool_call_id"]: r for r in self._query(
            "SELECT tool_call_id, failed, exit_code FROM tool_results WHERE session_id = $sid", {"sid": sid})}
        memo, keys = MessageMemo(), {}

        def key(form: tuple) -> str:
            if form not in keys:
                keys[form] = message_key(memo.message(form, parts))
            return keys[form]

        conversations = [(e["call_id"], call_forms(e, "input") + call_forms(e, "output")) for e in earlier]
        repeated, repeats = repeated_history(call_forms(row, "input"), conversations, key)
        messages = {d: [m.to_dict() for m in call_messages(row, parts, d, memo)] for d in ("input", "output")}
        return {"call_id": call_id, "session_id": sid, **messages, "repeated": repeated, "repeats": repeats,
                "tools": json.loads(row["tools"]) if row["tools"] else [],
                "request_params": json.loads(row["request_params"]) if row["request_params"] else None,
                "request_headers": json.loads(row["request_headers"]) if row["request_headers"] else None,
                "response_headers": json.loads(row["response_headers"]) if row["response_headers"] else None,
                "method": row["method"], "path": row["path"], "upstream": row["upstream"],
                "tool_results": {k: {"failed": v["failed"], "exit_code": v["exit_code"]} for k, v in failed.items()}}

    def raw(self, call_id: str, session_id: str | None = None) -> dict[str, Any]:
        """The request as the harness sent it and the response as received (both redacted when recorded), as
        text. The recorder stores each image of a request once, as a blob, and a reference in its place: each
        is put back, and one whose base64 is longer than `INLINE_BASE64` is shown as its size instead (the
        whole request: `request`). Images it kept no bytes of are named as such, never as their reference."""
        row = self._call_row(call_id, session_id, ("session_id", "request_raw", "response_raw"))
        response = None if row["response_raw"] is None else decompress(row["response_raw"]).decode("utf-8", "replace")
        if row["request_raw"] is None:
            return {"request_raw": None, "response_raw": response, "images": [], "request_bytes": None}
        stored = decompress(row["request_raw"])
        blobs = self._blobs(row["session_id"], stored)
        images: list[dict[str, Any]] = []

        def shown(digest: str | None) -> bytes:
            data, media = blobs.get(digest, (None, None)) if digest else (None, None)
            image = {"n": len(images) + 1, "blob_hash": digest, "media_type": media, "kept": data is not None}
            images.append(image)
            if data is None:
                why = "dropped (forge-record --images drop)" if digest is None else \
                    f"sha256:{digest}, its bytes not kept (forge-record --images hash-only)"
                return f"[image {image['n']}: {why}; its base64 was sent here]".encode()
            encoded, size = base64.b64encode(data), image_size(data)
            image.update(bytes=len(data), width=size and size[0], height=size and size[1],
                         inline=len(encoded) <= INLINE_BASE64)
            if image["inline"]:
                return encoded
            dims = f" {size[0]}x{size[1]}" if size else ""
            return (f"[image {image['n']}: {media or 'image'}{dims}, {len(data):,} bytes; its {len(encoded):,} "
                    f"base64 characters were sent here]").encode()

        text = fill_images(stored, shown).decode("utf-8", "replace")
        sent = _as_sent(stored, blobs)
        return {"request_raw": text, "response_raw": response, "images": images,
                "request_bytes": None if sent is None else len(sent)}

    def request(self, call_id: str, session_id: str | None = None) -> bytes:
        """The request's bytes as the harness sent them (redacted when recorded), every kept image put back."""
        row = self._call_row(call_id, session_id, ("session_id", "request_raw"))
        if row["request_raw"] is None:
            raise NotFound(f"call {call_id!r} has no stored request")
        stored = decompress(row["request_raw"])
        sent = _as_sent(stored, self._blobs(row["session_id"], stored))
        if sent is None:
            raise NotFound(f"call {call_id!r}: the request as sent is not stored, some of its images' bytes were "
                           f"not kept (forge-record --images hash-only or drop)")
        return sent

    def _blobs(self, session_id: str, stored: bytes) -> dict[str, tuple[bytes, str | None]]:
        """The session's blobs a stored request refers to: hash -> (bytes, media type)."""
        hashes: list[str] = []
        fill_images(stored, lambda digest: hashes.append(digest) if digest else None)
        if not hashes:
            return {}
        rows = self._query("SELECT blob_hash, any_value(data) AS data, any_value(media_type) AS media_type FROM blobs "
                           "WHERE session_id = $sid AND list_contains($hashes, blob_hash) GROUP BY 1",
                           {"sid": session_id, "hashes": sorted(set(hashes))})
        return {r["blob_hash"]: (r["data"], r["media_type"]) for r in rows if r["data"] is not None}

    def blob(self, session_id: str, blob_hash: str) -> tuple[bytes, str]:
        """An image's bytes and media type."""
        with self.lock:
            row = self.con.execute("SELECT data, media_type FROM blobs WHERE session_id = $sid AND blob_hash = $h "
                                   "LIMIT 1", {"sid": session_id, "h": blob_hash}).fetchone()
        if row is None:
            raise NotFound(f"no blob {blob_hash!r} in session {session_id!r}")
        return row[0], row[1] or "application/octet-stream"
