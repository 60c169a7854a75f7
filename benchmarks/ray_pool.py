"""Episodes/s of the eval pipeline (what ``turngym eval`` runs: the progress bar, episodes written to the run
folder) against a fast fake OpenAI server (benchmarks/inflight.py's: a real HTTP server in a child process,
every reply after ``--latency`` seconds, a two-turn Calculator-v0 script), with the envs

- ``cli``: in this process (the baseline);
- ``pool1`` / ``pool2``: on a Ray actor pool of 1 / 2 workers (``--ray auto --env-workers N``);
- ``aiohttp``: no turngym at all, aiohttp alone sending each episode's two requests (the ceiling of any
  client in one Python process on the machine);

side by side at each level of episodes in flight (default 8, 64, 256, 1024); the ideal is
``level / (2 turns × latency)``. Each row also gives the CPU per episode of this process and of the fake
server in the arm's best run. Each arm's figure is the best of ``--repeats`` alternating runs; the
play time excludes starting the pool (``RunOutcome.wall_s``). Then the pool's overhead per env step:
``--steps`` sequential ``reset``+``step`` calls on one env, in process vs through the pool. Then the kill test:
a ``--kill-episodes`` run on a 2-worker pool while ``--kills`` worker processes are SIGKILLed, and what the
episodes file holds (lost, duplicated, replayed).

    python benchmarks/ray_pool.py                                   # 8 64 256 1024, 100 ms per reply
    python benchmarks/ray_pool.py --levels 256 --arms cli --batching continuous
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_setup import free_port, wait_up
from inflight import SCRIPT

ARMS = {"cli": None, "pool1": 1, "pool2": 2, "aiohttp": "bare"}


def bare_run(url: str, level: int, episodes: int) -> float:
    """The ceiling of any client in one Python process on this machine: aiohttp alone, no envs, no records,
    no retries, the same two requests per episode (the script's calculation, then its answer) at ``level`` in
    flight. What turngym's client costs beyond this is its own."""
    import asyncio

    import aiohttp

    head = {"Content-Type": "application/json"}

    async def play() -> None:
        left = iter(range(episodes))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=level)) as session:
            async def slot() -> None:
                for i in left:
                    messages = [{"role": "system", "content": "Use <calc>."}, {"role": "user", "content": f"What is {i}?"}]
                    for _ in SCRIPT:
                        body = json.dumps({"model": "fake", "messages": messages, "max_tokens": 16}).encode()
                        async with session.post(url + "/chat/completions", data=body, headers=head) as resp:
                            reply = json.loads(await resp.text())
                        messages += [reply["choices"][0]["message"], {"role": "user", "content": "<result>42</result>"}]

            await asyncio.gather(*(slot() for _ in range(level)))

    start = time.perf_counter()
    asyncio.run(play())
    return episodes / (time.perf_counter() - start)


def one_run(url: str, level: int, episodes: int, workers: int | None, batching: str) -> float:
    from turngym.agents.openai_compat import OpenAICompatPolicy
    from turngym.cli._progress import BarProgress
    from turngym.run.outputs import EvalFolderWriter
    from turngym.run.pipeline import RunSpec, execute

    k = 8
    spec = RunSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 4}, model="fake", base_url=url,
                   server="openai", k=k, limit=episodes // k, concurrency=level, max_new_tokens=16, batching=batching,
                   **({"ray": "auto", "env_workers": workers} if workers else {}))
    policy = OpenAICompatPolicy(model="fake", base_url=url, server="openai", concurrency=level, timeout_s=300)
    bar = BarProgress()
    try:
        outcome = execute(spec, EvalFolderWriter(tempfile.mkdtemp()), policy=policy, progress=bar)
    finally:
        bar.finish()
        policy.close()
    assert len(outcome.episodes) == episodes and all(len(e.turns) == 2 for e in outcome.episodes)
    return episodes / outcome.wall_s


def step_overhead(steps: int, batch: int = 64) -> dict[str, float]:
    """ms per env call in process and through a 1-worker pool: one call waited on alone (reset + step, one at a
    time), and batched as the runner sends them (``batch`` envs, every reset / step of a tick submitted first)."""
    from turngym.envs.calculator import CalculatorEnv
    from turngym.run.backends.ray_pool import RayEnvPool

    def alone(env) -> float:
        start = time.perf_counter()
        for i in range(steps):
            env.reset(seed=i, options={"index": i % 100})
            env.step("<calc>6*7</calc>")
        return (time.perf_counter() - start) * 1000.0 / (2 * steps)

    def batched(envs) -> float:
        rounds = max(1, steps // len(envs))
        start = time.perf_counter()
        for r in range(rounds):
            for i, env in enumerate(envs):
                if hasattr(env, "submit_reset"):
                    env.submit_reset(seed=i, options={"index": (r + i) % 100})
            for i, env in enumerate(envs):
                env.reset(seed=i, options={"index": (r + i) % 100})
            for env in envs:
                if hasattr(env, "submit_step"):
                    env.submit_step("<calc>6*7</calc>")
            for env in envs:
                env.step("<calc>6*7</calc>")
        return (time.perf_counter() - start) * 1000.0 / (2 * rounds * len(envs))

    here = [CalculatorEnv(max_turns=4) for _ in range(batch)]
    here_alone, here_batched = alone(here[0]), batched(here)
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 4}, workers=1, envs_per_worker=batch) as pool:
        envs = [pool() for _ in range(batch)]
        alone(envs[0])  # warm-up
        pool_alone, pool_batched = alone(envs[0]), batched(envs)
    return {"alone_in_process_ms": round(here_alone, 3), "alone_pool_ms": round(pool_alone, 3),
            "batched_in_process_ms": round(here_batched, 3), "batched_pool_ms": round(pool_batched, 3),
            "batched_overhead_ms": round(pool_batched - here_batched, 3)}


