#!/usr/bin/env bash
# Learning curves on one GPU: the instruct model trained on SearchQA (HotpotQA) under the SIOP paper's reward ×
# estimator arms, outcome+grpo, siop_official+turn, siop_official+turn_loo, siop_after_obs+turn_loo,
# siop_after_obs+turn, ttrl+grpo, empo+grpo, igpo+igpo (ARMS=a,b to pick); SEEDS seeds × STEPS optimizer steps each.
# Writes OUT_DIR/curves.{json,csv,png}, summary.md and one viewer per run (view-<arm>-s<seed>.html).
# MODEL=<name, directory or hub id> (default: the embedded instruct model, qwen2.5-coder-0.5b-instruct, from its
# PyPI chunk packages); MODEL=tiny STEPS=2 SEEDS=1 GROUP=2 DEVICE=cpu is the CPU check (tests/test_gpu_learning.py).
# EVAL_ITEMS=N adds each trained model's greedy EM on the first N HotpotQA evaluation items.
# benchmarks/gpu_learning.py says what each figure is; docs/gpu.md how to run it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
args=(--model "${MODEL:-qwen2.5-coder-0.5b-instruct}" --steps "${STEPS:-100}" --seeds "${SEEDS:-3}"
      --group "${GROUP:-8}" --out "${OUT_DIR:-runs/gpu_learning}" --eval-items "${EVAL_ITEMS:-0}")
[[ -n "${ARMS:-}" ]] && args+=(--arms "$ARMS")
[[ -n "${BATCH:-}" ]] && args+=(--batch "$BATCH")
[[ -n "${DEVICE:-}" ]] && args+=(--device "$DEVICE")
[[ -n "${MAX_NEW_TOKENS:-}" ]] && args+=(--max-new-tokens "$MAX_NEW_TOKENS")
[[ -n "${SAVE_EVERY:-}" ]] && args+=(--save-every "$SAVE_EVERY")
[[ -n "${TRAIN_ITEMS:-}" ]] && args+=(--train-items "$TRAIN_ITEMS")
PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu_learning.py "${args[@]}"
