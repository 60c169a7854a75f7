#!/usr/bin/env bash
# The main job on embedded defaults: set up, then evaluate the default model (Gemma 3 270M from PyPI)
# on a few items of each available env (Calculator-v0, MathCode-v0 on GSM8K, SearchQA-v0 on HotpotQA
# over the embedded BM25 index, BFCL-v0 on simple_python in BFCL's prompting format), K=2 samples
# per item, ablate reward wrappers (with SCRIBE judged by the same model) over the SearchQA groups,
# and write a side-by-side report. Reruns resume where they stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${TURNGYM_OUT:-runs/main}
mkdir -p "$OUT"
TG=.venv/bin/turngym
COMMON=(--model default --k 2 --temperature 0.7 --concurrency 8)
$TG eval --env Calculator-v0 --limit 4 --max-turns 3 --max-new-tokens 48 "${COMMON[@]}" --out "$OUT/calculator"
$TG eval --env MathCode-v0 --dataset gsm8k --limit 2 --max-turns 3 --max-new-tokens 96 "${COMMON[@]}" --out "$OUT/mathcode-gsm8k"
$TG eval --env SearchQA-v0 --dataset hotpotqa --limit 2 --max-turns 3 --max-new-tokens 64 "${COMMON[@]}" --out "$OUT/searchqa-hotpotqa"
$TG eval --env BFCL-v0 --dataset simple_python --limit 2 --max-new-tokens 48 "${COMMON[@]}" --out "$OUT/bfcl-simple_python"
$TG ablate --episodes "$OUT/searchqa-hotpotqa/episodes.jsonl" --rewards outcome,ttrl,empo,siop,igpo,scribe,funrl --scorer default \
  --out "$OUT/ablation"
$TG report "$OUT/calculator" "$OUT/mathcode-gsm8k" "$OUT/searchqa-hotpotqa" "$OUT/bfcl-simple_python" --out "$OUT/report.md"
echo "report: $OUT/report.md (per run: $OUT/*/report.md; reward ablation: $OUT/ablation/ablation.md)"
