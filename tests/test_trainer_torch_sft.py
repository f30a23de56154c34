"""`forge-train sft --engine torch`: the torch loop on real `forge-convert --to tokens` shards, its checkpoint,
logits only at the loss positions, and the loss-span check that refuses broken masks.

The shards come from sessions recorded through the real recorder (`convert_fixtures.chat_dataset`): a tool
loop and a multi-turn chat with engine ids, and a chat retokenized with the template, cut in thread and
per-call mode. Faults are injected by rewriting the shards' masks (`faults/loss_masks.py`). Shared-prefix
training is checked against row-by-row training on the same rows: the per-call rows of a session share their
earlier turns.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from forgerl.converters.tokenizer import load_tokenizer
from forgerl.schema.templates import POLICY_FILE, folder_template_sha256
from forgerl.trainer import torch_model
from forgerl.trainer.cli import main as forge_train
from forgerl.trainer.shard_checks import ChatMarkers, check_loss_spans, first_bad
from forgerl.trainer.sft_loop import SftRow, lr_factor, plan, prefix_groups, sft_rows, step_gradient, train
from forgerl.trainer.torch_model import loss_logits, random_qwen3, save_checkpoint, token_logprobs

from convert_fixtures import TOKENIZER_DIR, chat_dataset, convert  # noqa: F401 - chat_dataset is a fixture
from faults.loss_masks import nothing, rewrite_masks, shifted, tool_results

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def shards(chat_dataset, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torch-sft")
    out = {}
    for name, args in {"thread": ("--to", "tokens", "--tokenizer", TOKENIZER_DIR),
                       "per-call": ("--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--mode", "per-call"),
                       "verl-sft": ("--to", "verl-sft", "--tokenizer", TOKENIZER_DIR)}.items():
        convert(chat_dataset, root / name, *args)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def markers() -> ChatMarkers:
    return ChatMarkers.of(load_tokenizer(TOKENIZER_DIR))


def refusal(capsys, *argv: str) -> str:
    """forge-train's one-line refusal of `argv` (exit 2)."""
    assert forge_train(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("forge-train: "), err
    return err


def test_real_rows_of_both_paths_pass_the_loss_span_check(shards, markers):
    for mode in ("thread", "per-call"):
        rows = sft_rows(shards[mode])
        kinds = {r["retokenized"] for r in pq.read_table(shards[mode] / "train").to_pylist()}
        assert kinds == {True, False}  # engine ids and template renders both
        assert check_loss_spans(((r.where, r.ids, r.mask) for r in rows), markers) == len(rows) > 0
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    assert (markers.start, markers.end) == tuple(tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]))
    assert markers.after_end == tuple(tok.encode("\n"))


@pytest.mark.parametrize("by", [1, -1])
def test_a_mask_shifted_by_one_token_is_refused(shards, tmp_path, capsys, by):
    bad = rewrite_masks(shards["thread"], tmp_path / "shifted", shifted(by))
    first = sft_rows(shards["thread"])[0]
    err = refusal(capsys, "sft", "--engine", "torch", "--data", str(bad), "--out", str(tmp_path / "ck"),
                  "--random-qwen3")
    where = first.where.replace(str(shards["thread"]), str(bad))
    assert err.startswith(f"forge-train: {where}: ") and "the shard is refused" in err
    assert f"(position {first.mask.index(1) + by})" in err
    assert not (tmp_path / "ck").exists()


def test_tool_results_in_the_mask_are_refused(shards, tmp_path, capsys, markers):
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    response = tok.convert_tokens_to_ids("<tool_response>")
    bad = rewrite_masks(shards["per-call"], tmp_path / "tools", tool_results(response, markers.start, markers.end))
    rows = sft_rows(bad)
    [(n, row)] = [(n, r) for n, r in enumerate(rows) if response in r.ids][:1]
    assert all(first_bad(r.ids, r.mask, markers) is None for r in rows[:n])  # the first refused row holds the result
    turn = max(i for i in range(row.ids.index(response)) if row.ids[i] == markers.start)
    err = refusal(capsys, "sft", "--engine", "torch", "--data", str(bad), "--out", str(tmp_path / "ck"),
                  "--random-qwen3")
    assert f"{row.where}: loss starts inside the turn at position {turn} ('<|im_start|>user\\n<tool_response>" in err
    assert f"(position {turn + 1})" in err


