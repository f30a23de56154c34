"""Tool definitions reach veRL exactly as the harness sent them (`forge-convert --to verl-sft`).

The dataset is written through the recorder's codecs and the real
`DatasetWriter`: the real tool sets of OpenClaw (Chat Completions), Claude
Code (Anthropic) and Codex (Responses, its `additional_tools` item), captured
from their requests (tests/tool_sets/README.md), and a seeded corpus of
generated JSON schemas with the shapes a Parquet struct column cannot hold,
spread over the three APIs and the rows of one shard. Every row is loaded
through veRL's own `create_sft_dataset` with the class the converter's config
names, and its text and ids are checked against the documented mapping and
`forge-convert --to tokens`.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from forgerl.recorder.apis import anthropic, chat, responses
from forgerl.schema.records import CallRecord
from forgerl.schema.writer import DatasetWriter

from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows

TOOL_SETS = Path(__file__).parent / "tool_sets"
CODECS = {"chat": chat.ChatCodec(), "anthropic": anthropic.AnthropicCodec(), "responses": responses.ResponsesCodec()}
PATHS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}
SESSIONS = 45
TOOLS_PER_SESSION = 7

# values of every JSON type, for enum / default / const / examples and tool call arguments
MIXED = [0, 1, -3, 2.5, 1.0, 1e-07, 10**20, "a", "ünï €", "", None, True, False, [], [1, "x", None], {},
         {"k": 1, "": [2.0]}, {"nested": {"deep": {}}}]
NAMES = ["path", "mode", "limit", "query", "x", "flags", "items", "opts", "n", "ratio", "ünïcode"]


def _shuffled(rng: random.Random, d: dict[str, Any]) -> dict[str, Any]:
    """The same keys in another order: the order must survive too."""
    return dict(rng.sample(list(d.items()), len(d)))


def nasty_schema(rng: random.Random, depth: int = 0, kind: str | None = None) -> dict[str, Any]:
    """A JSON Schema mixing what one Arrow type cannot hold: empty objects, optional keys, `type` as string or
    list, mixed-type enum/default/const/examples, int vs float bounds, patternProperties."""
    kind = kind or rng.choice(["object", "object", "string", "number", "integer", "array", "boolean", "multi"])
    s: dict[str, Any] = {"type": rng.sample(["string", "number", "null", "integer", "boolean"], rng.randint(2, 3))
                         if kind == "multi" else kind}
    if rng.random() < 0.6:
        s["description"] = rng.choice(["", "A value.", "Zürich → 東京, \"quoted\" and \\ slashed", "line\nbreak"])
    for key, chance in (("enum", 0.3), ("examples", 0.2)):
        if rng.random() < chance:
            s[key] = rng.sample(MIXED, rng.randint(1, 4))
    for key, chance in (("default", 0.3), ("const", 0.1)):
        if rng.random() < chance:
            s[key] = rng.choice(MIXED)
    if kind in ("number", "integer", "multi") and rng.random() < 0.7:
        bound = rng.choice(["minimum", "maximum", "exclusiveMinimum", "multipleOf"])
        s[bound] = rng.choice([0, 1, 1.0, 0.5, -2, 10**20])  # int vs float
    if kind == "object":
        props = {name: nasty_schema(rng, depth + 1) if depth < 2 else {}
                 for name in rng.sample(NAMES, rng.randint(0, 4))}
        s["properties"] = props
        if props and rng.random() < 0.5:
            s["required"] = rng.sample(sorted(props), rng.randint(1, len(props)))
        if rng.random() < 0.7:
            s["additionalProperties"] = rng.choice([False, True, {}, {"type": "string"}])
        if rng.random() < 0.3:
            s["patternProperties"] = rng.choice([{"^.*$": {}}, {"^x-": {"type": "integer"}, "^y": {}}])
    if kind == "array":
        s["items"] = rng.choice([{}, nasty_schema(rng, depth + 1) if depth < 2 else {"type": "string"}])
    if depth < 2 and rng.random() < 0.1:
        s["anyOf"] = [nasty_schema(rng, depth + 1), {"type": "null"}]
    return _shuffled(rng, s)


def generated_tool(rng: random.Random, api: str, name: str) -> dict[str, Any]:
    """One tool of `api`'s wire shape around a generated schema, with optional keys present or not."""
    definition: dict[str, Any] = {"name": name}
    if rng.random() < 0.8:
        definition["description"] = rng.choice(["Does a thing.", "", "Ünïcode tool: äöü ✓"])
    definition["input_schema" if api == "anthropic" else "parameters"] = nasty_schema(rng, kind="object")
    if rng.random() < 0.5:
        definition["strict"] = rng.choice([True, False])
    if api == "anthropic" and rng.random() < 0.3:
        definition["cache_control"] = {"type": "ephemeral"}
    definition = _shuffled(rng, definition)
    if api == "chat":
        return {"type": "function", "function": definition}
    if api == "responses":
        return {"type": "function", **definition}
    return {"type": "custom", **definition} if rng.random() < 0.2 else definition


