"""benchmarks/gpu_learning.sh: its CPU path (the tiny random-init model, 2 steps, 1 seed) writes curves and viewers."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_gpu_learning_script_runs_every_arm_on_cpu_with_the_tiny_model(tmp_path):
    env = {**os.environ, "PY": sys.executable, "MODEL": "tiny", "STEPS": "2", "SEEDS": "1", "GROUP": "2",
           "BATCH": "2", "DEVICE": "cpu", "SAVE_EVERY": "1", "MAX_NEW_TOKENS": "8", "TRAIN_ITEMS": "8",
           "OUT_DIR": str(tmp_path), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_learning.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    arms = ["outcome+grpo", "siop_official+turn", "siop_official+turn_loo", "siop_after_obs+turn_loo",
            "siop_after_obs+turn", "ttrl+grpo", "empo+grpo", "igpo+igpo"]
    res = json.loads((tmp_path / "curves.json").read_text())
    assert list(res["arms"]) == arms and res["failed"] == []
    for arm in arms:
        a = res["arms"][arm]
        assert len(a["mean"]) == 2 and a["wall_s_per_step"] > 0 and a["cpu_s_per_step"] > 0
        cfg = (tmp_path / "runs" / f"{arm}-s0" / "config.yaml").read_text()
        assert "estimator:\n  name: " + arm.split("+")[1] in cfg
        html = (tmp_path / f"view-{arm}-s0.html").read_text()
        assert html.lstrip().lower().startswith("<!doctype html") and len(html) > 10_000
    rows = list(csv.DictReader((tmp_path / "curves.csv").open()))
    assert len(rows) == len(arms) * 2
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert "| igpo+igpo |" in (tmp_path / "summary.md").read_text()
    assert "after_observation" in (tmp_path / "runs" / "siop_after_obs+turn_loo-s0" / "config.yaml").read_text()
    assert "name: ttrl" in (tmp_path / "runs" / "ttrl+grpo-s0" / "config.yaml").read_text()
    assert "name: empo" in (tmp_path / "runs" / "empo+grpo-s0" / "config.yaml").read_text()
