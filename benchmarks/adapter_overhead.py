"""What an env step costs through each adapter against the same step in-process, side by side.

Every arm plays the same scripted Calculator-v0 episode (a calculation, then the answer; the reset,
on item i with seed i, counted into the episode) for ``--episodes`` episodes, arms interleaved for ``--repeats`` rounds
(the best round kept):

- ``in-process``: ``gymnasium.make`` and ``env.step`` (the baseline);
- ``TRL instance``: :func:`turngym.integrations.trl.environment_factory`'s instance, its tools called
  as TRL's tool loop calls them (``calculator(expression=...)``, ``answer(answer=...)``), then
  ``get_reward()``;
- ``SkyRL env``: ``skyrl_gym.make("turngym/Calculator-v0", ...)``, ``init``, ``step`` until done,
  ``get_metrics``, ``close``, as SkyRL's generator drives it (one env per trajectory);
- ``OpenEnv``: the runner's :class:`~turngym.run.backends.openenv.OpenEnvTextEnv` (OpenEnv's client over
  one WebSocket session) against ``turngym serve-env``'s app in a child process.

Reported per step: mean µs and the ratio to in-process.

    python benchmarks/adapter_overhead.py --episodes 300
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench_setup import free_port, wait_up

ENV_ID = "turngym/Calculator-v0"
EXPRESSION, ANSWER = "84 * 63 + 51", "5343"  # item 0; other items answer wrong, which costs the same
STEPS = 2


def in_process(episodes: int) -> float:
    import gymnasium

    import turngym  # noqa: F401 - registers the envs

    env = gymnasium.make(ENV_ID)
    start = time.perf_counter()
    for i in range(episodes):
        env.reset(seed=i, options={"index": i})
        env.step(f"<calc>{EXPRESSION}</calc>")
        env.step(f"<answer>{ANSWER}</answer>")
    return (time.perf_counter() - start) / (episodes * STEPS)


def trl_instance(episodes: int) -> float:
    from turngym.integrations.trl import environment_factory

    env = environment_factory(ENV_ID)()  # TRL pools instances and resets them per rollout
    start = time.perf_counter()
    for i in range(episodes):
        env.reset(prompt=[{"role": "user", "content": ""}], index=i, seed=i)
        env.calculator(expression=EXPRESSION)
        env.answer(answer=ANSWER)
        env.get_reward()
    return (time.perf_counter() - start) / (episodes * STEPS)


def skyrl_env(episodes: int) -> float:
    import skyrl_gym

    import turngym.integrations.skyrl  # noqa: F401 - registers turngym/<EnvId>

    start = time.perf_counter()
    for i in range(episodes):  # SkyRL's generator makes one env per trajectory
        env = skyrl_gym.make(ENV_ID, env_config={}, extras={"index": i, "seed": i})
        env.init([])
        env.step(f"<calc>{EXPRESSION}</calc>")
        env.step(f"<answer>{ANSWER}</answer>")
        env.get_metrics()
        env.close()
    return (time.perf_counter() - start) / (episodes * STEPS)


def skyrl_env_made_once(episodes: int) -> float:
    """The SkyRL env's own step cost, its construction (``gymnasium.make``) left out."""
    import turngym.integrations.skyrl as skyrl

    env = skyrl.make_env(ENV_ID)
    start = time.perf_counter()
    for i in range(episodes):
        env.seed, env.options = i, {"index": i}
        env.init([])
        env.step(f"<calc>{EXPRESSION}</calc>")
        env.step(f"<answer>{ANSWER}</answer>")
    return (time.perf_counter() - start) / (episodes * STEPS)


def openenv(url: str, episodes: int) -> float:
    from turngym.run.backends.openenv import OpenEnvTextEnv

    env = OpenEnvTextEnv(url)
    env.reset(seed=0, options={"index": 0})  # connected outside the timing
    start = time.perf_counter()
    for i in range(episodes):
        env.reset(seed=i, options={"index": i})
        env.step(f"<calc>{EXPRESSION}</calc>")
        env.step(f"<answer>{ANSWER}</answer>")
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed / (episodes * STEPS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=300, help="episodes per arm and round (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best is kept (default: %(default)s)")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # the child process: PORT
    args = ap.parse_args()
    if args.serve:
        from turngym.integrations.openenv import serve_env

        serve_env(ENV_ID, port=int(args.serve))
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], env={**os.environ})
    arms = {"in-process env.step": in_process, "TRL instance (tool methods)": trl_instance,
            "SkyRL env (made per trajectory)": skyrl_env, "SkyRL env (made once)": skyrl_env_made_once}
    best = {name: float("inf") for name in [*arms, "OpenEnv (OpenEnvTextEnv, WebSocket)"]}
    try:
        wait_up(port, proc, "OpenEnv server")
        url = f"http://127.0.0.1:{port}"
        for _ in range(args.repeats):
            for name, arm in arms.items():
                best[name] = min(best[name], arm(args.episodes))
            best["OpenEnv (OpenEnvTextEnv, WebSocket)"] = min(best["OpenEnv (OpenEnvTextEnv, WebSocket)"],
                                                              openenv(url, args.episodes))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    base = best["in-process env.step"]
    print(f"{ENV_ID}, {args.episodes} episodes × {STEPS} steps per arm, best of {args.repeats} interleaved rounds")
    print("| arm | µs/step | / in-process | overhead µs/step |")
    print("|---|---:|---:|---:|")
    for name, s in best.items():
        print(f"| {name} | {s * 1e6:.1f} | {s / base:.2f}× | {(s - base) * 1e6:+.1f} |")


if __name__ == "__main__":
    main()
