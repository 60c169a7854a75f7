"""Chaos at scale on the Ray env pool: ``--episodes`` Calculator-v0 episodes (k=4, 16 in flight, static batching)
played against the fake OpenAI server of benchmarks/inflight.py (a real HTTP server in a child process, a
two-turn script), on a 2-worker pool while ``--faults`` faults hit its actors at moments spread over the run:

- ``start-up``: an actor SIGKILLed while it builds its envs (its process title is ``ray::EnvWorker.__init__``);
- ``mid-episode``: a live actor SIGKILLed while its episodes wait for their next action;
- ``together``: both live actors SIGKILLed at once;
- ``restart``: an actor SIGKILLed, then its replacement SIGKILLed while it starts;
- ``frozen``: an actor SIGSTOPped (found at its call deadline, then killed through Ray).

Then what the episodes file holds against the same episodes played in process (lost, duplicated, differing),
and a table with a row per actor lost: the fault that caused it, its moment (the policy's generate call, or
start-up), seconds until a fresh actor was ready in its place, episodes replayed off it.

``--refusals`` also starts a token-authenticated head (``ray start --head`` on loopback, a temp folder of its own)
and times each refusal: a closed port, an HTTP server, a silent TCP server, Ray's client port without
``ray://``, the token cluster without ``RAY_AUTH_MODE=token``; and a ``turngym eval --ray`` whose GCS is killed
mid-run, from the kill to its one line.

    nice python benchmarks/ray_chaos.py --episodes 2000 --faults 20 --refusals
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_setup import free_port, pids_of, wait_up

KINDS = ("mid-episode", "together", "mid-episode", "restart", "mid-episode", "frozen")


class StartupKiller:
    """SIGKILLs the next ``armed`` actors of this Ray node seen building their envs (children of its raylet titled
    ``ray::EnvWorker.__init__``): a kill at the moment an actor starts, from outside, as a node would."""

    def __init__(self, raylet_pid: int):
        self.raylet, self.armed, self.killed, self._stop = raylet_pid, 0, [], False
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop:
            if self.armed:
                for p in Path("/proc").iterdir():
                    if not p.name.isdigit() or not self.armed:
                        continue
                    with contextlib.suppress(OSError, IndexError):
                        if b"EnvWorker.__init__" in (p / "cmdline").read_bytes() and \
                                int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.raylet:
                            os.kill(int(p.name), signal.SIGKILL)
                            self.killed.append((int(p.name), time.monotonic()))
                            self.armed -= 1
            time.sleep(0.005)

    def close(self) -> None:
        self._stop = True
        self._thread.join()


def chaos_run(url: str, episodes: int, faults: int) -> tuple[list[dict], dict]:
    import ray

    from turngym.agents.openai_compat import OpenAICompatPolicy
    from turngym.agents.policy import PolicyBase, SamplingParams
    from turngym.agents.runner import RolloutRunner
    from turngym.envs.calculator import CalculatorEnv
    from turngym.episode import played_content
    from turngym.episode.reader import read_episodes
    from turngym.run.backends.ray_pool import RayEnvPool

    policy = OpenAICompatPolicy(model="fake", base_url=url, server="openai", concurrency=16, timeout_s=300)
    sampling, tasks = SamplingParams(max_new_tokens=16), range(episodes // 4)
    start = time.perf_counter()
    local = RolloutRunner(policy, lambda: CalculatorEnv(max_turns=4), sampling, k=4, concurrency=16).run(tasks)
    in_process_s = time.perf_counter() - start

    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    killer = StartupKiller(raylet)
    events: list[tuple[str, str, float]] = []  # (fault, moment, when)
    ticks = episodes // 16 * 2  # the static runner's generate calls: 16 in flight, two turns each
    marks = {max(2, ticks * (i + 1) // faults): KINDS[i % len(KINDS)] for i in range(faults - 1)}

    class ChaosPolicy(PolicyBase):
        """The real OpenAI-compatible policy; before chosen generate calls a fault hits the pool's actors."""

        name, tokenizer, calls = "fake", None, 0

        def generate(self, requests, sampling):
            self.calls += 1
            kind = marks.get(self.calls)
            if kind is not None:
                live = pool.live_workers()
                victims = live if kind == "together" else live[self.calls % len(live):][:1]
                for w in victims:
                    os.kill(w.pid, signal.SIGSTOP if kind == "frozen" else signal.SIGKILL)
                    events.append((kind, f"call {self.calls}", time.monotonic()))
                if kind == "restart":
                    killer.armed += 1
            return policy.generate(requests, sampling)

    out = os.path.join(tempfile.mkdtemp(), "episodes.jsonl")
    killer.armed = 1
    start = time.perf_counter()
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 4}, workers=2, envs_per_worker=8, restarts=3 * faults,
                    step_budget_s=1.0, deadline_slack_s=5.0) as pool:
        RolloutRunner(ChaosPolicy(), pool, sampling, k=4, concurrency=16, batching="static").run(tasks, out)
        deaths = list(pool.deaths.record)
    pool_s = time.perf_counter() - start
    killer.close()
    policy.close()
    written = read_episodes(out, strict=True).episodes
    ids = [e.id for e in written]
    want = {e.id: played_content(e) for e in local}
    lost = len(set(want) - set(ids))
    rows = []
    for i, (_, when) in enumerate(killer.killed):  # the start-up kills, at the moment each was made
        events.append(("start-up", "pool start" if i == 0 else "its replacement starting", when))
    pending = sorted(events, key=lambda e: e[2])
    for d in deaths:  # each loss to the latest fault injected before it was found
        cause = [e for e in pending if e[2] <= d.at]
        fault, moment = (cause[-1][0], cause[-1][1]) if cause else ("(none injected)", "")
        rows.append({"fault": fault, "moment": moment, "found": d.cause[:60], "recovered_s":
                     None if d.replaced_s is None else round(d.replaced_s, 2), "replayed": d.replayed})
    totals = {"episodes": episodes, "faults_injected": len(events),
              "actors_lost": len(deaths), "written": len(ids), "lost": lost, "duplicated": len(ids) - len(set(ids)),
              "differ_from_in_process": sum(played_content(e) != want.get(e.id) for e in written),
              "episodes_replayed": sum(len(e.meta["ray"].get("replays", [])) for e in written),
              "startup_kills": len(killer.killed), "in_process_s": round(in_process_s, 1), "pool_s": round(pool_s, 1)}
    return rows, totals


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def timed_refusal(address: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Seconds until ``check_address`` refuses ``address`` (in a child process with ``env``), and its line."""
    code = ("import sys,time\nfrom turngym.run.backends.ray_address import check_address\nt=time.monotonic()\n"
            "try:\n    check_address(sys.argv[1]); print('joined')\nexcept Exception as e:\n"
            "    print(f'{time.monotonic()-t:.2f}', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, address], env=env, capture_output=True, text=True, timeout=60)
    took, _, line = proc.stdout.strip().partition(" ")
    return float(took) if took.replace(".", "").isdigit() else float("nan"), line


def refusals() -> list[tuple[str, float, str]]:
    rows = []
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    silent = socket.create_server(("127.0.0.1", 0))
    rows.append(("closed port", *timed_refusal("127.0.0.1:1")))
    rows.append(("HTTP server", *timed_refusal(f"127.0.0.1:{web.server_address[1]}")))
    rows.append(("silent TCP server", *timed_refusal(f"127.0.0.1:{silent.getsockname()[1]}")))
    web.shutdown()
    silent.close()
    temp = tempfile.mkdtemp(prefix="rtg")
    gcs, client = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "bench-token-0123456789abcdef"}
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={gcs}",
                    f"--ray-client-server-port={client}", "--num-cpus=2", "--include-dashboard=false",
                    f"--temp-dir={temp}", "--disable-usage-stats"], env=env, check=True, capture_output=True, timeout=300)
    try:
        rows.append(("client port without ray://", *timed_refusal(f"127.0.0.1:{client}", base)))
        rows.append(("token cluster, no RAY_AUTH_MODE", *timed_refusal(f"127.0.0.1:{gcs}", {**base, "HOME": temp})))
        rows.append(("lost GCS mid-run (kill to exit)", *lost_gcs(gcs, temp, env)))
    finally:
        for pid in pids_of(temp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return rows


def lost_gcs(gcs: int, temp: str, env: dict[str, str]) -> tuple[float, str]:
    from turngym.agents.tiny import tiny_model_dir

    out = Path(tempfile.mkdtemp()) / "run"
    proc = subprocess.Popen([sys.executable, "-m", "turngym.cli", "eval", "--env", "Calculator-v0", "--limit", "60",
                             "--max-turns", "2", "--max-new-tokens", "6", "--model", str(tiny_model_dir(chat=True)),
                             "--concurrency", "2", "--out", str(out), "--ray", f"127.0.0.1:{gcs}", "--env-workers", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path = out / "episodes.jsonl"
    while proc.poll() is None and not (path.is_file() and path.read_text().count("\n") >= 2):
        time.sleep(0.2)
    [pid] = [p for p in pids_of(temp) if b"gcs_server" in Path(f"/proc/{p}/cmdline").read_bytes()]
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    return time.monotonic() - start, err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--latency", type=float, default=0.02, help="the fake server's seconds per reply")
    ap.add_argument("--refusals", action="store_true", help="also time each refusal (starts a token-auth head)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from turngym.run.backends.ray_pool import init_ray

    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "inflight.py"), "--serve-fake",
                             str(port), "--latency", str(args.latency)])
    try:
        wait_up(port, proc, "fake server")
        init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
        rows, totals = chaos_run(f"http://127.0.0.1:{port}/v1", args.episodes, args.faults)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("\n| fault | moment | found as | recovered in s | replayed episodes |")
    print("|---|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['fault']} | {r['moment']} | {r['found']} | {r['recovered_s']} | {r['replayed']} |")
    print(f"\n{json.dumps(totals)}")
    print(f"lost {totals['lost']}, duplicated {totals['duplicated']}, differing from in process "
          f"{totals['differ_from_in_process']} of {totals['episodes']}")
    refused = refusals() if args.refusals else []
    if refused:
        print("\n| refused | seconds | line |")
        print("|---|---:|---|")
        for what, took, line in refused:
            print(f"| {what} | {took:.2f} | {line} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"deaths": rows, "totals": totals, "refusals": refused}, indent=1))


if __name__ == "__main__":
    main()
