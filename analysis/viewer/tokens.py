"""A segment as the training sample `forge-convert --to tokens` makes of it, token by token, and where it drifts.

Nothing here re-implements the converters: the session's calls become the
converters' `Call`/`Session` objects, `segment_session` and `samples` cut the
thread sample, `engine_tokens` gives the engine's ids and loss mask and, with
a tokenizer, `template_tokens` the ids veRL's re-rendering gives.
Drift is where those two sequences differ (aligned with difflib), each
difference named by `drift.classify`.
"""

from __future__ import annotations

import difflib
from typing import Any

import duckdb
import numpy as np

from forgerl.converters.drift import classify
from forgerl.converters.samples import samples
from forgerl.converters.source import CALL_COLUMNS, TOKEN_COLUMNS, Call, Session
from forgerl.converters.threads import segment_session
from forgerl.converters.tokens import Renderer, TokenSample, engine_tokens, has_engine_ids, template_tokens
from forgerl.schema.records import MessageMemo

from .queries import NotFound

_CONTEXT = 8  # tokens either side of a difference that `classify` sees
_DTYPES = {"prompt_token_ids": np.int32, "completion_token_ids": np.int32, "completion_logprobs": np.float32}


def _calls(con: duckdb.DuckDBPyConnection, session_id: str, segment: int) -> list[dict[str, Any]]:
    """The segment's calls as the converters read them (token lists as numpy arrays)."""
    cur = con.execute(f"SELECT {', '.join(CALL_COLUMNS)} FROM calls WHERE session_id = $sid "
                      "AND segment_index = $seg ORDER BY t_start, seq, call_id", {"sid": session_id, "seg": segment})
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    for row in rows:
        for name in TOKEN_COLUMNS:
            if row[name] is not None:
                row[name] = np.asarray(row[name], dtype=_DTYPES[name])
    return rows


def _side(ts: TokenSample | None, renderer: Renderer | None) -> dict[str, Any] | None:
    if ts is None:
        return None
    ids = [int(i) for i in ts.input_ids]
    out: dict[str, Any] = {"ids": ids, "mask": [int(m) for m in ts.loss_mask], "retokenized": ts.retokenized}
    if renderer is not None:
        out["text"] = renderer.tokenizer.backend_tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return out


def drift(engine: list[int], rendered: list[int], renderer: Renderer) -> list[dict[str, Any]]:
    """Each stretch where the engine's ids and the re-rendered ids differ, with its kind."""
    decode = renderer.tokenizer.decode
    out = []
    matcher = difflib.SequenceMatcher(None, engine, rendered, autojunk=len(engine) > 4000)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        kind, _ = classify(decode(engine[max(0, i1 - _CONTEXT): i2 + _CONTEXT]),
                           decode(rendered[max(0, j1 - _CONTEXT): j2 + _CONTEXT]))
        out.append({"engine": [i1, i2], "rendered": [j1, j2], "kind": kind})
    return out


def token_view(con: duckdb.DuckDBPyConnection, session_id: str, segment: int, renderer: Renderer | None) -> dict[str, Any]:
    """The segment's thread sample: engine ids and mask (when every call has them), the re-rendered ids and
    mask (with a tokenizer), and the drift between them."""
    rows = _calls(con, session_id, segment)
    if not rows:
        raise NotFound(f"no segment {segment} in session {session_id!r}")
    parts = dict(con.execute("SELECT part_hash, any_value(part) FROM messages WHERE session_id = $sid GROUP BY 1",
                             {"sid": session_id}).fetchall())
    memo = MessageMemo()
    session = Session(session_id, None, [Call(row, parts, memo) for row in rows])
    (seg,) = segment_session(session)
    (sample,) = samples(session, [seg], "thread")
    engine = engine_tokens(sample) if has_engine_ids(sample) else None
    rendered = template_tokens(renderer, sample) if renderer is not None else None
    view = {"session_id": session_id, "segment": segment, "reason": seg.reason, "calls": len(seg.calls),
            "engine": _side(engine, renderer), "rendered": _side(rendered, renderer),
            "template_consistent": None if rendered is None else rendered.template_consistent,
            "tokenizer": renderer is not None, "drift": None}
    if engine is not None and rendered is not None:
        view["drift"] = drift(view["engine"]["ids"], view["rendered"]["ids"], renderer)
    return view
