#!/usr/bin/env bash
# GPU smoke check: SFT steps and one multi-segment RL step on a small random Qwen3, printing loss and tokens/s.
#
#   trainer/gpu_check.sh TOKENS_DIR [--device cuda|cpu] [--steps N] [--max-length N]
#                                   [--model DIR | --hidden N --layers N]
#
# TOKENS_DIR: forge-convert --to tokens output (a few MiB travel to the GPU machine). The lent GPU
# machines have torch 2.11 and transformers 5.17 but no veRL and no network, so both halves are
# plain torch loops run as files (they need torch, transformers and pyarrow, not an installed
# forgerl): trainer/sft_loop.py for N SFT steps (default 20; whole rows, logits at the loss positions
# only, so --max-length applies to the RL half alone), then trainer/rl_loop.py for one GRPO
# step where every segment is a row, with the rows' rewards, weights, padding rows and advantages
# from trainer/segment_rl.py (the maths the veRL path uses). The model is a random-initialised
# Qwen3 built from a config on the machine (hidden 256, 4 layers unless --hidden / --layers say
# otherwise) unless --model names a Hugging Face folder.
# Fits well inside 15 minutes on one GPU. PYTHON picks the interpreter (default python3).
set -euo pipefail

if [ "$#" -lt 1 ]; then
  echo "usage: $0 TOKENS_DIR [--device cuda|cpu] [--steps N] [--max-length N] [--model DIR | --hidden N --layers N]" >&2
  exit 2
fi
TOKENS=$1
shift
DEVICE="" STEPS=20 MAXLEN=2048 MODEL=(--random-qwen3)
while [ "$#" -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --model) MODEL=(--model "$2"); shift 2 ;;
    --max-length) MAXLEN=$2; shift 2 ;;
    --hidden|--layers) MODEL+=("$1" "$2"); shift 2 ;;
    *) echo "$0: unknown option $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
DEV=(); [ -n "$DEVICE" ] && DEV=(--device "$DEVICE")
export PYTHONUNBUFFERED=1

"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
           "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")'

echo "== SFT: $STEPS steps over $TOKENS"
"$PY" "$HERE/sft_loop.py" --tokens "$TOKENS" "${MODEL[@]}" "${DEV[@]}" --steps "$STEPS"

echo "== RL: one GRPO step, every segment a row"
"$PY" "$HERE/rl_loop.py" --tokens "$TOKENS" "${MODEL[@]}" "${DEV[@]}" --steps 1 --max-length "$MAXLEN"
