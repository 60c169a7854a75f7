"""Run by scripts/core_install.sh inside a fresh core-only install: what the core promises works, and a part
whose extra is missing says which extra to install (turngym/extras.py)."""

import importlib.util
import subprocess
import sys

import gymnasium

import turngym
from turngym.extras import MissingExtra
from turngym.rewards import get_reward

assert "site-packages" in turngym.__file__, f"imported the checkout, not the install: {turngym.__file__}"
heavy = [m for m in ("torch", "transformers", "scipy", "pyserini", "math_verify") if importlib.util.find_spec(m)]
assert not heavy, f"a core install pulled in {heavy}"

env = gymnasium.make("turngym/Calculator-v0")
obs, info = env.reset(seed=0, options={"task": {"question": "What is 6 * 7?", "answers": ["42"]}})
obs, reward, terminated, truncated, info = env.step("<calc>6*7</calc>")
assert not terminated and "42" in obs, obs
obs, reward, terminated, truncated, info = env.step("<answer>42</answer>")
assert terminated and reward == 1.0, (reward, terminated, info)
episode = env.unwrapped.episode
scores = get_reward("outcome").score_group([episode, episode])
assert scores.rewards[0][-1] == 1.0, scores.rewards

try:
    gymnasium.make("turngym/MathCode-v0")
except MissingExtra as exc:
    assert "pip install 'turngym[math]'" in str(exc), exc
else:
    sys.exit("MathCode-v0 was made without the [math] extra")
try:
    gymnasium.make("turngym/SearchQA-v0")
except MissingExtra as exc:
    assert "pip install 'turngym[search]'" in str(exc), exc
else:
    sys.exit("SearchQA-v0 with its local BM25 index was made without the [search] extra")
cli = subprocess.run([sys.executable, "-m", "turngym.cli", "eval", "--env", "Calculator-v0", "--limit", "1", "--out", "eval-out"],
                     capture_output=True, text=True, timeout=300)
assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
assert cli.stderr.strip().splitlines()[-1].startswith("error: ") and "turngym[models]" in cli.stderr, cli.stderr
print("core install: import, Calculator-v0 episode, outcome reward, MathCode-v0's and SearchQA-v0's missing-extra messages, "
      "eval with the default model (one error line): ok")