def test_bad_input_is_one_line(shards, tmp_path, capsys):
    run = ("sft", "--engine", "torch", "--out", str(tmp_path / "ck"), "--random-qwen3", "--data")
    assert "no such folder" in refusal(capsys, *run, str(tmp_path / "nope"))
    err = refusal(capsys, *run, str(shards["verl-sft"]))
    assert "verl-sft shards; --engine torch trains on tokens shards: forge-convert DATASET --to tokens" in err
    empty = rewrite_masks(shards["thread"], tmp_path / "empty", nothing)
    assert "no row has loss tokens" in refusal(capsys, *run, str(empty))
    assert "no row fits --max-length 8" in refusal(capsys, *run, str(shards["thread"]), "--max-length", "8")
    assert not (tmp_path / "ck").exists()
    err = refusal(capsys, "sft", "--data", str(shards["thread"]), "--model", str(tmp_path), "--dry-run")
    assert "tokens shards; veRL's SFT trains on verl-sft shards" in err
    assert refusal(capsys, "sft", "--data", str(shards["thread"]), "--random-qwen3").endswith(
        "--random-qwen3 is for --engine torch")
    assert refusal(capsys, "sft", "--engine", "torch", "--data", str(shards["thread"]), "--random-qwen3",
                   "--dry-run").endswith("--dry-run is for --engine verl")
    assert "--model DIR or --random-qwen3" in refusal(capsys, "sft", "--engine", "torch", "--data",
                                                      str(shards["thread"]))


