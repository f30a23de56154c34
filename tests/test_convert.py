"""forge-convert on chat-completions sessions recorded through the real recorder with the openai SDK.

The upstream answers like vLLM with the real Qwen3 template ids, so the
`tokens` output can be checked token for token against what the engine saw,
and veRL's own datasets load the verl-sft / verl-rl outputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from forgerl.converters import drift, source
from forgerl.converters.cli import main
from forgerl.schema.chat import chat_tools
from forgerl.schema import store, writer

from conftest import session_calls
from convert_fixtures import TOKENIZER_DIR, chat_dataset, convert, qwen_tokenizer, rows  # noqa: F401 - fixture


@pytest.fixture
def chat_data(chat_dataset: Path) -> Path:
    return chat_dataset


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer()


def calls_of(root: Path, session: str) -> list[dict]:
    return session_calls(root, session, 1)


def test_thread_tokens_are_the_engine_ids(chat_data, tmp_path):
    manifest = convert(chat_data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--drift", "all")
    by_id = {r["sample_id"]: r for r in rows(tmp_path / "t")}
    calls = calls_of(chat_data, "chat-tools")
    first, second = calls
    # the tool loop merges into one sample: call 2's prompt extends call 1's prompt + completion
    row = by_id["chat-tools:0"]
    assert not row["retokenized"] and row["call_ids"] == [c["call_id"] for c in calls]
    assert row["input_ids"] == second["prompt_token_ids"] + second["completion_token_ids"]
    head = len(first["prompt_token_ids"])
    mask = row["loss_mask"]
    assert mask[:head] == [0] * head
    assert mask[head:head + len(first["completion_token_ids"])] == [1] * len(first["completion_token_ids"])
    tail = len(second["completion_token_ids"])
    assert mask[-tail:] == [1] * tail and sum(mask) == len(first["completion_token_ids"]) + tail
    assert row["logprobs"][-tail:] == pytest.approx(second["completion_logprobs"])
    assert row["logprobs"][0] is None
    # multi-turn chat with reasoning: Qwen3 drops earlier <think> when re-rendering, so the engine's
    # later prompts do not extend the earlier ids: the stored segments are cut there (token_break),
    # one token sample per call, never merged
    parts = sorted(k for k in by_id if k.startswith("chat-multi:"))
    assert parts == ["chat-multi:0", "chat-multi:1", "chat-multi:2"]
    assert [by_id[k]["segment_reason"] for k in parts] == ["start", "token_break", "token_break"]
    assert [by_id[k]["parent_segment"] for k in parts] == [None, "chat-multi:0", "chat-multi:1"]
    drift = manifest["drift"]
    assert drift["prompt_rerender"] == {"checked": 5, "differ": 0, "rate": 0.0, "where": {}}
    assert drift["history_rerender"]["differ"] == 2 and drift["history_rerender"]["where"] == {"stripped_think": 2}
    assert drift["thread_breaks"] == 2
    example = next(e for e in drift["examples"] if e["check"] == "history_rerender")
    assert "<think>" in example["engine"] and "<think>" not in example["rendered"]
    # no engine ids recorded: rendered with the template and flagged
    # by default only each segment's last call is re-rendered: one prompt and one history check per thread
    quick = convert(chat_data, tmp_path / "q", "--to", "tokens", "--tokenizer", TOKENIZER_DIR)["drift"]
    assert quick["prompt_rerender"]["checked"] == 2 and quick["history_rerender"]["where"] == {"stripped_think": 1}
    assert by_id["chat-plain:0"]["retokenized"] and by_id["chat-plain:0"]["template_consistent"] is False
    assert manifest["counts"]["engine_ids"] == 4 and manifest["counts"]["retokenized"] == 1
    assert manifest["tokenizer"]["sha256"] and manifest["input"]["schema_version"] == 4


def test_drift_report_samples_segments_by_default(chat_data, tmp_path, monkeypatch):
    """The default re-renders the first SAMPLE_FIRST segments, then 1 in SAMPLE_EVERY; `last` re-renders all."""
    monkeypatch.setattr(drift, "SAMPLE_FIRST", 1)
    monkeypatch.setattr(drift, "SAMPLE_EVERY", 1 << 40)  # no segment id hashes into the sample
    sampled = convert(chat_data, tmp_path / "s", "--to", "tokens", "--tokenizer", TOKENIZER_DIR)["drift"]
    # chat-tools:0 and chat-multi's three segments (cut at its two token breaks) carry engine ids
    assert sampled["sampling"] == {"mode": "sample", "segments_with_engine_ids": 4, "segments_checked": 1,
                                   "first": 1, "then_one_in": 1 << 40}
    assert sampled["prompt_rerender"]["checked"] == 1
    every = convert(chat_data, tmp_path / "l", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--drift", "last")
    assert every["drift"]["sampling"] == {"mode": "last", "segments_with_engine_ids": 4, "segments_checked": 4}
    assert every["drift"]["prompt_rerender"]["checked"] == 4 and every["options"]["drift"] == "last"


def test_sessions_are_read_in_ranges_that_fit_the_memory_limit(chat_data, tmp_path, monkeypatch):
    """Ranges of sessions sized from the footers give the same rows as one pass over everything."""
    whole = convert(chat_data, tmp_path / "w", "--to", "tokens", "--tokenizer", TOKENIZER_DIR)
    monkeypatch.setattr(source, "_SORT_SHARE", 1 << 40)  # a budget under one call: a range per session
    sessions = whole["counts"]["sessions_read"]
    assert sessions > 1 and len(source._session_ranges(chat_data, source.connect(chat_data))) == sessions
    ranged = convert(chat_data, tmp_path / "r", "--to", "tokens", "--tokenizer", TOKENIZER_DIR)
    assert ranged["counts"] == whole["counts"] and ranged["drift"] == whole["drift"]
    assert rows(tmp_path / "r") == rows(tmp_path / "w")


def test_per_call_tokens(chat_data, tmp_path):
    convert(chat_data, tmp_path / "p", "--to", "tokens", "--mode", "per-call", "--tokenizer", TOKENIZER_DIR)
    by_id = {r["sample_id"]: r for r in rows(tmp_path / "p")}
    assert len(by_id) == 7
    for k, call in enumerate(calls_of(chat_data, "chat-multi")):
        row = by_id[f"chat-multi:{k}/0"]  # each call its own segment: the ids break between them
        assert row["input_ids"] == call["prompt_token_ids"] + call["completion_token_ids"]
        assert row["loss_mask"] == [0] * len(call["prompt_token_ids"]) + [1] * len(call["completion_token_ids"])


def test_verl_sft_loads_in_verl_with_the_same_ids(chat_data, tmp_path, tokenizer):
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    convert(chat_data, tmp_path / "sft", "--to", "verl-sft", "--tokenizer", TOKENIZER_DIR)
    convert(chat_data, tmp_path / "tok", "--to", "tokens", "--tokens-from", "template", "--tokenizer", TOKENIZER_DIR)
    ours = {r["sample_id"]: r for r in rows(tmp_path / "tok")}
    files = sorted(str(p) for p in (tmp_path / "sft").glob("train/*.parquet"))
    config = {"pad_mode": "no_padding", "max_length": 8192, "ignore_input_ids_mismatch": True}
    lenient = ForgeSFTDataset(list(files), tokenizer, config)
    strict = ForgeSFTDataset(list(files), tokenizer, {**config, "ignore_input_ids_mismatch": False})
    sample_ids = lenient.dataframe["sample_id"].tolist()
    expected_tools = {s: chat_tools(json.loads(calls_of(chat_data, s)[-1]["tools"] or "[]"))
                      for s in ("chat-tools", "chat-multi", "chat-plain")}
    assert sorted(sample_ids) == sorted(ours)
    for i, sample_id in enumerate(sample_ids):
        item = lenient[i]
        row = ours[sample_id]
        session = lenient.dataframe["session_id"].iloc[i]
        assert lenient.tools[i] == (expected_tools[session] or None)  # two differently-keyed schemas, unpadded
        assert item["input_ids"].tolist() == row["input_ids"]
        assert item["loss_mask"].tolist() == row["loss_mask"]
        # veRL's sanity check passes exactly where ours says the template is consistent
        try:
            strict[i]
            passed = True
        except AssertionError:
            passed = False
        assert passed == row["template_consistent"]
    # Qwen3 adds an empty <think> block to the last turn only when rendering the whole conversation:
    # veRL's check fails on every row, and the drift report says why
    sanity = json.loads((tmp_path / "tok" / "manifest.json").read_text())["drift"]["verl_sanity"]
    assert sanity["checked"] == len(ours) == 5 and sanity["where"] == {"stripped_think": 5}  # chat-multi: 3 segments
    config_text = (tmp_path / "sft" / "verl_config.yaml").read_text()
    assert "messages_key: messages" in config_text and files[0] in config_text and "ForgeSFTDataset" in config_text


def test_verl_rl_loads_in_rlhf_dataset(chat_data, tmp_path, tokenizer):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    convert(chat_data, tmp_path / "rl", "--to", "verl-rl", "--agent-name", "forgerl_harness")
    files = sorted(str(p) for p in (tmp_path / "rl").glob("train/*.parquet"))
    ds = RLHFDataset(files, tokenizer, OmegaConf.create({"max_prompt_length": 4096,
                                                         "cache_dir": str(tmp_path / "cache")}))
    assert len(ds) == 3
    items = [ds[i] for i in range(len(ds))]
    tools_item = next(it for it in items if it["extra_info"]["session_id"] == "chat-tools")
    assert tools_item["raw_prompt"] == [{"role": "system", "content": "You are a weather bot."},
                                        {"role": "user", "content": "What is the weather in Paris?"}]
    assert tools_item["agent_name"] == "forgerl_harness" and tools_item["data_source"].startswith("forgerl/")
    assert "get_weather" in tools_item["extra_info"]["tools"]


def test_atif_trajectories_validate(chat_data, tmp_path):
    import atif

    convert(chat_data, tmp_path / "a", "--to", "atif")
    docs = [json.loads(p.read_text()) for p in (tmp_path / "a").glob("train/*.json")]
    assert len(docs) == 3
    for doc in docs:
        atif.Trajectory.model_validate(doc)
    tools = next(d for d in docs if d["session_id"] == "chat-tools")
    agent_steps = [s for s in tools["steps"] if s["source"] == "agent"]
    assert agent_steps[0]["tool_calls"][0]["function_name"] == "get_weather"
    assert agent_steps[0]["observation"]["results"][0]["content"] == "sunny, 21 C"
    assert agent_steps[0]["metrics"]["completion_token_ids"] and agent_steps[0]["reasoning_content"]


def test_filters_split_and_dedupe(chat_data, tmp_path):
    m = convert(chat_data, tmp_path / "f1", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--min-turns", "2")
    assert {r["session_id"] for r in rows(tmp_path / "f1")} == {"chat-tools", "chat-plain"}
    assert m["dropped"] == {"fewer turns than --min-turns": 3}  # chat-multi's three token-break segments
    # outcomes: only graded sessions with a reward pass --min-reward
    data = tmp_path / "graded"
    shutil.copytree(chat_data, data)
    with writer.DatasetWriter(data) as w:
        w.add_outcome({"session_id": "chat-tools", "task_id": "weather", "attempt": 1, "status": "success",
                       "reward": 1.0, "passed": True})
        w.add_outcome({"session_id": "chat-multi", "task_id": "colours", "attempt": 1, "status": "failed",
                       "reward": 0.25, "passed": False})
    convert(data, tmp_path / "f2", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--min-reward", "0.5")
    kept = rows(tmp_path / "f2")
    assert {r["session_id"] for r in kept} == {"chat-tools"} and kept[0]["reward"] == 1.0
    convert(data, tmp_path / "f3", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--outcome", "failed")
    assert {r["session_id"] for r in rows(tmp_path / "f3")} == {"chat-multi"}
    convert(data, tmp_path / "f5", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--since", "2000-01-01")
    assert main([str(data), "--out", str(tmp_path / "f4"), "--to", "tokens", "--tokenizer", TOKENIZER_DIR,
                 "--until", "2001-01-01", "--no-progress"]) == 2
    assert not (tmp_path / "f4").exists()
    # split by session: deterministic, and a session never straddles train and val
    a = [main([str(chat_data), "--out", str(tmp_path / f"s{i}"), "--to", "tokens", "--tokenizer", TOKENIZER_DIR,
               "--mode", "per-call", "--val-fraction", "0.5", "--no-progress"]) for i in (1, 2)]
    assert a == [0, 0]
    sides = [{(p.parent.name, r) for p in (tmp_path / f"s{i}").glob("*/*.parquet")
              for r in pq.read_table(p, columns=["session_id"]).column(0).to_pylist()} for i in (1, 2)]
    assert sides[0] == sides[1]
    assert len({sid for _, sid in sides[0]}) == len(sides[0])
    # dedupe: the same calls twice in a dataset give one sample
    twice = tmp_path / "twice"
    shutil.copytree(chat_data, twice)
    for path in (twice / "calls").glob("*.parquet"):
        shutil.copy(path, path.with_name("copy-" + path.name))
    m = convert(twice, tmp_path / "d", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--mode", "per-call")
    assert m["counts"]["duplicates_dropped"] == 7 and m["counts"]["rows_train"] == 7


def test_verl_sft_refuses_per_call(chat_data, tmp_path, capsys):
    assert main([str(chat_data), "--out", str(tmp_path / "x"), "--to", "verl-sft", "--mode", "per-call"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "per-call" in err and not (tmp_path / "x").exists()


def test_screenshots_become_verl_images_and_blob_refs(scripted, recorder, tmp_path):
    """A GUI agent's screenshot (Anthropic SDK, base64 image block) reaches veRL's multimodal columns.

    The columns and placeholders are checked here as veRL's `_build_messages` reads them; test_vl_rows.py
    loads such rows through veRL with a Qwen2.5-VL processor.
    """
    import base64
    import hashlib
    import io

    import anthropic
    from PIL import Image

    from scripted_upstream import Turn
    from vl_checks import vl_tokenizer_dir

    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(buf, format="PNG")
    png = buf.getvalue()
    up = scripted(lambda request: Turn(text="I see a red screen."))
    rec = recorder(up.url)
    client = anthropic.Anthropic(base_url=rec.base("gui"), api_key="sk-ant-api03-convertimagetest", max_retries=0)
    client.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is on screen?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(png).decode()}}]}])
    session_calls(tmp_path / "data", "gui", 1)
    rec.stop()
    convert(tmp_path / "data", tmp_path / "sft", "--to", "verl-sft")
    convert(tmp_path / "data", tmp_path / "tok", "--to", "tokens", "--tokenizer", str(vl_tokenizer_dir(tmp_path / "v")))
    (mm,) = (tmp_path / "sft").glob("train/mm-*.parquet")  # image rows get shards of their own
    (row,) = pq.read_table(mm).to_pylist()
    placeholders = sum(m["content"].count("<image>") for m in row["messages"])
    assert placeholders == len(row["images"]) == 1
    assert row["images"][0]["bytes"] == png
    assert Image.open(io.BytesIO(row["images"][0]["bytes"])).size == (8, 6)
    (tok_row,) = rows(tmp_path / "tok")
    assert tok_row["images"] == [hashlib.sha256(png).hexdigest()]
