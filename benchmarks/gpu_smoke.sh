#!/usr/bin/env bash
# GPU smoke check: bf16 generation and a few bf16 GRPO steps with per-turn advantages on one GPU,
# with the default model (Gemma 3 270M from PyPI; pass MODEL=<dir or hub id> for another).
# Prints generation throughput, step times and peak GPU memory. Needs a CUDA torch and turngym installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MODEL=${MODEL:-default}
STEPS=${STEPS:-5}
OUT=${OUT:-runs/gpu_smoke}
mkdir -p "$OUT"
"$PY" - "$MODEL" <<'PYEOF'
import sys, time, torch
from turngym.agents.loading import load_hf_policy
from turngym.agents.policy import GenerationRequest, SamplingParams
assert torch.cuda.is_available(), "no CUDA device"
pol = load_hf_policy(sys.argv[1], dtype="bfloat16", device="cuda")
ids = pol.tokenizer("Question: what is 17 * 23? Think step by step.\nAnswer:")["input_ids"]
for bs in (1, 8, 32):
    torch.cuda.synchronize(); t = time.perf_counter()
    gens = pol.generate([GenerationRequest(prompt_ids=ids)] * bs, SamplingParams(max_new_tokens=128, temperature=1.0, seed=0))
    torch.cuda.synchronize(); dt = time.perf_counter() - t
    n = sum(len(g.token_ids) for g in gens)
    print(f"bf16 generate batch={bs:3d}: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s")
print(f"peak GPU memory after generation: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
PYEOF
cat > "$OUT/config.yaml" <<YAML
env: {id: turngym/Calculator-v0, kwargs: {max_turns: 3}}
data: {indices: [0, 256]}
reward: {name: outcome}
estimator: {name: turn}
model: {name_or_path: $MODEL, dtype: bfloat16}
trl: {output_dir: $OUT/run, num_generations: 8, per_device_train_batch_size: 8, max_completion_length: 128,
      max_steps: $STEPS, logging_steps: 1, bf16: true, learning_rate: 1.0e-6, report_to: none, save_strategy: "no"}
YAML
start=$(date +%s)
"$PY" -m turngym.cli train --config "$OUT/config.yaml" 2>&1 | grep -E "step_time|train_runtime|model saved" || true
echo "GRPO: $STEPS steps in $(( $(date +%s) - start )) s (including model load)"
"$PY" -c "import torch; print('CUDA device:', torch.cuda.get_device_name(0))"
