"""What was captured, for people: `forge-record ls`, `show`, and the summary after `run`.

Reads through `forgerl.schema.duck.connect`, the one DuckDB view of a dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

from forgerl import printer
from forgerl.errors import UserError
from forgerl.schema.duck import connect

SESSION_SQL = """
SELECT c.session_id,
       coalesce(any_value(s.harness), 'unknown') AS harness,
       count(*) AS calls,
       min(c.t_start) AS started,
       max(coalesce(c.t_end, c.t_start)) AS ended,
       coalesce(sum(c.input_tokens), 0) AS input_tokens,
       coalesce(sum(c.output_tokens), 0) AS output_tokens,
       coalesce(sum(c.cache_read_tokens), 0) AS cache_read,
       coalesce(sum(c.cache_write_tokens), 0) AS cache_write,
       count(*) FILTER (WHERE c.error IS NOT NULL) AS errors
FROM calls c LEFT JOIN sessions s USING (session_id)
{where}
GROUP BY c.session_id ORDER BY started
"""

TOOLS_SQL = """
SELECT m.tool_name, count(*) AS n
FROM (SELECT DISTINCT session_id, part_hash, tool_name FROM messages
      WHERE part_type = 'tool_call' AND direction = 'output') m
WHERE m.session_id = ? GROUP BY 1 ORDER BY n DESC, 1
"""


def sessions(root: str | Path, session_id: str | None = None) -> list[dict]:
    con = connect(root)
    where = "WHERE c.session_id = ?" if session_id else ""
    cur = con.execute(SESSION_SQL.format(where=where), [session_id] if session_id else [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def format_sessions(rows: list[dict]) -> str:
    """`forge-record ls`: one line per session."""
    if not rows:
        return "no sessions recorded"
    headers = ["session", "harness", "calls", "in", "out", "cache r/w", "err", "started"]
    body = [[r["session_id"], r["harness"], r["calls"], r["input_tokens"], r["output_tokens"],
             f"{r['cache_read']}/{r['cache_write']}", r["errors"], f"{r['started']:%Y-%m-%d %H:%M:%S}"] for r in rows]
    return printer.text(printer.table(headers, body, left={"session", "harness", "started"}))


def summarise_session(root: str | Path, session_id: str) -> str:
    """One screen: totals, tools used, errors."""
    rows = sessions(root, session_id)
    if not rows:
        return f"session {session_id}: no calls recorded"
    r = rows[0]
    con = connect(root)
    tools = con.execute(TOOLS_SQL, [session_id]).fetchall()
    errors = con.execute("SELECT path, status, error FROM calls WHERE session_id = ? AND error IS NOT NULL "
                         "ORDER BY t_start", [session_id]).fetchall()
    seconds = (r["ended"] - r["started"]).total_seconds()
    lines = [
        f"session {session_id} ({r['harness']}): {r['calls']} calls in {seconds:.1f}s",
        f"  tokens: {r['input_tokens']} in, {r['output_tokens']} out, "
        f"{r['cache_read']} cache read, {r['cache_write']} cache write",
        "  tools: " + (", ".join(f"{name} x{n}" for name, n in tools) if tools else "none"),
        f"  errors: {len(errors)}",
    ]
    lines += [f"    {path} {status}: {error}" for path, status, error in errors[:10]]
    return "\n".join(lines)


SHOW_SQL = """
SELECT call_id, seq, t_start, api, path, status, model_requested, model_returned, stop_reason,
       input_tokens, output_tokens, cache_read_tokens, error, streamed, output_refs,
       epoch_ms(t_first_byte) - epoch_ms(t_start) AS ttfb_ms, epoch_ms(t_end) - epoch_ms(t_start) AS total_ms
FROM calls WHERE session_id = ? ORDER BY t_start, seq
"""


def show_session(root: str | Path, session_id: str) -> str:
    """Every call of a session with its tool calls and failed tool results, like `llm logs`."""
    con = connect(root)
    calls = con.execute(SHOW_SQL, [session_id]).fetchall()
    if not calls:
        raise UserError(f"no session {session_id!r} in {root}")
    names = [d[0] for d in con.description]
    parts = {h: (t, name, args, text, err) for h, t, name, args, text, err in con.execute(
        "SELECT part_hash, part_type, tool_name, arguments, text, is_error FROM messages WHERE session_id = ?",
        [session_id]).fetchall()}
    out = [summarise_session(root, session_id), ""]
    for row in calls:
        c = dict(zip(names, row))
        timing = f"ttfb {c['ttfb_ms']}ms total {c['total_ms']}ms" if c["ttfb_ms"] is not None else ""
        out.append(f"## {c['t_start']:%H:%M:%S} {c['api']} {c['path']} -> {c['status']} "
                   f"{c['model_returned'] or c['model_requested'] or ''} {timing}".rstrip())
        out.append(f"   tokens {c['input_tokens']} in / {c['output_tokens']} out"
                   f" (cache read {c['cache_read_tokens']}), stop {c['stop_reason']}"
                   f"{', streamed' if c['streamed'] else ''}")
        if c["error"]:
            out.append(f"   ERROR {c['error']}")
        for h in c["output_refs"] or []:
            ptype, name, args, text, _ = parts.get(h, ("?", None, None, None, None))
            if ptype == "tool_call":
                out.append(f"   -> {name}({_short(args, 100)})")
            elif ptype == "text" and text:
                out.append(f"   {_short(text, 160)}")
    errors = [p for p in parts.values() if p[0] == "tool_result" and p[4]]
    if errors:
        out.append("")
        out.append(f"failed tool results: {len(errors)}")
        out += [f"   {_short(p[3], 160)}" for p in errors[:10]]
    return "\n".join(out)


def _short(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def dumps(rows: list[dict]) -> str:
    return json.dumps(rows, default=str, indent=2)
