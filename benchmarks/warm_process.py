"""One process for several envs vs one process per env (the design before issue #17's item 1).

Arm "per-env": one `turngym eval --env E` process for each env, each starting Python and loading
the model itself (as `scripts/main.sh` did before the main job ran in one process). Arm "one":
a single `turngym eval --env A,B,C,D` process that loads the model once. Same model, items,
sampling and seed; arms alternate; each repeat writes to a fresh folder. Reported per arm: wall
seconds and the children's CPU seconds (on a shared machine the CPU ratio is the load-independent
figure), and whether both arms wrote the same metrics.
Usage: python benchmarks/warm_process.py [--model qwen2.5-coder-0.5b-instruct] [--limit 1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENVS = ("Calculator-v0", "MathCode-v0:gsm8k", "SearchQA-v0:hotpotqa", "BFCL-v0:simple_python")


def _cli(args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "turngym", *args], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _metrics(out: Path) -> dict[str, float]:
    found = {}
    for results in sorted(out.rglob("results.json")):
        data = json.loads(results.read_text())
        found.update({f"{results.parent.name}/{k}": v["value"] for k, v in data["metrics"].items()
                      if isinstance(v, dict) and "value" in v})
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    common = ["--model", args.model, "--limit", str(args.limit), "--k", "1", "--temperature", "0",
              "--max-new-tokens", str(args.max_new_tokens), "--max-turns", "2"]
    tmp = Path(tempfile.mkdtemp(prefix="turngym-warm-"))
    wall: dict[str, list[float]] = {"per-env": [], "one": []}
    cpu: dict[str, list[float]] = {"per-env": [], "one": []}
    metrics: dict[str, dict[str, float]] = {}
    for rep in range(args.repeats):
        for arm in ("per-env", "one"):
            out = tmp / f"{arm}-{rep}"
            t, c = time.perf_counter(), _children_cpu()
            if arm == "per-env":
                for env in ENVS:
                    name, _, dataset = env.partition(":")
                    _cli(["eval", "--env", name, *(["--dataset", dataset] if dataset else []), *common,
                          "--out", str(out / (name + (f"-{dataset}" if dataset else "")))])
            else:
                _cli(["eval", "--env", ",".join(ENVS), *common, "--out", str(out)])
            wall[arm].append(time.perf_counter() - t)
            cpu[arm].append(_children_cpu() - c)
            metrics[arm] = _metrics(out)
            print(f"repeat {rep} {arm}: wall {wall[arm][-1]:.1f} s, CPU {cpu[arm][-1]:.1f} s", flush=True)
    w = {a: statistics.median(v) for a, v in wall.items()}
    c = {a: statistics.median(v) for a, v in cpu.items()}
    print(f"{len(ENVS)} envs, {args.limit} item(s) each, {args.max_new_tokens} new tokens, model {args.model}")
    print(f"median wall: per-env processes {w['per-env']:.1f} s, one process {w['one']:.1f} s "
          f"({w['per-env'] / w['one']:.2f}x); median CPU {c['per-env']:.1f} vs {c['one']:.1f} s "
          f"({c['per-env'] / c['one']:.2f}x)")
    print("same metrics in both arms:", metrics["per-env"] == metrics["one"], f"({len(metrics['one'])} metrics)")


if __name__ == "__main__":
    main()
