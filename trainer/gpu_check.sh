#!/usr/bin/env bash
# A few SFT steps on a small model on GPU, printing the loss: the check that training really runs.
#
#   trainer/gpu_check.sh TOKENS_DIR SFT_DIR MODEL_DIR [STEPS]
#
# TOKENS_DIR: forge-convert --to tokens output; SFT_DIR: forge-convert --to verl-sft output;
# MODEL_DIR: a small Hugging Face causal LM (e.g. Qwen3-0.6B) with its tokenizer.
# First veRL's own SFT trainer (torchrun, a few steps); if veRL cannot start there (the lent GPU
# machines have Python 3.12, torch 2.11, transformers 5.17 and no room for a Ray wheel), the plain
# torch loop over the tokens shards (trainer/sft_loop.py, run as a file: it needs only torch,
# transformers and pyarrow, not an installed forgerl).
# PYTHON picks the interpreter (default python3); LOOP_ONLY=1 skips veRL and runs the torch loop.
set -euo pipefail

if [ "$#" -lt 3 ]; then
  echo "usage: $0 TOKENS_DIR SFT_DIR MODEL_DIR [STEPS]" >&2
  exit 2
fi
TOKENS=$1 SFT=$2 MODEL=$3 STEPS=${4:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}

"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
           torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'

if [ -z "${LOOP_ONLY:-}" ] && "$PY" -c 'import verl, ray' 2>/dev/null && command -v forge-train >/dev/null; then
  echo "== veRL SFT trainer, $STEPS steps"
  if forge-train sft --data "$SFT" --model "$MODEL" --out "$OUT/verl" --batch-size 1 \
       --override trainer.total_training_steps="$STEPS" --override data.num_workers=0; then
    exit 0
  fi
  echo "veRL SFT did not run; falling back to the torch loop" >&2
else
  echo "veRL skipped (LOOP_ONLY set, or verl/ray/forge-train missing here); using the torch loop" >&2
fi

echo "== torch SFT loop over $TOKENS, $STEPS steps"
exec "$PY" "$HERE/sft_loop.py" --tokens "$TOKENS" --model "$MODEL" --steps "$STEPS"
