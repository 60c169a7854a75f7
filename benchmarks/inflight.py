"""Episodes/s of one turngym process through the OpenAI-compatible backend at 8, 64 and 256
episodes in flight, against a fast fake OpenAI server (a real HTTP server in a child process:
starlette on uvicorn; only the model behind it is fake: every reply takes ``--latency`` seconds
and follows a fixed Calculator-v0 script, a calculation then an answer).

Two arms side by side at each level, on the same server and episodes:
- ``static``: the runner's ticks, ``generate()`` on a thread pool as wide as the level (the
  baseline: every tick waits for its slowest reply);
- ``stream``: the runner's continuous batching over HTTP (``OpenAICompatPolicy.stream``: one
  asyncio loop, each episode stepped as its reply lands, its slot refilled at once).

The goal is episodes/s growing linearly with the level until the fake server saturates; the
ideal at a level is ``level / (turns × latency)``. ``--server-slots`` caps the fake's concurrent
replies (a saturated server), default: no cap.

    python benchmarks/inflight.py                  # 8, 64, 256 in flight, 100 ms per reply
    python benchmarks/inflight.py --levels 8 64 256 512 --latency 0.05
    python benchmarks/inflight.py --base-url http://HOST:8000/v1 --model NAME   # a real server instead

Against a real server the replies are the model's (episodes end when it answers or at 4 turns),
so there is no ideal column; compare the arms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from bench_setup import free_port, wait_up

SCRIPT = ["<calc>6*7</calc>", "<answer>42</answer>"]


def fake_app(latency: float, slots: int | None):
    """The fake model's ASGI app: /v1/chat/completions answers after ``latency`` seconds."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    gate = asyncio.Semaphore(slots) if slots else None
    open_now = {"n": 0, "peak": 0}  # requests being answered; the most at once since the last /peak

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        turns = sum(m["role"] == "assistant" for m in body["messages"])
        text = SCRIPT[min(turns, len(SCRIPT) - 1)]
        open_now["n"] += 1
        open_now["peak"] = max(open_now["peak"], open_now["n"])
        try:
            if gate is not None:
                async with gate:
                    await asyncio.sleep(latency)
            else:
                await asyncio.sleep(latency)
        finally:
            open_now["n"] -= 1
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})

    async def peak(request: Request) -> JSONResponse:
        seen, open_now["peak"] = open_now["peak"], 0
        return JSONResponse({"peak": seen})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/peak", peak)])


def server_peak(url: str) -> int:
    """The fake's most requests open at once since it was last asked (then reset)."""
    import httpx

    return httpx.get(url.rsplit("/v1", 1)[0] + "/peak", timeout=30).json()["peak"]


def serve_fake(port: int, latency: float, slots: int | None) -> None:
    import uvicorn

    uvicorn.run(fake_app(latency, slots), host="127.0.0.1", port=port, log_level="warning", backlog=4096)


def one_run(url: str, level: int, episodes: int, batching: str, model: str = "fake") -> float:
    from turngym.agents.openai_compat import OpenAICompatPolicy
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner
    from turngym.envs.calculator import CalculatorEnv

    policy = OpenAICompatPolicy(model=model, base_url=url, server="openai", concurrency=level, timeout_s=300)
    runner = RolloutRunner(policy=policy, env_factory=lambda: CalculatorEnv(max_turns=4), concurrency=level,
                           batching=batching, sampling=SamplingParams(max_new_tokens=16))
    start = time.perf_counter()
    done = runner.run(range(episodes))
    wall = time.perf_counter() - start
    policy.close()
    assert len(done) == episodes and (model != "fake" or all(len(e.turns) == 2 for e in done))
    return episodes / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="+", default=[8, 64, 256], help="episodes in flight")
    ap.add_argument("--latency", type=float, default=0.1, help="seconds per fake reply (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=4, help="episodes per level = rounds × level (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats per arm (default: %(default)s)")
    ap.add_argument("--server-slots", type=int, default=None, help="cap on the fake's concurrent replies")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--base-url", default=None, help="a real OpenAI-compatible server instead of the fake")
    ap.add_argument("--model", default="fake", help="the served model's name (with --base-url)")
    ap.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    if args.serve_fake is not None:
        serve_fake(args.serve_fake, args.latency, args.server_slots)
        return
    proc = None
    if args.base_url:
        url = args.base_url
    else:
        port = free_port()
        cmd = [sys.executable, __file__, "--serve-fake", str(port), "--latency", str(args.latency)]
        if args.server_slots:
            cmd += ["--server-slots", str(args.server_slots)]
        proc = subprocess.Popen(cmd, env={**os.environ})
        url = f"http://127.0.0.1:{port}/v1"
    rows = []
    try:
        if proc is not None:
            wait_up(port, proc, "fake server")
        one_run(url, 8, 8, "continuous", args.model)  # warm-up: imports, first connections
        for level in args.levels:
            n = args.rounds * level
            rates: dict[str, list[float]] = {"static": [], "continuous": []}
            peaks: dict[str, int] = {"static": 0, "continuous": 0}
            for _ in range(args.repeats):
                for arm in ("static", "continuous"):
                    if proc is not None:
                        server_peak(url)
                    rates[arm].append(one_run(url, level, n, arm, args.model))
                    if proc is not None:
                        peaks[arm] = max(peaks[arm], server_peak(url))
            best = {arm: max(v) for arm, v in rates.items()}
            ideal = level / (len(SCRIPT) * args.latency) if proc is not None else float("nan")
            rows.append({"in_flight": level, "episodes": n, "static_eps": round(best["static"], 1),
                         "stream_eps": round(best["continuous"], 1), "ideal_eps": round(ideal, 1),
                         "stream_vs_static": round(best["continuous"] / best["static"], 2),
                         "stream_of_ideal": round(best["continuous"] / ideal, 2),
                         "peak_open_static": peaks["static"], "peak_open_stream": peaks["continuous"]})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print("\n| in flight | episodes | static ep/s | stream ep/s | ideal ep/s | stream/static | stream/ideal "
          "| most open at once (static, stream) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['in_flight']} | {r['episodes']} | {r['static_eps']} | {r['stream_eps']} | {r['ideal_eps']} | "
              f"{r['stream_vs_static']}× | {r['stream_of_ideal']} | {r['peak_open_static']}, {r['peak_open_stream']} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"latency_s": args.latency, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
