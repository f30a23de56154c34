"""veRL rows: multi-turn SFT (`MultiTurnSFTDataset`) and RL prompts (`RLHFDataset`), plus config snippets.

SFT rows are thread samples only: veRL puts loss on every assistant message
of a row, so per-call rows would train each turn once per later call. Tool
call arguments are JSON strings (what the template's `tojson` writes for the
dict): a Parquet column cannot hold differently-keyed dicts without padding
them with null keys, which would then be rendered. The same padding hits the
JSON schemas in the `tools` column (a Parquet limit, not ours to lift):
`padded_rows` counts the rows it changes, reported in the manifest, and those
rows' veRL ids differ from `tokens` in the tool section only. Empty objects in
schemas (Claude Code's `additionalProperties: {}`) cannot be stored at all and
are dropped, which means the same in JSON Schema; such rows count as padded too.
"""

from __future__ import annotations

import json
from typing import Any

from forgerl.schema.chat import chat_tools, to_chat_messages

from .samples import Sample

SFT_CONFIG = """\
# forge-convert --to verl-sft: veRL 0.9.1 SFT trainer keys (flat under data.)
data:
  train_files: {train}
  val_files: {val}
  messages_key: messages
  tools_key: tools
  enable_thinking_key: enable_thinking
  image_key: images
  pad_mode: no_padding
  truncation: error
  max_length: {max_length}
"""

RL_CONFIG = """\
# forge-convert --to verl-rl: veRL 0.9.1 RL trainer keys
data:
  train_files: {train}
  val_files: {val}
  prompt_key: prompt
  max_prompt_length: {max_length}
  filter_overlong_prompts: true
  return_raw_chat: true
actor_rollout_ref:
  rollout:
    agent:
      default_agent_loop: {agent}
"""


def sft_row(sample: Sample, blobs: dict[str, bytes]) -> tuple[dict[str, Any], bool]:
    """One MultiTurnSFTDataset row, and whether its tool schemas had to change to fit Parquet.

    `images` only for rows that have images (veRL then needs a processor).
    """
    prov = sample.provenance()
    tools = chat_tools(sample.tools)
    storable = _without_empty_objects(tools)
    row: dict[str, Any] = {
        "messages": to_chat_messages(sample.messages, arguments="json"),
        "tools": storable,  # never null: veRL hands the value to the template as is
        "enable_thinking": sample.enable_thinking,
        **{k: prov[k] for k in ("sample_id", "session_id", "segment_id", "segment_reason", "parent_segment",
                                "harness", "model", "reward")},
    }
    refs = sample.images
    if refs:
        row["images"] = [{"bytes": blobs.get(ref)} for ref in refs]
    return row, storable != tools


def _without_empty_objects(value: Any) -> Any:
    """Drop keys whose value is `{}`: Parquet has no struct without fields, and in a JSON schema an
    empty object (`additionalProperties: {}`, `properties: {}`, `items: {}`) means the same as absent."""
    if isinstance(value, dict):
        return {k: _without_empty_objects(v) for k, v in value.items() if v != {}}
    if isinstance(value, list):
        return [_without_empty_objects(v) for v in value]
    return value


def rl_row(sample: Sample, agent_name: str, index: int) -> dict[str, Any] | None:
    """The task as veRL RL sees it: the first call's input up to its first model turn, for online rollouts."""
    first = sample.calls[0]
    prompt = []
    for message in first.input:
        if message.role == "assistant":
            break
        prompt.append(message)
    chat = [{"role": m["role"], "content": m["content"]} for m in to_chat_messages(prompt) if m["role"] in
            ("system", "user")]
    if not any(m["role"] == "user" for m in chat):
        return None
    outcome = sample.session.outcome or {}
    task_id = outcome.get("task_id") or ""
    harness = sample.session.harness or "unknown"
    return {
        "data_source": f"forgerl/{harness}",
        "prompt": chat,
        "agent_name": agent_name,
        "reward_model": {"style": "rule", "ground_truth": task_id},
        "extra_info": {"index": index, "task_id": task_id, "harness": harness,
                       "session_id": sample.session.session_id, "segment_id": sample.segment.segment_id,
                       "model": sample.provenance()["model"], "recorded_reward": sample.session.reward,
                       "tools": json.dumps(chat_tools(first.tools), ensure_ascii=False)},
    }



def padded_rows(rows: list[dict[str, Any]], table: Any) -> int:
    """Rows whose tools do not read back as written (Arrow struct padding adds null keys, which `tojson`
    renders). Null keys added to messages are harmless: templates test them with `is defined and not none`."""
    read = table.select(["messages", "tools"]).to_pylist()
    return sum(1 for row, back in zip(rows, read)
               if back["tools"] != row["tools"] or _without_nulls(back["messages"]) != row["messages"])


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
