"""Seconds until ``turngym eval``, ``train`` or ``scribe build-library`` first shows progress: this checkout, and
a baseline checkout side by side when one is given.

Every arm runs the same command in a fresh interpreter with ``PYTHONPATH`` set to its checkout, and every line
it writes is timestamped as it arrives. ``eval``: Calculator-v0, one episode at a time, run to its end;
reported: seconds to the first line, to the first line after the model is ready (a checkout that prints none
before its bar: the first line), to the end, and the bar's elapsed time at the end (the bug was a bar started
when the first episode finished). ``train``: a one-step Calculator-v0 run, stopped once training starts
(TRL's bar appears); reported: seconds to the first line, to the line after the model load (a checkout that
prints none: TRL's bar), and to the start of training. ``scribe``: ``scribe build-library`` on two real
Calculator-v0 episodes with the model as its LLM, stopped when decomposition starts (the LLM is loaded);
a checkout that prints nothing before runs to its end. ``--model``: 'tiny' (a tiny local model built here, no
download), or any model ``turngym eval --model`` takes (e.g. ``qwen2.5-coder-0.5b-instruct``). Arms
alternate; each figure is printed as soon as it is measured, then medians.
Usage: python benchmarks/first_progress.py [--baseline DIR] [--command eval|train|scribe] [--model tiny] [--repeats 2] [--echo]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRL_BAR = r"\d+%\|"  # TRL's training bar has no description (the model load's bar says "Loading weights")


def train_config(model: str, out: Path) -> Path:
    path = out.with_suffix(".yaml")
    path.write_text(json.dumps({  # JSON is YAML
        "env": {"id": "turngym/Calculator-v0", "kwargs": {"max_turns": 2}}, "data": {"indices": [0, 4]},
        "model": {"name_or_path": model},
        "trl": {"output_dir": str(out), "per_device_train_batch_size": 2, "num_generations": 2,
                "max_completion_length": 16, "max_steps": 1, "report_to": "none", "save_strategy": "no"}}))
    return path


def scribe_episodes(out: Path) -> Path:
    """Two real Calculator-v0 episodes (scripted actions) for ``scribe build-library`` to decompose."""
    import gymnasium

    import turngym  # noqa: F401 - registers the envs
    from turngym.episode import EpisodeWriter

    path = out.with_suffix(".jsonl")
    with EpisodeWriter(path) as w:
        for k, actions in enumerate((["<calc>84 * 63 + 51</calc>", "<answer>5343</answer>"], ["<answer>5292</answer>"])):
            env = gymnasium.make("turngym/Calculator-v0")
            env.reset(seed=k, options={"index": 0, "group": "q0", "episode_id": f"q0#{k}"})
            for a in actions:
                env.step(a)
            w.write(env.unwrapped.episode)
    return path


def lines_of(proc: subprocess.Popen[bytes]) -> Iterator[str]:
    """Each line, or tqdm redraw, as it arrives. A redraw ends with no newline (the next one starts with a
    carriage return), so what one read returns is taken as complete: waiting for the next terminator would
    date every redraw at the one after it."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while chunk := os.read(fd, 65536):
        for line in re.split(r"[\r\n]+", chunk.decode("utf-8", "replace")):
            if line.strip():
                yield line.strip()


def run_arm(root: Path, command: str, model: str, limit: int, out: Path, echo: bool = False) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}
    if command == "eval":
        cmd = [sys.executable, "-m", "turngym", "eval", "--model", model, "--env", "Calculator-v0", "--max-turns", "3",
               "--max-new-tokens", "24", "--limit", str(limit), "--concurrency", "1", "--out", str(out)]
        ready_marks, end_marks = ("model ready", "episodes"), ()
    elif command == "scribe":
        cmd = [sys.executable, "-m", "turngym", "scribe", "build-library", str(scribe_episodes(out)), "--llm", model,
               "--out", str(out / "lib.json")]
        ready_marks = end_marks = ("decomposing",)
    else:
        cmd = [sys.executable, "-m", "turngym", "train", "--config", str(train_config(model, out))]
        ready_marks, end_marks = ("building the reward", TRL_BAR), (TRL_BAR,)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            bufsize=0)
    first = ready = None
    last_bar = ""
    for line in lines_of(proc):
        now = time.perf_counter() - start
        if echo:
            print(f"  {now:7.1f} s | {line[:150]}", flush=True)
        first = now if first is None else first
        if ready is None and any(m == TRL_BAR and re.match(m, line) or m in line for m in ready_marks):
            ready = now
        if "episodes" in line:
            last_bar = line
        if any(m == TRL_BAR and re.match(m, line) or m in line for m in end_marks):
            proc.kill()  # training or decomposition has started: what is measured is the wait before it
            break
    proc.wait()
    end = time.perf_counter() - start
    elapsed = re.findall(r"\[(\d+):(\d\d)<", last_bar)
    bar_s = int(elapsed[-1][0]) * 60 + int(elapsed[-1][1]) if elapsed else float("nan")
    figures = {"first_line_s": first or float("nan"), "model_ready_or_bar_s": ready or float("nan"), "end_s": end}
    return {**figures, "bar_elapsed_s": bar_s} if command == "eval" else figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=None, help="a checkout of the commit to compare with")
    ap.add_argument("--command", choices=("eval", "train", "scribe"), default="eval", help="the command timed")
    ap.add_argument("--model", default="tiny", help="'tiny' (built here) or any model name turngym takes")
    ap.add_argument("--repeats", type=int, default=2, help="runs per arm")
    ap.add_argument("--limit", type=int, default=3, help="eval: items (one episode each)")
    ap.add_argument("--echo", action="store_true", help="print every line the command writes, with its arrival time")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from turngym.agents.tiny import tiny_model_dir

    model = str(tiny_model_dir(chat=True)) if args.model == "tiny" else args.model
    arms = {"this": ROOT} if args.baseline is None else {"baseline": args.baseline.resolve(), "this": ROOT}
    figures: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for arm, root in arms.items():
                f = run_arm(root, args.command, model, args.limit, Path(tmp) / f"{arm}-{i}", args.echo)
                figures[arm].append(f)
                print(f"repeat {i + 1} {arm:8s} " + "  ".join(f"{k} {v:.1f}" for k, v in f.items()), flush=True)
    ready = {"eval": "model ready (else first bar)", "train": "model loaded (else TRL's bar)",
             "scribe": "LLM loaded, decomposing"}[args.command]
    end = {"eval": "end", "train": "training starts", "scribe": "stopped"}[args.command]
    print(f"\n{args.command}, model {args.model}\n| arm | first line s | {ready} s | {end} s |"
          + (" bar's elapsed at the end s |" if args.command == "eval" else "")
          + "\n| --- | --- | --- | --- |" + (" --- |" if args.command == "eval" else ""))
    for arm, fs in figures.items():
        med = {k: statistics.median(f[k] for f in fs) for k in fs[0]}
        print(f"| {arm} | {med['first_line_s']:.1f} | {med['model_ready_or_bar_s']:.1f} | {med['end_s']:.1f} |"
              + (f" {med['bar_elapsed_s']:.0f} |" if args.command == "eval" else ""))


if __name__ == "__main__":
    main()
