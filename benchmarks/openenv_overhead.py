"""What an env step costs through OpenEnv against the same step in-process.

Three arms, side by side, each playing the same scripted Calculator-v0 and Digits-v0 episodes:
- ``in-process``: ``gymnasium.make`` and ``env.step`` (the baseline);
- ``openenv``: OpenEnv's own client (``GenericEnvClient``, one WebSocket session) against
  ``turngym.integrations.openenv``'s server (OpenEnv's FastAPI app on uvicorn, a child process);
- ``runner-env``: :class:`OpenEnvTextEnv`, the Gymnasium env the rollout runner plays (the
  client step plus the record kept on this side, and a ``state`` read when the episode ends).

Reported per step (reset and ``state`` reads counted into the episode): mean µs and the ratio
to in-process.

    python benchmarks/openenv_overhead.py --episodes 200
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench_setup import free_port, wait_up

SCRIPTS = {
    "turngym/Calculator-v0": ["<calc>80*10+19</calc>", "<answer>819</answer>"],
    "turngym/Digits-v0": ["12 34", "56"],
}


def in_process(env_id: str, episodes: int) -> float:
    import gymnasium

    import turngym  # noqa: F401 - registers the envs

    env = gymnasium.make(env_id)
    steps, start = 0, time.perf_counter()
    for i in range(episodes):
        env.reset(seed=i, options={"index": i})
        for a in SCRIPTS[env_id]:
            steps += 1
            if any(env.step(a)[2:4]):
                break
    return (time.perf_counter() - start) / steps


def through_openenv(url: str, env_id: str, episodes: int) -> float:
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=url).sync() as client:
        client.reset(seed=0, index=0)  # connect outside the timing
        steps, start = 0, time.perf_counter()
        for i in range(episodes):
            client.reset(seed=i, index=i)
            for a in SCRIPTS[env_id]:
                steps += 1
                if client.step({"text": a}).done:
                    break
        return (time.perf_counter() - start) / steps


def runner_env(url: str, env_id: str, episodes: int) -> float:
    from turngym.run.backends.openenv import OpenEnvTextEnv

    env = OpenEnvTextEnv(url)
    steps, start = 0, time.perf_counter()
    for i in range(episodes):
        env.reset(seed=i, options={"index": i})
        for a in SCRIPTS[env_id]:
            steps += 1
            if any(env.step(a)[2:4]):
                break
    env.close()
    return (time.perf_counter() - start) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200, help="episodes per arm and env (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds; the best is kept (default: %(default)s)")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)  # the child process: ENV_ID:PORT
    args = ap.parse_args()
    if args.serve:
        from turngym.integrations.openenv import serve_env

        env_id, port = args.serve.rsplit(":", 1)
        serve_env(env_id, port=int(port))
        return
    print("| env | in-process µs/step | OpenEnv client µs/step | runner's OpenEnvTextEnv µs/step | client / in-process |")
    print("|---|---:|---:|---:|---:|")
    for env_id in SCRIPTS:
        port = free_port()
        proc = subprocess.Popen([sys.executable, __file__, "--serve", f"{env_id}:{port}"], env={**os.environ})
        try:
            wait_up(port, proc, "OpenEnv server")
            url = f"http://127.0.0.1:{port}"
            best = {"local": float("inf"), "openenv": float("inf"), "runner": float("inf")}
            for _ in range(args.repeats):
                best["local"] = min(best["local"], in_process(env_id, args.episodes))
                best["openenv"] = min(best["openenv"], through_openenv(url, env_id, args.episodes))
                best["runner"] = min(best["runner"], runner_env(url, env_id, args.episodes))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        us = {k: v * 1e6 for k, v in best.items()}
        print(f"| {env_id} | {us['local']:.0f} | {us['openenv']:.0f} | {us['runner']:.0f} | "
              f"{us['openenv'] / us['local']:.1f}× |", flush=True)


if __name__ == "__main__":
    main()
