"""Per-step overhead of turngym's verl agent loop against verl's own ToolAgentLoop on the same tool calls.

Both loops run inside verl's ``AgentLoopWorker`` (hydra instantiation, padding, batching: one training step's
rollout) on the same tiny tokenizer, and a scripted server answers ``generate`` instantly with the same plan for
every trajectory: three calculations of 12 * 34 + 5, then the answer. turngym's loop plays Calculator-v0 (``<calc>``
calls, its env runs them); ToolAgentLoop gets the same calculation as a Hermes ``<tool_call>`` to a verl function
tool that runs turngym's own ``safe_arith`` (benchmarks/verl_calc_tool.py). An instant server leaves only the loops'
own work (tokenising, parsing, stepping envs or tools, building outputs), so the ratio is the harshest form of the
per-step overhead; with ``--server-ms`` each generate call also waits that long, as a real server would.

    .venv-verl/bin/python benchmarks/verl_agent_loop.py [--batch 64] [--steps 5] [--server-ms 0]

Prints the median step time of each loop (steps alternate between them) and the ratio turngym / ToolAgentLoop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

CALC = "12 * 34 + 5"
TOOL_CALL = f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{CALC}"}}}}</tool_call>'
TOOL_FILE = Path(__file__).resolve().parent / "verl_calc_tool.py"  # calc() over turngym's safe_arith


def scripted_server(config, tokenizer, replies: list[str], server_ms: float):
    """verl's ``generate`` answered from a fixed plan: the i-th call of a trajectory gets ``replies[i]`` + EOS."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    plan = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in replies]

    class ScriptedServer(LLMServerClient):
        def __init__(self) -> None:
            super().__init__(config, load_balancer_handle=None)
            self.calls: dict[str, int] = defaultdict(int)

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            turn = self.calls[request_id]
            self.calls[request_id] += 1
            if server_ms:
                await asyncio.sleep(server_ms / 1000.0)
            return TokenOutput(token_ids=list(plan[min(turn, len(plan) - 1)]), stop_reason="completed")

    return ScriptedServer()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64, help="trajectories per step")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per loop (after one warm-up step each)")
    ap.add_argument("--server-ms", type=float, default=0.0, help="latency of each generate call")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "verl"))
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl_harness import rows, verl_config

    import turngym.integrations.verl  # noqa: F401 - registers the turngym loop
    from turngym.agents.tiny import tiny_model_dir

    model = str(tiny_model_dir(chat=True))
    common = ("actor_rollout_ref.rollout.prompt_length=512", "actor_rollout_ref.rollout.response_length=512",
              "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
              "actor_rollout_ref.rollout.multi_turn.format=hermes",
              "+turngym.env_id=Calculator-v0")
    tool_cfg = verl_config(model, *common, "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
                           f"actor_rollout_ref.rollout.multi_turn.function_tool_path={TOOL_FILE}")
    tg_cfg = verl_config(model, *common, "actor_rollout_ref.rollout.agent.default_agent_loop=turngym")
    workers, servers = {}, {}
    for name, cfg, replies in (
            ("turngym", tg_cfg, [f"<calc>{CALC}</calc>"] * 3 + ["<answer>413</answer>"]),
            ("tool_agent", tool_cfg, [TOOL_CALL] * 3 + ["<answer>413</answer>"])):
        probe = AgentLoopWorker(cfg, None)
        servers[name] = scripted_server(cfg, probe.tokenizer, replies, args.server_ms)
        workers[name] = AgentLoopWorker(cfg, servers[name])

    def step(name: str):
        start = time.perf_counter()
        out = asyncio.run(workers[name].generate_sequences(rows(list(range(args.batch)), k=1)))
        return time.perf_counter() - start, out

    times: dict[str, list[float]] = {"turngym": [], "tool_agent": []}
    for name in times:  # warm-up: tokenizer probes, env construction, tool loading
        _, out = step(name)
        mask = out.batch["response_mask"]
        print(f"{name}: {int(out.non_tensor_batch['__num_turns__'][0])} chat turns, "
              f"{int(mask[0].sum())} reply tokens and {int(out.batch['attention_mask'][0, 512:].sum())} response tokens "
              "per trajectory")
    for _ in range(args.steps):
        for name in times:
            times[name].append(step(name)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    # each turngym step against the ToolAgentLoop step right after it: the machine's load drifts less within a pair
    pairs = [a / b for a, b in zip(times["turngym"], times["tool_agent"], strict=True)]
    for k, v in med.items():
        print(f"{k:>10}: median step {v * 1000:.1f} ms over {args.steps} steps of {args.batch} trajectories "
              f"({v / args.batch * 1000:.2f} ms per trajectory)")
    print(f"ratio turngym / ToolAgentLoop: {med['turngym'] / med['tool_agent']:.3f} of the medians, "
          f"{statistics.median(pairs):.3f} the median of {len(pairs)} adjacent pairs (server latency {args.server_ms} ms)")


if __name__ == "__main__":
    main()