def chat_shape(api: str, wire: dict[str, Any]) -> dict[str, Any]:
    """The documented mapping (schema/chat.py), written out for the test: Chat tools verbatim; the others
    as `{"type": T, T: definition}` with their keys in order."""
    if api == "chat":
        return wire
    kind = wire.get("type")
    if api == "anthropic":
        kind = "function" if kind in (None, "custom") else kind
        return {"type": kind, kind: {("parameters" if k == "input_schema" else k): v for k, v in wire.items()
                                     if k not in ("type", "cache_control")}}
    definition = {k: v for k, v in wire.items() if k != "type"}
    return {"type": kind, kind: definition if "name" in definition else {"name": kind, **definition}}


# -- wire bodies of one call: system + user in, one tool call out ---------------------------------

def request_body(api: str, tools: list[dict[str, Any]], task: str) -> dict[str, Any]:
    system = "You are a careful agent."
    if api == "chat":
        return {"model": "qwen3", "messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": task}], "tools": tools}
    if api == "anthropic":
        return {"model": "qwen3", "max_tokens": 1024, "system": system, "tools": tools,
                "messages": [{"role": "user", "content": task}]}
    return {"model": "qwen3", "instructions": system, "tools": tools,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}]}


def response_body(api: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(arguments, ensure_ascii=False)
    if api == "chat":
        call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": text}}
        return {"id": "c", "object": "chat.completion", "model": "qwen3", "choices": [
            {"index": 0, "finish_reason": "tool_calls",
             "message": {"role": "assistant", "content": "On it.", "tool_calls": [call]}}]}
    if api == "anthropic":
        return {"id": "m", "type": "message", "role": "assistant", "model": "qwen3", "stop_reason": "tool_use",
                "content": [{"type": "text", "text": "On it."},
                            {"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}]}
    return {"id": "r", "object": "response", "status": "completed", "model": "qwen3", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it."}]},
        {"type": "function_call", "call_id": "call_1", "name": name, "arguments": text}]}


def tool_set(name: str) -> list[dict[str, Any]]:
    return json.loads((TOOL_SETS / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def tool_data(tmp_path_factory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    """The dataset, and each session's tools in chat shape as the mapping says they must reach veRL."""
    rng = random.Random(20261203)
    sessions: list[tuple[str, str, str, dict[str, Any]]] = [
        ("openclaw", "openclaw", "chat", request_body("chat", tool_set("openclaw"), "List the files.")),
        ("claude-code", "claude-code", "anthropic", request_body("anthropic", tool_set("claude_code"), "Count.")),
    ]
    codex = request_body("responses", [], "Write proof.txt")
    del codex["tools"]  # Codex 0.171 sends its tools in an input item instead
    codex["input"].insert(0, {"type": "additional_tools", "id": "at_1", "role": "developer",
                              "tools": tool_set("codex")})
    sessions.append(("codex", "codex", "responses", codex))
    for s in range(SESSIONS):
        api = ("chat", "anthropic", "responses")[s % 3]
        tools = [generated_tool(rng, api, f"tool_{s}_{k}") for k in range(TOOLS_PER_SESSION)]
        sessions.append((f"gen-{s:03d}", "generated", api, request_body(api, tools, f"Task {s}: use the tools.")))
    expected: dict[str, list[dict[str, Any]]] = {}
    root = tmp_path_factory.mktemp("verl-tools") / "data"
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    with DatasetWriter(root, flush_interval=3600) as writer:
        for n, (sid, harness, api, body) in enumerate(sessions):
            wire = body.get("tools") or body["input"][0]["tools"]
            expected[sid] = [chat_shape(api, tool) for tool in wire]
            codec = CODECS[api]
            exchange = codec.parse_request(json.loads(json.dumps(body)))
            arguments = {name: rng.choice(MIXED) for name in rng.sample(NAMES, 3)}
            codec.parse_response(response_body(api, "tool_0", arguments), exchange)
            writer.add_session(sid, harness=harness)
            writer.add_call(CallRecord(call_id=f"{sid}-0", session_id=sid, api=api, method="POST", path=PATHS[api],
                                       t_start=t0 + timedelta(seconds=n), status=200, complete=True,
                                       request_raw=json.dumps(body).encode(), exchange=exchange,
                                       seq=writer.next_seq()))
    assert sum(len(t) for sid, t in expected.items() if sid.startswith("gen-")) >= 300
    return root, expected


def _json(tools: list[dict[str, Any]] | None) -> list[str]:
    """Each tool as the template's `tojson` writes it (key order counts, unlike `==` on dicts)."""
    return [json.dumps(tool, ensure_ascii=False) for tool in tools or []]


def test_every_tool_reaches_verl_exactly(tool_data, tmp_path):
    from omegaconf import OmegaConf
    from verl.trainer.sft_trainer import create_sft_dataset

    root, expected = tool_data
    manifest = convert(root, tmp_path / "sft", "--to", "verl-sft")
    convert(root, tmp_path / "tok", "--to", "tokens", "--tokens-from", "template", "--tokenizer", TOKENIZER_DIR)
    ours = {r["sample_id"]: r for r in rows(tmp_path / "tok")}
    assert "verl_sft_rows_padded" not in manifest["counts"]
    data = OmegaConf.load(tmp_path / "sft" / "verl_config.yaml").data
    (shard,) = data.train_files  # every shape in the rows of one shard
    assert str(pq.read_schema(shard).field("tools").type) == "string"
    data.ignore_input_ids_mismatch = True  # Qwen3's whole render adds <think></think> to the last turn
    data.max_length = 1 << 20
    tokenizer = qwen_tokenizer()
    ds = create_sft_dataset(list(data.train_files), data, tokenizer, None)
    assert type(ds).__name__ == "ForgeSFTDataset"
    sample_ids = ds.dataframe["sample_id"].tolist()
    assert sorted(sample_ids) == sorted(ours) and len(sample_ids) == len(expected)
    exact = 0
    for i, sample_id in enumerate(sample_ids):
        tools = expected[ds.dataframe["session_id"].iloc[i]]
        assert _json(ds.tools[i]) == _json(tools), sample_id
        item = ds[i]
        text = tokenizer.decode(item["input_ids"])
        missing = [t for t in _json(tools) if t not in text]
        assert not missing, f"{sample_id}: {len(missing)} tools not in veRL's text, first {missing[0][:200]}"
        assert item["input_ids"].tolist() == ours[sample_id]["input_ids"], sample_id
        assert item["loss_mask"].tolist() == ours[sample_id]["loss_mask"], sample_id
        exact += 1
    assert exact == len(expected) == SESSIONS + 3


def test_chat_tools_come_back_verbatim():
    """OpenClaw's real tools through the chat codec and the mapping: the very objects it sent, key order kept."""
    from forgerl.schema.chat import chat_tools

    wire = tool_set("openclaw")
    exchange = CODECS["chat"].parse_request(request_body("chat", wire, "hi"))
    assert _json(chat_tools(exchange.tools)) == _json(wire)
    assert any("patternProperties" in t for t in _json(wire))  # the shape that crashed pyarrow


def test_stock_dataset_class_refuses_the_json_column(tool_data, tmp_path):
    """Without the custom class veRL stops at the first row instead of training without tools."""
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    root, _ = tool_data
    convert(root, tmp_path / "sft", "--to", "verl-sft", "--harness", "openclaw")
    files = sorted(str(p) for p in (tmp_path / "sft").glob("train/*.parquet"))
    stock = MultiTurnSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 1 << 20,
                                                         "ignore_input_ids_mismatch": True})
    with pytest.raises(ValueError, match="[Tt]ool"):
        stock[0]
