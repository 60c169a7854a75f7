"""Seconds until ``turngym eval`` first shows progress: this checkout against a baseline checkout, side by side.

Both arms run the same ``turngym eval`` (a tiny local model built here, no download; Calculator-v0; one episode
at a time) in a fresh interpreter with ``PYTHONPATH`` set to their checkout, and every line they write is
timestamped as it arrives. Reported per arm: seconds to the first line, to the first line after the model is
ready (the baseline prints none before its bar, so for it: the first line), and to the process's end; and
whether the bar's elapsed time at the end covers the generation (the bug was a bar started when the first
episode finished). Arms alternate; each figure is printed as soon as it is measured, then medians.
Usage: python benchmarks/first_progress.py --baseline DIR [--repeats 2] [--limit 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_arm(root: Path, model: str, limit: int, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "turngym", "eval", "--model", model, "--env", "Calculator-v0", "--max-turns", "3",
           "--max-new-tokens", "24", "--limit", str(limit), "--concurrency", "1", "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    first = ready = None
    last_bar = ""
    assert proc.stdout is not None
    buf = ""
    while chunk := proc.stdout.read(1):
        buf += chunk
        if chunk not in "\r\n":
            continue
        line, buf = buf.strip(), ""
        if not line:
            continue
        now = time.perf_counter() - start
        first = now if first is None else first
        if ready is None and ("model ready" in line or "episodes" in line):
            ready = now
        if "episodes" in line:
            last_bar = line
    proc.wait()
    end = time.perf_counter() - start
    elapsed = re.findall(r"\[(\d+):(\d\d)<", last_bar)
    bar_s = int(elapsed[-1][0]) * 60 + int(elapsed[-1][1]) if elapsed else float("nan")
    return {"first_line_s": first or float("nan"), "model_ready_or_bar_s": ready or float("nan"), "end_s": end,
            "bar_elapsed_s": bar_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--baseline", required=True, type=Path, help="a checkout of the commit to compare with")
    ap.add_argument("--repeats", type=int, default=2, help="runs per arm")
    ap.add_argument("--limit", type=int, default=3, help="items (one episode each)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from turngym.agents.tiny import tiny_model_dir

    model = str(tiny_model_dir(chat=True))
    arms = {"baseline": args.baseline.resolve(), "this": ROOT}
    figures: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for arm, root in arms.items():
                f = run_arm(root, model, args.limit, Path(tmp) / f"{arm}-{i}")
                figures[arm].append(f)
                print(f"repeat {i + 1} {arm:8s} " + "  ".join(f"{k} {v:.1f}" for k, v in f.items()), flush=True)
    print("\n| arm | first line s | model ready (baseline: first bar) s | end s | bar's elapsed at the end s |\n"
          "| --- | --- | --- | --- | --- |")
    for arm, fs in figures.items():
        med = {k: statistics.median(f[k] for f in fs) for k in fs[0]}
        print(f"| {arm} | {med['first_line_s']:.1f} | {med['model_ready_or_bar_s']:.1f} | {med['end_s']:.1f} | "
              f"{med['bar_elapsed_s']:.0f} |")


if __name__ == "__main__":
    main()
