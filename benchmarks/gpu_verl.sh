#!/usr/bin/env bash
# turngym inside verl on one CUDA GPU for a few steps: configs/verl/siop_searchqa_recommended.yaml (SIOP's official
# launcher settings with after_observation + turn_loo) scaled to one GPU, on the offline SearchQA training subset
# and a BM25 retrieval server over turngym's embedded corpus. Not run on a CPU machine (verl's rollout needs vLLM).
# MODEL=<dir or hub id> (default Qwen/Qwen2.5-0.5B-Instruct), STEPS (default 3), CONFIG (default
# siop_searchqa_recommended). Needs .venv (turngym, for the retrieval server) and builds .venv-verl.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
STEPS=${STEPS:-3}
CONFIG=${CONFIG:-siop_searchqa_recommended}
OUT=${OUT_DIR:-runs/gpu_verl}
mkdir -p "$OUT"
bash scripts/setup_verl.sh
# verl's GPU rollout: its vllm extra's engine (brings a CUDA torch in place of the CPU wheel)
.venv-verl/bin/python -c "import vllm" 2>/dev/null || .venv-verl/bin/python -m pip install --quiet "vllm==0.24.0"
.venv/bin/turngym serve-retriever --index default --port 8000 > "$OUT/retriever.log" 2>&1 &
retriever=$!
trap 'kill "$retriever" 2>/dev/null || true' EXIT
ENV_KWARGS='{"dataset": "subset:searchqa-train-offline", "tool_format": "native", "retriever": "http://127.0.0.1:8000"}'
.venv-verl/bin/python -m turngym.integrations.verl.data --env SearchQA-v0 --env-kwargs "$ENV_KWARGS" --items 0:64 \
  --out "$OUT/train.parquet"
.venv-verl/bin/python -m turngym.integrations.verl.data --env SearchQA-v0 --env-kwargs "$ENV_KWARGS" --items 64:80 \
  --out "$OUT/val.parquet"
PYTHONUNBUFFERED=1 .venv-verl/bin/python -m verl.trainer.main_ppo --config-path "$PWD/configs/verl" --config-name "$CONFIG" \
  actor_rollout_ref.model.path="$MODEL" data.train_files="$OUT/train.parquet" data.val_files="$OUT/val.parquet" \
  turngym.env_kwargs.dataset=subset:searchqa-train-offline turngym.env_kwargs.split=null \
  turngym.reward_kwargs.equivalence=auto turngym.reward_kwargs.evidence=auto \
  data.train_batch_size=8 data.val_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.n_gpus_per_node=1 \
  trainer.total_training_steps="$STEPS" trainer.save_freq=-1 trainer.test_freq=-1 \
  trainer.default_local_dir="$OUT/checkpoints" 2>&1 | tee "$OUT/train.log"