def test_loss_position_logits_equal_the_full_logits(shards):
    model = random_qwen3(64, 2, torch.float32).eval()
    rows = sft_rows(shards["thread"])[:2]
    width = max(len(r.ids) for r in rows)
    ids = torch.tensor([r.ids + [0] * (width - len(r.ids)) for r in rows])
    attention = torch.tensor([[1] * len(r.ids) + [0] * (width - len(r.ids)) for r in rows])
    targets = torch.tensor([r.mask + [0] * (width - len(r.mask)) for r in rows]) > 0
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=attention).logits.float()
        picked = loss_logits(model, ids, attention, targets)
        logprobs = token_logprobs(model, ids, attention, targets)
    shifted_targets = targets[:, 1:]
    assert picked.shape == (int(targets.sum()), full.shape[-1])
    torch.testing.assert_close(picked, full[:, :-1][shifted_targets], rtol=1e-5, atol=1e-5)
    want = torch.log_softmax(full[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * shifted_targets
    torch.testing.assert_close(logprobs[:, 1:], want, rtol=1e-5, atol=1e-5)
    assert not logprobs[:, 0].any() and not logprobs[~targets].any()


def test_training_is_seeded_and_the_checkpoint_gives_the_same_logits(shards, tmp_path):
    rows = sft_rows(shards["thread"])
    steps = plan(rows, seed=3, batch_tokens=200, steps=4)
    assert steps == plan(rows, seed=3, batch_tokens=200, steps=4) != plan(rows, seed=4, batch_tokens=200, steps=4)
    assert all(sum(len(rows[i].ids) for i in s) <= 200 or len(s) == 1 for s in steps)
    trained = []
    for _ in range(2):
        torch.manual_seed(0)
        model = random_qwen3(64, 2, torch.float32, seed=0).train()
        losses = train(rows, steps, model, 1e-2, "cpu", log=lambda line: None)
        trained.append(model)
    a, b = (m.state_dict() for m in trained)
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same order: the same weights
    assert losses[-1] < losses[0]
    save_checkpoint(trained[0].eval(), tmp_path / "ck", Path(TOKENIZER_DIR), {"policy_version": "v1"})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    assert loaded.dtype == torch.float32
    ids = torch.tensor([rows[0].ids])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, trained[0](input_ids=ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path / "ck").chat_template


def test_forge_train_sft_torch_writes_a_checkpoint(shards, tmp_path):
    """The real verb, as a process: v0 (`--steps 0`, the untrained model), then v1 trained from it."""
    base = [str(BIN / "forge-train"), "sft", "--engine", "torch", "--data", str(shards["thread"])]
    r = subprocess.run([*base, "--out", str(tmp_path / "v0"), "--random-qwen3", "--steps", "0", "--policy-version",
                        "v0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*base, "--out", str(tmp_path / "v1"), "--model", str(tmp_path / "v0"), "--steps", "6",
                        "--lr", "1e-2", "--batch-tokens", "400"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert any(int(line.split()[11]) > 0 for line in r.stdout.splitlines() if line.startswith("step "))  # shared
    whole = subprocess.run([*base, "--out", str(tmp_path / "v1-whole"), "--model", str(tmp_path / "v0"), "--steps",
                            "6", "--lr", "1e-2", "--batch-tokens", "400", "--no-share-prefix"],
                           capture_output=True, text=True, timeout=300)
    steps = [line.split() for line in whole.stdout.splitlines() if line.startswith("step ")]
    assert whole.returncode == 0 and all(s[11] == "0" for s in steps), whole.stderr
    assert [float(s[3]) for s in steps] == pytest.approx(losses, abs=1e-4)
    manifest = json.loads((shards["thread"] / "manifest.json").read_text())
    v0, v1 = (json.loads((tmp_path / v / POLICY_FILE).read_text()) for v in ("v0", "v1"))
    assert (v0["policy_version"], v0["parent"], v0["steps"], v0["loss_first"]) == ("v0", None, 0, None)
    assert v0["base"] == "random-qwen3 64/2" and v1["base"] == str((tmp_path / "v0").resolve())
    assert (v1["policy_version"], v1["parent"], v1["engine"], v1["dtype"], v1["seed"], v1["steps"]) == (
        "v1", "v0", "torch", "float32", 0, 6)
    assert [v1["loss_first"], v1["loss_last"]] == pytest.approx([losses[0], losses[-1]], abs=1e-4)
    assert v1["tokenizer_sha256"] == manifest["tokenizer"]["sha256"]
    assert v1["chat_template_sha256"] == folder_template_sha256(TOKENIZER_DIR)
    assert folder_template_sha256(tmp_path / "v1") == v1["chat_template_sha256"]
    assert v1["shards"] == [str((shards["thread"] / "manifest.json").resolve())]
    assert v1["seconds"] > 0 and v1["peak_rss_mb"] > 100
    for name in torch_model.TOKENIZER_FILES:
        assert (tmp_path / "v1" / name).exists() == (Path(TOKENIZER_DIR) / name).exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "v1")
    assert model.dtype == torch.float32 and model.config.eos_token_id == 151645
    assert torch_model.POLICY_FILE == POLICY_FILE  # the loops run without forgerl, so they name it themselves


def gradients(rows: list[SftRow], share_prefix: int) -> tuple[float, dict[str, torch.Tensor]]:
    """One step over every row from the same seeded model: its loss and each parameter's gradient."""
    model = random_qwen3(64, 2, torch.float32, seed=0).train()
    loss, trained, shared = step_gradient(rows, list(range(len(rows))), model, "cpu", share_prefix)
    assert trained == sum(sum(r.mask[1:]) for r in rows) and (shared > 0) == (share_prefix > 0)
    return loss, {name: p.grad for name, p in model.named_parameters()}


def assert_same_step(rows: list[SftRow], share_prefix: int) -> None:
    (alone, want), (shared, got) = gradients(rows, 0), gradients(rows, share_prefix)
    assert shared == pytest.approx(alone, rel=1e-6)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=name)


def test_shared_prefix_rows_get_the_row_by_row_gradient(shards):
    """Rows that share a prefix P with remainders of 1, 5 and many tokens, loss inside P and right after it (the
    last prefix position predicts each row's own next token), and a row sharing nothing, which trains alone."""
    real = max(sft_rows(shards["thread"]), key=lambda r: len(r.ids))
    cut = len(real.ids) // 2
    ids, mask = real.ids, [1 if i in range(cut - 6, cut - 2) else m for i, m in enumerate(real.mask)]
    rows = [SftRow("whole", ids, mask),
            SftRow("one after", ids[:cut] + [ids[cut] + 1], mask[:cut] + [1]),
            SftRow("five after", ids[:cut] + [t + 2 for t in ids[cut:cut + 5]], [0] * cut + [1, 1, 0, 1, 1]),
            SftRow("apart", [ids[0] + 3] + ids[1:], real.mask)]
    groups = prefix_groups(rows, [0, 1, 2, 3], 8)
    assert sorted((prefix, sorted(group)) for prefix, group in groups) == [(0, [3]), (cut, [0, 1, 2])]
    assert prefix_groups(rows, [0, 1, 2, 3], 0) == [(0, [i]) for i in sorted(range(4), key=lambda i: rows[i].ids)]
    assert_same_step(rows, 8)


def test_real_per_call_rows_share_their_earlier_turns(shards):
    rows = sft_rows(shards["per-call"])
    groups = prefix_groups(rows, list(range(len(rows))), 32)
    assert any(prefix >= 32 and len(group) > 1 for prefix, group in groups)
    assert any(len(rows[i].ids) == prefix + 1 for prefix, group in groups for i in group)  # a row one past it
    assert_same_step(rows, 32)


def test_a_short_shared_prefix_does_not_shrink_a_long_one():
    long = list(range(100, 400))
    for tail in (7, 999):  # the short sharer sorts before the long pair, then after it
        rows = [SftRow("a", long + [1], [0] * 300 + [1]), SftRow("b", long + [2], [0] * 300 + [1]),
                SftRow("c", long[:40] + [tail] * 50, [0] * 89 + [1]), SftRow("d", long[:40] + [tail] * 60, [1] * 100)]
        assert sorted(prefix_groups(rows, [0, 1, 2, 3], 32)) == [(89, [2, 3]), (300, [0, 1])]
        assert sorted(prefix_groups(rows, [0, 1, 2, 3], 100)) == [(0, [2]), (0, [3]), (300, [0, 1])]


def test_the_warmup_rises_then_decays_to_zero():
    assert [lr_factor(n, 10, None) for n in range(10)] == [1.0] * 10
    rate = [lr_factor(n, 12, 2) for n in range(12)]
    assert rate[:3] == [0.5, 1.0, 1.0] and rate[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 9 / 10)))
    assert all(a > b for a, b in zip(rate[2:], rate[3:]))  # after the warm-up, every step lower


