"""veRL rows: multi-turn SFT (`MultiTurnSFTDataset`) and RL prompts (`RLHFDataset`), plus config snippets.

SFT rows are thread samples only: veRL puts loss on every assistant message
of a row, so per-call rows would train each turn once per later call.
A Parquet column holds one Arrow type, and JSON Schema is not one: empty
objects cannot be stored, keys present in one row and absent in another are
padded with nulls (which the template then prints), `type`, `enum` or
`default` values of mixed types cannot share a column, ints become floats.
So `tools` is the JSON text of what the template gets (`chat_tools`, or
null when none are offered), decoded by `forgerl.trainer.sft_dataset`,
the dataset class the config names (`data.custom_cls`); tool call arguments
are JSON strings, which the template prints as it would the dict.
"""

from __future__ import annotations

import json
from typing import Any

from forgerl.schema.chat import chat_tools, to_chat_messages

from .samples import Sample
from .tokens import chat_of

# veRL's data.custom_cls (path, name) for verl-sft shards: MultiTurnSFTDataset decoding the JSON `tools` column
SFT_DATASET_CLASS = ("pkg://forgerl.trainer.sft_dataset", "ForgeSFTDataset")

SFT_CONFIG = """\
# forge-convert --to verl-sft: veRL 0.9.1 SFT trainer keys (flat under data.)
data:
  train_files: {train}
  val_files: {val}
  custom_cls:
    path: {dataset_path}
    name: {dataset_name}
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


def sft_row(sample: Sample, images: list[bytes]) -> dict[str, Any]:
    """One MultiTurnSFTDataset row; `images` (their bytes, in placeholder order) only for rows that have images
    (veRL then needs a processor and qwen_vl_utils).

    `trained_messages` lists the chat messages this segment's calls generated: veRL's stock class trains
    every assistant message, so a segment that inherits earlier answers (a subagent's parent history, a
    token break, a compaction) would train them again; `ForgeSFTDataset` masks the others, as `tokens` does.
    """
    prov = sample.provenance()
    chat, ranges = chat_of(sample)
    row: dict[str, Any] = {
        "messages": chat,
        "trained_messages": sorted(j for i in sample.trained for j in range(*ranges[i])),
        "tools": json.dumps(chat_tools(sample.tools) or None, ensure_ascii=False),
        "enable_thinking": sample.enable_thinking,
        **{k: prov[k] for k in ("sample_id", "session_id", "segment_id", "segment_reason", "parent_segment",
                                "harness", "model", "reward")},
    }
    if images:
        row["images"] = [{"bytes": data} for data in images]
    return row


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

