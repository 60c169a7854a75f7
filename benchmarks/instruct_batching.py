"""Instruct-model generation throughput: 8 prompts in one batched ``generate`` vs one at a time.

Same 8 GSM8K chat prompts (MathCode-v0's), greedy, a fixed number of new tokens (EOS and stop
strings off, so both arms generate exactly the same token count). Arms alternate for
``--rounds`` rounds; medians reported. Goal: batched ≥ 3× sequential tokens/s.
Both wall time and the process's CPU time are reported: on a shared, loaded machine the
CPU-time ratio is the load-independent figure (the work per generated token).
Usage: python benchmarks/instruct_batching.py [--model qwen2.5-coder-0.5b-instruct] [--tokens 32] [--rounds 2]
       [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from turngym.agents.loading import load_policy
from turngym.agents.policy import GenerationRequest
from turngym.corpora.datasets import load_dataset
from turngym.envs.math_code import CHAT_SYSTEM


@torch.inference_mode()
def generate(policy, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """Wall and CPU seconds to generate exactly ``tokens`` new tokens for every prompt in one batch."""
    width = max(len(p) for p in prompts)
    pad = policy.tokenizer.pad_token_id
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    start, cpu = time.perf_counter(), time.process_time()
    policy.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
    return time.perf_counter() - start, time.process_time() - cpu


def add(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = load_policy(args.model)
    data = load_dataset("gsm8k", None)
    prompts = [policy.encode_request(GenerationRequest(messages=[{"role": "system", "content": CHAT_SYSTEM},
                                                                 {"role": "user", "content": data[i]["question"]}]))
               for i in range(args.batch)]
    generate(policy, prompts[:1], 2)  # warm-up
    batched, sequential = [], []
    n = args.batch * args.tokens
    print(f"model {args.model} ({policy.model.dtype}, {torch.get_num_threads()} threads), {args.batch} prompts x "
          f"{args.tokens} new tokens, {args.rounds} rounds", flush=True)
    for r in range(args.rounds):
        batched.append(generate(policy, prompts, args.tokens))
        print(f"round {r}: batched wall {batched[-1][0]:.1f} s cpu {batched[-1][1]:.1f} s", flush=True)
        sequential.append(add([generate(policy, [p], args.tokens) for p in prompts]))
        print(f"round {r}: sequential wall {sequential[-1][0]:.1f} s cpu {sequential[-1][1]:.1f} s", flush=True)
    for i, what in enumerate(("wall", "cpu")):
        b, s = statistics.median(x[i] for x in batched), statistics.median(x[i] for x in sequential)
        print(f"{what}: batched {b:.1f} s ({n / b:.1f} tok/s), sequential {s:.1f} s ({n / s:.1f} tok/s), "
              f"speed-up batched / sequential {s / b:.2f}x (goal >= 3x)", flush=True)


if __name__ == "__main__":
    main()
