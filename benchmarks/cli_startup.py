"""``turngym --help`` and ``import turngym``: this checkout against a baseline checkout, side by side.

Arms alternate within each repeat (baseline, this, baseline, this, ...), each a fresh interpreter with
``PYTHONPATH`` set to its checkout; every figure is printed as soon as it is measured, and the summary
gives medians of wall and CPU seconds, the ratios this/baseline, and the heavy modules each arm imports for ``--help``
(from ``python -X importtime``). A bare ``python -c pass`` arm shows the interpreter's own start-up.
Bytecode is cached (as for an installed package): a warm-up run per arm writes it before timing.
Usage: python benchmarks/cli_startup.py --baseline DIR [--repeats 15]
(DIR: a checkout of the commit to compare with, e.g. ``git worktree add ../base main``)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("numpy", "gymnasium", "httpx", "torch", "transformers", "tqdm", "yaml")
CASES = {
    "--help": ["-c", "import sys; from turngym.cli import main; sys.argv = ['turngym', '--help']\n"
                     "try:\n    main()\nexcept SystemExit:\n    pass"],
    "import turngym": ["-c", "import turngym"],
    "python -c pass": ["-c", "pass"],
}


NEUTRAL = tempfile.mkdtemp()  # the working directory of every run: `-c` puts the cwd first on sys.path


def _env(root: Path) -> dict[str, str]:
    """The checkout first on the path; bytecode cached as an installed package's is (one warm-up run writes it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(root)}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(root: Path, args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh interpreter (CPU time is the figure a loaded machine distorts least)."""
    env = _env(root)
    start, cpu = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, *args], env=env, check=True, stdout=subprocess.DEVNULL, cwd=NEUTRAL)
    return time.perf_counter() - start, _children_cpu() - cpu


def heavy_imports(root: Path) -> list[str]:
    env = _env(root)
    proc = subprocess.run([sys.executable, "-X", "importtime", *CASES["--help"]], env=env, capture_output=True, text=True,
                          check=True, cwd=NEUTRAL)
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return [m for m in HEAVY if m in names]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--baseline", required=True, type=Path, help="a checkout of the commit to compare with")
    ap.add_argument("--repeats", type=int, default=15, help="runs per arm and case")
    args = ap.parse_args()
    arms = {"baseline": args.baseline.resolve(), "this": Path(__file__).resolve().parents[1]}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(a, c): [] for a in arms for c in CASES}
    for root in arms.values():  # warm-up: writes the bytecode caches, not timed
        run_once(root, CASES["--help"])
    for i in range(args.repeats):
        for case, argv in CASES.items():
            for arm, root in arms.items():
                wall, cpu = run_once(root, argv)
                times[(arm, case)].append((wall, cpu))
                print(f"repeat {i + 1:2d}  {case:15s} {arm:8s} wall {wall:6.3f} s  CPU {cpu:6.3f} s", flush=True)
    print("\n| case | baseline wall s | this wall s | this / baseline | baseline CPU s | this CPU s | this / baseline |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for case in CASES:
        (bw, bc), (tw, tc) = ((statistics.median(w for w, _ in times[(a, case)]),
                               statistics.median(c for _, c in times[(a, case)])) for a in arms)
        print(f"| {case} | {bw:.3f} | {tw:.3f} | {tw / bw:.2f} | {bc:.3f} | {tc:.3f} | {tc / bc:.2f} |")
    for arm, root in arms.items():
        print(f"{arm}: --help imports {', '.join(heavy_imports(root)) or 'none of ' + ', '.join(HEAVY)}")


if __name__ == "__main__":
    main()
