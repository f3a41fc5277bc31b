#!/usr/bin/env bash
# The embedded models' GPU recipe, for a lent device (it has no network, so the corpus travels packed).
#   here:       ./scripts/train_gpu.sh pack          # runs/packed.npz (at most about 60 MB) from the live corpus
#   on the GPU: ./scripts/train_gpu.sh train         # target 300M tokens, then the distilled draft, then export
# On the device, python3 has torch, safetensors, tokenizers and numpy; carry ["runs/packed.npz"].
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
case "${1:-}" in
  pack)
    $PY -m specdec.training pack --tokens 30e6 --seq-len 1024 --data runs/packed.npz ;;
  train)
    mkdir -p runs/gpu
    $PY -m specdec.training target --device cuda --data runs/packed.npz --runs runs/gpu \
        --batch-size 128 --seq-len 1024 --lr 3e-3 --tokens 300e6 --max-minutes 8 2>&1 | tee -a runs/gpu/target.log
    $PY -m specdec.training draft --device cuda --data runs/packed.npz --runs runs/gpu \
        --batch-size 128 --seq-len 1024 --lr 3e-3 --tokens 60e6 --max-minutes 2 2>&1 | tee -a runs/gpu/draft.log
    $PY -m specdec.training export --runs runs/gpu --out runs/gpu/models ;;
  *)
    echo "usage: $0 pack|train" >&2; exit 2 ;;
esac
