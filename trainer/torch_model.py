"""The model helpers both torch loops use: a random Qwen3, logits only where a loss reads them, the checkpoint.

`sft_loop.py` (SFT) and `rl_loop.py` / `forge-train rl --engine torch` (GRPO)
train the same kind of model and write the same checkpoint folder. A loss
reads the next-token distribution only at the positions it trains, and a
19k-token Claude Code prompt's full-vocabulary logits would take 11.5 GB
(151,936 x 4 bytes a token), so the decoder runs for hidden states and the
output layer is applied at those positions only. Imports only torch,
transformers and the standard library: `trainer/gpu_check.sh` runs the loops
as files on machines without forgerl.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

QWEN3_VOCAB = 151936  # Qwen3's embedding rows: the ids in recorded shards go up to here
POLICY_FILE = "forgerl_policy.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja",
                   "special_tokens_map.json", "added_tokens.json")


class BadInput(Exception):
    """Shards or a model the loop cannot train on: one line, exit 2 (the loops run as files, without forgerl's
    `UserError`)."""


def pick_device(asked: str) -> str:
    import torch

    return asked or ("cuda" if torch.cuda.is_available() else "cpu")


def train_dtype(device: str) -> Any:
    """bfloat16 on a GPU, float32 on CPU: the dtype a loop trains and saves in."""
    import torch

    return torch.bfloat16 if device == "cuda" else torch.float32


def random_qwen3(hidden: int, layers: int, dtype: Any, seed: int = 0, vocab_size: int = QWEN3_VOCAB,
                 eos_id: int | None = None, bos_id: int | None = None) -> Any:
    """A Qwen3 built from a config with seeded random weights: max(2, hidden // 64) heads (head size 32 at
    hidden 64, 64 for multiples of 128: sizes vLLM's CPU attention serves), half as many key/value heads."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    heads = max(2, hidden // 64)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                         head_dim=hidden // heads, max_position_embeddings=65536, tie_word_embeddings=True,
                         eos_token_id=eos_id, bos_token_id=bos_id)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_model(model_path: Path | None, device: str, hidden: int = 256, layers: int = 4, seed: int = 0) -> Any:
    """The causal LM at `model_path`, or `random_qwen3(hidden, layers)`, on `device` in `train_dtype`, training."""
    from transformers import AutoModelForCausalLM

    dtype = train_dtype(device)
    if model_path is None:
        return random_qwen3(hidden, layers, dtype, seed).to(device).train()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    except (OSError, ValueError) as e:  # no such folder, or a config transformers does not recognise
        raise BadInput(f"--model {model_path}: cannot load: {str(e).splitlines()[0]}") from None
    return model.to(device).train()


def loss_logits(model: Any, input_ids: Any, attention_mask: Any, targets: Any) -> Any:
    """Float32 logits predicting each token t where `targets[b, t]` is true (from position t - 1), in row-major
    order of those tokens: [n, vocab]. `targets[:, 0]` must be false (no position predicts it)."""
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return hidden_logits(model, hidden, targets)


def hidden_logits(model: Any, hidden: Any, targets: Any) -> Any:
    """`loss_logits` from the decoder's hidden states [batch, length, hidden]: the output layer at the positions
    whose next token is a target."""
    return model.get_output_embeddings()(hidden[:, :-1][targets[:, 1:]]).float()


