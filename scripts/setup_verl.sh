#!/usr/bin/env bash
# Creates .venv-verl: verl 0.9.1 in its own environment (its pins, transformers<5.11 and tensordict<=0.10, conflict
# with turngym's `all`), with exactly the modules verl's agent loop, ray_trainer.compute_advantage and reward loop
# import, and turngym itself (editable). Idempotent: a second run with nothing changed returns after one import check.
# torch is pinned first: 2.13.0 resolves to the CPU wheel on machines without a GPU here (never a CUDA build pulled in
# by a dependency). verl goes in with --no-deps: its metadata pins vllm, flash-attn and ~40 more, none of which the
# agent loop, the estimators or the CPU tests need (a GPU run installs verl's vllm extra: docs/verl.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-verl
STAMP="$VENV/.turngym-setup"
want=$(sha256sum "$0" pyproject.toml | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && \
   "$VENV/bin/python" -c "import turngym.integrations.verl" >/dev/null 2>&1; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('verl') == '0.9.1'" 2>/dev/null || \
  "$VENV/bin/python" -m pip install --quiet --no-deps "verl==0.9.1"
# what verl.experimental.agent_loop, verl.trainer.ppo.ray_trainer and the reward loop import, within verl's pins
"$VENV/bin/python" -m pip install --quiet "transformers>=5.5.3,<5.11,!=5.6.0" "tensordict>=0.8,<=0.10,!=0.9.0" \
  "ray>=2.41" "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "codetiming>=1.4" "torchdata>=0.11" "numpy>=2" pillow \
  "pydantic>=2" "datasets>=2.19" cachetools peft uvicorn fastapi
# turngym without its pins on torch/transformers (those above hold), plus its core modules and a local model's
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
"$VENV/bin/python" -m pip install --quiet "gymnasium>=1.1,<2" "numpy>=1.26" "httpx>=0.27" "tqdm>=4.66" "pyyaml>=6" \
  "aiohttp>=3.9" "tenacity>=8" "filelock>=4.3" "accelerate>=1.0" "gguf>=0.10" "pytest>=8"
"$VENV/bin/python" -c "import turngym.integrations.verl" >/dev/null
echo "$want" > "$STAMP"
