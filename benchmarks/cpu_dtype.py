"""bf16 against fp32 for a model on this CPU: a prompt's forward (prefill) and one decode step, side by side.

A CPU without bf16 arithmetic (no ``avx512_bf16``/``amx_bf16``) makes torch convert every bf16 matmul, so
``load_hf_policy(dtype="auto")`` picks fp32 there (:func:`turngym.agents.loading.cpu_computes_bf16`). This
measures what that choice is worth: the arms alternate (bf16, fp32, bf16, ...), each loads the model, times one
``--tokens``-token forward and the mean of ``--decode`` one-token steps of ``--batch`` sequences after a
64-token context (a static batch decodes several episodes at once), and the medians and their ratios are
printed as each arm finishes.
Usage: python benchmarks/cpu_dtype.py [--model qwen2.5-coder-0.5b-instruct] [--tokens 512] [--batch 1]
       [--repeats 2] [--threads 0]
"""

from __future__ import annotations

import argparse
import statistics
import time


def measure(location: str, dtype, tokens: int, decode: int, batch: int = 1) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(location, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20_000, (1, tokens), generator=gen)
    context = torch.randint(100, 20_000, (batch, 64 + decode), generator=gen)
    with torch.no_grad():
        t0 = time.perf_counter()
        lm(ids)
        prefill = time.perf_counter() - t0
        cache = lm(context[:, :64], use_cache=True).past_key_values
        t0 = time.perf_counter()
        for i in range(decode):
            cache = lm(context[:, 64 + i: 65 + i], past_key_values=cache, use_cache=True).past_key_values
        step = (time.perf_counter() - t0) / decode
    return prefill, step


def main() -> None:
    import torch

    from turngym.agents.loading import cpu_computes_bf16, resolve_model_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded at once")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    location = resolve_model_dir(args.model)
    print(f"{args.model}: CPU computes bf16: {cpu_computes_bf16()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
    arms: dict[str, list[tuple[float, float]]] = {"bfloat16": [], "float32": []}
    for r in range(args.repeats):
        for name in arms:
            arms[name].append(measure(location, getattr(torch, name), args.tokens, args.decode, args.batch))
            p, d = arms[name][-1]
            print(f"repeat {r + 1} {name:>8}: prefill {args.tokens} tokens {p:.2f} s, decode {d * 1e3:.0f} ms/token",
                  flush=True)
    med = {n: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v)) for n, v in arms.items()}
    print(f"medians: prefill bf16 {med['bfloat16'][0]:.2f} s / fp32 {med['float32'][0]:.2f} s = "
          f"{med['bfloat16'][0] / med['float32'][0]:.2f}×; decode bf16 {med['bfloat16'][1] * 1e3:.0f} ms / fp32 "
          f"{med['float32'][1] * 1e3:.0f} ms = {med['bfloat16'][1] / med['float32'][1]:.2f}×")


if __name__ == "__main__":
    main()