def shared_prefix_backward(model: Any, rows: list[Any], targets: list[Any], prefix: int,
                           loss: Callable[[Any, Any, Any], Any], budget: int = 2 ** 25) -> float:
    """Backpropagate the sum over rows (1-d ids, 1-d bool targets; the first `prefix` ids the same in every row,
    each row longer) of `loss(logits, ids, targets)`, the logits `loss_logits` gives, running the decoder over
    the prefix once. The rows' remainders run in batches (right-padded: causal attention keeps a token from the
    padding after it), each against the prefix's keys and values (detached copies, so each batch's graph is
    freed by its own backward while their gradients add up), then one backward through the prefix with the
    summed gradient: the rows' gradient up to float rounding. A batch holds rows while its attention scores
    (remainder tokens x keys, per head) and its loss logits (loss tokens x vocabulary) stay within `budget`
    elements each: a pi row's remainder is ~50 tokens, so one batch; a Claude Code row's ~1.4k against 17k
    keys runs nearly alone. Running rows together reads each weight once per batch, not once per row (the
    151,936-row output layer and the embedding's dense gradient dominate a short remainder's step).
    Returns the summed loss."""
    import torch
    from transformers import DynamicCache

    decoder = model.get_decoder()
    shared = decoder(input_ids=rows[0][None, :prefix], use_cache=True)
    computed = [t for layer in shared.past_key_values.layers for t in (layer.keys, layer.values)]
    computed.append(shared.last_hidden_state)
    leaves = [t.detach().requires_grad_() for t in computed]
    heads, vocab = model.config.num_attention_heads, model.get_output_embeddings().weight.shape[0]
    total = 0.0
    for batch in _batches(rows, targets, prefix, heads, vocab, budget):
        width = max(len(rows[i]) for i in batch) - prefix
        ids = torch.stack([torch.nn.functional.pad(rows[i], (0, prefix + width - len(rows[i]))) for i in batch])
        wanted = torch.stack([torch.nn.functional.pad(targets[i], (0, prefix + width - len(targets[i])))
                              for i in batch])
        n = len(batch)
        cache = DynamicCache(ddp_cache_data=[(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1))
                                             for k, v in zip(leaves[:-1:2], leaves[1:-1:2])], config=model.config)
        rest = decoder(input_ids=ids[:, prefix:], past_key_values=cache, use_cache=True).last_hidden_state
        hidden = torch.cat([leaves[-1].expand(n, -1, -1), rest], 1)
        batch_loss = loss(hidden_logits(model, hidden, wanted), ids, wanted)
        batch_loss.backward()
        total += batch_loss.item()
    reached = [(t, leaf.grad) for t, leaf in zip(computed, leaves) if leaf.grad is not None]
    torch.autograd.backward([t for t, _ in reached], [g for _, g in reached])
    return total


def _batches(rows: list[Any], targets: list[Any], prefix: int, heads: int, vocab: int,
             budget: int) -> list[list[int]]:
    """Consecutive runs of row indices whose padded attention scores (rows x heads x remainder x keys) and loss
    logits (loss tokens x vocabulary) each stay within `budget` elements (at least one row a run)."""
    out: list[list[int]] = []
    width = logits = 0
    for i, (ids, wanted) in enumerate(zip(rows, targets)):
        rest, row_logits = len(ids) - prefix, int(wanted.sum()) * vocab
        wider = max(width, rest)
        if out and (len(out[-1]) + 1) * heads * wider * (prefix + wider) <= budget and logits + row_logits <= budget:
            out[-1].append(i)
            width, logits = wider, logits + row_logits
        else:
            out.append([i])
            width, logits = rest, row_logits
    return out


def token_logprobs(model: Any, input_ids: Any, attention_mask: Any, targets: Any) -> Any:
    """log p(token t | tokens before t) where `targets[b, t]` is true, 0 elsewhere: [batch, length]."""
    import torch

    wanted = targets.bool().clone()
    wanted[:, 0] = False  # nothing predicts the first token
    picked = torch.log_softmax(loss_logits(model, input_ids, attention_mask, wanted), -1)
    picked = picked.gather(-1, input_ids[wanted][:, None]).squeeze(-1)
    out = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
    out[wanted] = picked
    return out


def save_checkpoint(model: Any, out: Path, tokenizer_dir: Path, policy: dict[str, Any]) -> Path:
    """A Hugging Face folder vLLM, transformers and the policy server load: the weights in the dtype they
    trained in, `tokenizer_dir`'s tokenizer files as they are (their chat template's hash is the one served),
    and `policy` as `forgerl_policy.json`, written last: a folder without it is incomplete."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)
    (out / POLICY_FILE).write_text(json.dumps(policy, indent=1) + "\n")
    return out
