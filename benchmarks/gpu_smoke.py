"""GPU smoke check, the measuring part of ``benchmarks/gpu_smoke.sh`` (run that).

On one CUDA device, with one model in bf16:
- ``generate``: HF ``generate`` throughput at batch 1, 8 and 32 (tokens/s);
- ``rollout``: Calculator-v0 episodes through turngym's rollout runner, static vs continuous batching
  (episodes/s, arms alternated);
- ``vllm``: a vLLM generation when vLLM is importable, otherwise reported as not installed;
- ``grpo``: ``turngym train`` (TRL's GRPOTrainer with per-turn advantages) for a few steps
  (seconds per step, peak GPU memory).
Each check reports its own failure and the others still run; the exit status is non-zero if any failed.
``--random-init`` builds the model from its config and tokenizer with random weights, for machines the
weights cannot reach: compute, memory and speed are the real architecture's, the text is noise.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path


def build_random_model(config_dir: str, out_dir: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(out_dir)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: random bf16 weights, architecture {config.model_type} from {Path(config_dir).name} "
          f"({n / 1e6:.0f}M parameters)")
    return str(out_dir)


DEVICE = "cuda"


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peak_gib() -> str:
    import torch

    return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if DEVICE == "cuda" else "n/a (cpu)"


def check_generate(model: str) -> None:
    import torch

    from turngym.agents.loading import load_hf_policy
    from turngym.agents.policy import GenerationRequest, SamplingParams

    pol = load_hf_policy(model, dtype="bfloat16", device=DEVICE)
    ids = pol.tokenizer("Question: what is 17 * 23? Think step by step.\nAnswer:")["input_ids"]
    pol.generate([GenerationRequest(prompt_ids=ids)], SamplingParams(max_new_tokens=8, seed=0))  # warm-up
    for bs in (1, 8, 32):
        sync()
        t = time.perf_counter()
        gens = pol.generate([GenerationRequest(prompt_ids=ids)] * bs, SamplingParams(max_new_tokens=128, temperature=1.0, seed=0))
        sync()
        dt = time.perf_counter() - t
        n = sum(len(g.token_ids) for g in gens)
        print(f"generate bf16 batch={bs:3d}: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s")
    print(f"generate peak GPU memory: {peak_gib()}")
    del pol
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def check_rollout(model: str, episodes: int, repeats: int) -> None:
    import gymnasium
    import torch

    import turngym  # noqa: F401  (registers the envs)
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner

    pol = load_hf_policy(model, dtype="bfloat16", device=DEVICE)
    times: dict[str, list[float]] = {"static": [], "continuous": []}
    turns: dict[str, int] = {}
    for rep in range(repeats):
        for batching in ("static", "continuous"):
            runner = RolloutRunner(pol, lambda: gymnasium.make("turngym/Calculator-v0", max_turns=3),
                                   SamplingParams(max_new_tokens=64, temperature=1.0, seed=rep), concurrency=16,
                                   batching=batching)
            sync()
            t = time.perf_counter()
            eps = runner.run(list(range(episodes)))
            sync()
            times[batching].append(time.perf_counter() - t)
            turns[batching] = sum(len(e.turns) for e in eps)
    for batching, ts in times.items():
        med = statistics.median(ts)
        print(f"rollout Calculator-v0 {batching:10s}: {episodes} episodes ({turns[batching]} turns) in {med:.2f} s "
              f"(median of {repeats}) = {episodes / med:.1f} episodes/s")
    ratio = statistics.median(times['static']) / statistics.median(times['continuous'])
    print(f"rollout continuous/static speed ratio: {ratio:.2f}x")
    del pol
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def check_vllm(model: str) -> str | None:
    try:
        import vllm
    except ImportError:
        print("vllm: not installed on this machine: not checked")
        return "NOT CHECKED (vllm not installed)"
    llm = vllm.LLM(model=model, dtype="bfloat16", gpu_memory_utilization=0.3)
    params = vllm.SamplingParams(max_tokens=128, temperature=1.0, seed=0)
    t = time.perf_counter()
    outs = llm.generate(["Question: what is 17 * 23?\nAnswer:"] * 32, params)
    dt = time.perf_counter() - t
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"vllm {vllm.__version__} batch=32: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s")


def check_grpo(model: str, steps: int, out: Path) -> None:
    import torch
    import yaml

    from turngym.training.config import (  # what `turngym train` runs
        TrainConfig,
        build_trainer,
    )

    config = {
        "env": {"id": "turngym/Calculator-v0", "kwargs": {"max_turns": 3}},
        "data": {"indices": [0, 256]},
        "reward": {"name": "outcome"},
        "estimator": {"name": "turn"},
        "model": {"name_or_path": model, "dtype": "bfloat16"},
        "trl": {"output_dir": str(out / "run"), "num_generations": 8, "per_device_train_batch_size": 8,
                "max_completion_length": 128, "max_steps": steps, "logging_steps": 1, "bf16": DEVICE == "cuda",
                "learning_rate": 1.0e-6, "report_to": "none", "save_strategy": "no", "use_cpu": DEVICE == "cpu"},
    }
    path = out / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    trainer = build_trainer(TrainConfig.load(str(path)))
    load_s = time.perf_counter() - t
    trainer.train()
    dt = time.perf_counter() - t
    history = trainer.state.log_history
    logs = [h for h in history if "step_time" in h]
    print(f"grpo: {len(logs)} steps in {dt:.1f} s ({load_s:.1f} s building the trainer and loading the model)")
    for h in logs:
        keys = [k for k in ("step_time", "loss", "grad_norm", "reward", "completions/mean_length", "turngym/turns_per_episode")
                if k in h]
        print(f"grpo step {h.get('step')}: " + ", ".join(f"{k}={float(h[k]):.4g}" for k in keys))
    if logs:
        print(f"grpo median step_time: {statistics.median(float(h['step_time']) for h in logs):.2f} s")
    print(f"grpo peak GPU memory: {peak_gib()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="a model directory, hub id, .gguf file or 'default'")
    ap.add_argument("--random-init", action="store_true", help="--model is a directory with config and tokenizer only")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="runs/gpu_smoke")
    ap.add_argument("--checks", default="generate,rollout,vllm,grpo")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the script itself")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device

    import torch
    import transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"device {name}")
    model = build_random_model(args.model, out / "model") if args.random_init else args.model
    failed = []
    for name in args.checks.split(","):
        t = time.perf_counter()
        status = None
        try:
            status = {"generate": lambda: check_generate(model),
                      "rollout": lambda: check_rollout(model, args.episodes, args.repeats),
                      "vllm": lambda: check_vllm(model), "grpo": lambda: check_grpo(model, args.steps, out)}[name]()
        except Exception:  # noqa: BLE001  (one failed check is reported and the others still run)
            failed.append(name)
            traceback.print_exc(limit=6)
        print(f"[{name}: {'FAILED' if name in failed else status or 'ok'} in {time.perf_counter() - t:.1f} s]", flush=True)
    print("failed checks: " + (", ".join(failed) or "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