def kill_run(url: str, episodes: int, kills: int) -> dict[str, int]:
    """``episodes`` through a 2-worker pool (16 in flight, static batching), SIGKILLing a live worker's process
    ``kills`` times, spread over the run, each while its episodes are mid-episode; then count what the episodes
    file holds."""
    import signal

    from turngym.agents.openai_compat import OpenAICompatPolicy
    from turngym.agents.policy import PolicyBase, SamplingParams
    from turngym.agents.runner import RolloutRunner
    from turngym.episode.reader import read_episodes
    from turngym.run.backends.ray_pool import RayEnvPool

    out = os.path.join(tempfile.mkdtemp(), "episodes.jsonl")
    policy = OpenAICompatPolicy(model="fake", base_url=url, server="openai", concurrency=16, timeout_s=300)
    killed: list[int] = []
    ticks = episodes // 16 * len(SCRIPT)  # the static runner's generate calls: every episode has 2 turns
    marks = {2 * (ticks * (i + 1) // (2 * (kills + 1))) for i in range(kills)}  # even: the second turn's call

    class KillingPolicy(PolicyBase):
        """The real OpenAI-compatible policy; before chosen generate calls (the live episodes have played their
        first turn) a live worker's process is SIGKILLed."""

        name, tokenizer, calls = "fake", None, 0

        def generate(self, requests, sampling):
            self.calls += 1
            if self.calls in marks:
                victim = pool.live_workers()[len(killed) % 2]
                os.kill(victim.pid, signal.SIGKILL)
                killed.append(victim.pid)
            return policy.generate(requests, sampling)

    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 4}, workers=2, envs_per_worker=8) as pool:
        runner = RolloutRunner(KillingPolicy(), pool, SamplingParams(max_new_tokens=16), k=4, concurrency=16,
                               batching="static")
        played = runner.run(range(episodes // 4), out)
        replaced = pool.replaced
    policy.close()
    ids = [e.id for e in read_episodes(out, strict=True).episodes]
    replays = sum(len(e.meta["ray"].get("replays", [])) for e in played)
    return {"episodes": episodes, "kills": len(killed), "actors_replaced": replaced, "written": len(ids),
            "lost": episodes - len(set(ids)), "duplicated": len(ids) - len(set(ids)), "episodes_replayed": replays}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=2, help="episodes per level = rounds × level")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--batching", default="continuous", choices=["static", "continuous"])
    ap.add_argument("--steps", type=int, default=2000, help="calls for the per-step overhead (0: skip)")
    ap.add_argument("--ray-cpus", type=int, default=None, help="num_cpus of the local Ray node (default: the cores)")
    ap.add_argument("--kills", type=int, default=5, help="worker SIGKILLs during a --kill-episodes eval (0: skip)")
    ap.add_argument("--kill-episodes", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "inflight.py"), "--serve-fake",
                             str(port), "--latency", str(args.latency)])
    url = f"http://127.0.0.1:{port}/v1"
    import psutil  # the fake server's CPU (psutil comes with the math extra, not with ray)

    server = psutil.Process(proc.pid)
    rows = []
    try:
        wait_up(port, proc, "fake server")
        if any(isinstance(ARMS[a], int) for a in args.arms) or args.steps or args.kills:
            import ray

            ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
        with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115 - the bars, not the figures
            one_run(url, 8, 8, None, args.batching)  # warm-up: imports, first connections
        for level in args.levels:
            n = args.rounds * level
            rates: dict[str, list[float]] = {a: [] for a in args.arms}
            cpu: dict[str, list[tuple[float, float]]] = {a: [] for a in args.arms}  # (client, server) CPU s
            for _ in range(args.repeats):
                for arm in args.arms:
                    mine, theirs = time.process_time(), sum(server.cpu_times()[:2])
                    with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115
                        rates[arm].append(bare_run(url, level, n) if ARMS[arm] == "bare"
                                          else one_run(url, level, n, ARMS[arm], args.batching))
                    cpu[arm].append((time.process_time() - mine, sum(server.cpu_times()[:2]) - theirs))
            ideal = level / (len(SCRIPT) * args.latency)
            row = {"in_flight": level, "episodes": n, "ideal_eps": round(ideal, 1)}
            for arm in args.arms:
                best = rates[arm].index(max(rates[arm]))
                row[f"{arm}_eps"] = round(rates[arm][best], 1)
                row[f"{arm}_of_ideal"] = round(rates[arm][best] / ideal, 2)
                # CPU per episode of this process (its threads; a pool's actors are other processes) and the server
                row[f"{arm}_client_cpu_ms"] = round(cpu[arm][best][0] * 1000 / n, 3)
                row[f"{arm}_server_cpu_ms"] = round(cpu[arm][best][1] * 1000 / n, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        overhead = step_overhead(args.steps) if args.steps else None
        if overhead:
            print(json.dumps(overhead), flush=True)
        kills = None
        if args.kills:
            kills = kill_run(url, args.kill_episodes, args.kills)
            print(json.dumps(kills), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    head = " | ".join(f"{a} ep/s (of ideal)" for a in args.arms)
    print(f"\n| in flight | episodes | ideal ep/s | {head} |")
    print("|---:|---:|---:|" + "---:|" * len(args.arms))
    for r in rows:
        cells = " | ".join(f"{r[f'{a}_eps']} ({r[f'{a}_of_ideal']})" for a in args.arms)
        print(f"| {r['in_flight']} | {r['episodes']} | {r['ideal_eps']} | {cells} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"latency_s": args.latency, "batching": args.batching, "rows": rows, "step": overhead, "kills": kills},
                      fh, indent=1)


if __name__ == "__main__":
    main()
