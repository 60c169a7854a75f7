"""``--ray auto`` that starts a local cluster knows its size at once: more ``--env-workers`` than its CPUs is one
line before the model loads, not a silent wait for the pool's start-up limit (300 s)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]


def test_more_env_workers_than_a_local_cluster_started_here_is_refused_before_the_model_loads(tmp_path: Path):
    env = {**os.environ, "RAY_ADDRESS": "local",  # a cluster of its own, even beside another session's head
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cpus = os.cpu_count() or 1
    proc = subprocess.run([sys.executable, "-m", "turngym.cli", "eval", "--env", "Calculator-v0", "--limit", "1",
                           "--ray", "auto", "--env-workers", str(cpus + 1), "--out", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(errors) == 1, proc.stderr[-2000:]
    found = re.fullmatch(rf"error: --env-workers {cpus + 1} asks for {cpus + 1} CPUs \(one per worker\), but the local "
                         r"Ray cluster started here has (\d+): use --env-workers \1 or fewer, or join a bigger cluster "
                         r"with --ray ADDRESS", errors[0])
    assert found and int(found.group(1)) <= cpus, errors[0]  # Ray counts the CPUs this process may use
    assert "loading model" not in proc.stdout + proc.stderr and not (tmp_path / "run" / "episodes.jsonl").exists()