def test_shared_prefix_rows_run_in_batches_within_the_budget(shards):
    """Rows of one prefix whose remainders exceed one batch's budget split into several batches (each one
    backward): the same gradient as row by row."""
    real = max(sft_rows(shards["thread"]), key=lambda r: len(r.ids))
    cut = len(real.ids) // 2
    rows = [SftRow(f"tail {k}", real.ids[:cut] + [t + k for t in real.ids[cut:]], real.mask) for k in range(5)]
    model = random_qwen3(64, 2, torch.float32, seed=0).train()
    ids = [torch.tensor(r.ids) for r in rows]
    wanted = [torch.tensor(r.mask) > 0 for r in rows]
    for w in wanted:
        w[0] = False
    trained = sum(int(w.sum()) for w in wanted)
    calls = []

    def loss(logits, ids, targets):
        calls.append(logits.shape[0])
        return torch.nn.functional.cross_entropy(logits, ids[targets], reduction="sum") / trained

    one_row = int(wanted[0].sum()) * model.config.vocab_size
    torch_model.shared_prefix_backward(model, ids, wanted, cut, loss, budget=2 * one_row)
    assert len(calls) == 3 and sum(calls) == trained  # 2 + 2 + 1 rows
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    want = gradients(rows, 0)[1]
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=name)
