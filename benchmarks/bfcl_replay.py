"""BFCL-v0 costs, side by side with bfcl-eval run directly.

1. Step latency for one multi-turn API call: ``env.step("[ls()]")`` (decode, guard,
   execute on the backend, render) vs bfcl-eval's ``execute_multi_turn_func_call`` alone.
2. Full replay of multi_turn_base (200 entries, ground truths played as model output,
   per-turn state and response checks) through the env vs bfcl-eval's evaluator alone
   on the same raw outputs (``_evaluate_single_multi_turn_entry``: decode, execute, check).
   Goal: env / checker <= 1.5x.

Arms alternate, several rounds; the median of each arm is reported.
Usage: python benchmarks/bfcl_replay.py [--rounds 5] [--category multi_turn_base]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bfcl_cases import END_TURN  # noqa: E402
from turngym.envs.bfcl.calls import calls_from_strings, render_prompting  # noqa: E402
from turngym.envs.bfcl.env import BFCLEnv  # noqa: E402
from turngym.envs.bfcl.reference import official_multi_turn  # noqa: E402
from turngym.envs.bfcl.upstream import bfcl  # noqa: E402


def replay_texts(env: BFCLEnv) -> list[list[list[str]]]:
    """Per entry, per user turn: the step texts that replay its ground truth."""
    out = []
    for i in range(env.num_items()):
        env.reset(options={"index": i})
        gt = env.data.answers[env.context.entry["id"]]
        out.append([([render_prompting(calls_from_strings(t, env.session.parameters))] if t else []) + [END_TURN]
                    for t in gt])
    env.close()
    return out


def run_env(env: BFCLEnv, texts) -> int:
    valid = 0
    for i, turns in enumerate(texts):
        env.reset(options={"index": i})
        info = {}
        for turn in turns:
            for text in turn:
                _, _, _, _, info = env.step(text)
        valid += bool(info["outcome"]["bfcl_valid"])
    return valid


def run_checker(env: BFCLEnv, texts) -> int:
    data = env.data
    return sum(bool(official_multi_turn(data.name, turns, data.checker_entries[i], data.answers[data.entries[i]["id"]])
                    ["valid"]) for i, turns in enumerate(texts))


def step_latency(rounds: int, n: int = 300) -> tuple[float, float]:
    env = BFCLEnv(category="multi_turn_base")
    utils = bfcl()["multi_turn_utils"]
    env_ms, raw_ms = [], []
    for _ in range(rounds):
        spent = 0.0
        for _ in range(n // 20):  # bfcl-eval allows 20 steps per user turn; reset between blocks
            env.reset(options={"index": 0})
            t0 = time.perf_counter()
            for _ in range(20):
                env.step("[ls()]")
            spent += time.perf_counter() - t0
        entry = env.context.entry
        env_ms.append(spent * 1000 / (n // 20 * 20))
        key = f"bench_{uuid.uuid4().hex}"
        t0 = time.perf_counter()
        for _ in range(n):
            utils.execute_multi_turn_func_call(["ls()"], entry["initial_config"], entry["involved_classes"], key,
                                               entry["id"])
        raw_ms.append((time.perf_counter() - t0) * 1000 / n)
        store = vars(utils)
        for name in [k for k in store if k.startswith(key)]:
            store.pop(name)
    return statistics.median(env_ms), statistics.median(raw_ms)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--category", default="multi_turn_base")
    args = ap.parse_args()
    env_step, raw_step = step_latency(args.rounds)
    print(f"step latency, one multi-turn call: env {env_step:.3f} ms, bfcl-eval execute alone {raw_step:.3f} ms, "
          f"ratio {env_step / raw_step:.2f}x")
    env = BFCLEnv(category=args.category)
    texts = replay_texts(env)
    env_s, chk_s = [], []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        v_env = run_env(env, texts)
        env_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        v_chk = run_checker(env, texts)
        chk_s.append(time.perf_counter() - t0)
        print(f"round {r}: env {env_s[-1]:.2f} s ({v_env} valid), checker {chk_s[-1]:.2f} s ({v_chk} valid)")
    e, c = statistics.median(env_s), statistics.median(chk_s)
    print(f"full replay of {args.category} ({len(texts)} entries): env {e:.2f} s, bfcl-eval checker alone {c:.2f} s, "
          f"ratio {e / c:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
