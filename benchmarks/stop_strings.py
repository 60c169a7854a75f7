"""Stop strings: the cost of each way to stop `generate` on a string, side by side.

Arms (same model, prompts, greedy decoding, interleaved repeats):
- rebuilt: transformers' ``stop_strings=`` (a new ``StopStringCriteria`` every call: the old path);
- cached: one ``StopStringCriteria`` built once and passed as ``stopping_criteria``;
- tail: turngym's ``TailStopStrings`` (decodes only the last few generated tokens; what HFPolicy uses).
Reports the median generate time per call, the one-off build time, and checks that all arms
return the same tokens. On a busy machine whole-generate timings are noisy, so the script
also times the parts that differ, in the same process: building the criteria (what the
rebuilt arm pays on every call) and one stopping check per decode step, against one decode
forward of the model. Usage: python benchmarks/stop_strings.py [--model default] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import StoppingCriteriaList, StopStringCriteria

from turngym.agents.hf import TailStopStrings
from turngym.agents.loading import load_hf_policy
from turngym.agents.tokenization import ConversationTokenizer
from turngym.envs.calculator import CalculatorEnv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    args = ap.parse_args()
    policy = load_hf_policy(args.model, device="cpu")
    tok, model = policy.tokenizer, policy.model
    env = CalculatorEnv(prompt_style="base")
    conv = ConversationTokenizer(tok, use_chat_template=False)
    prompts = [conv.prompt_ids(env.make_prompt(env.get_item(i))) for i in range(args.batch)]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    stop = list(env.stop)
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False,
                  pad_token_id=tok.pad_token_id, top_p=None, top_k=None, temperature=None)

    t = time.perf_counter()
    cached = StopStringCriteria(tokenizer=tok, stop_strings=stop)
    build = {"cached": time.perf_counter() - t}
    t = time.perf_counter()
    tail = TailStopStrings(tok, stop)
    build["tail"] = time.perf_counter() - t

    arms = {
        "rebuilt": lambda: model.generate(**common, stop_strings=stop, tokenizer=tok),
        "cached": lambda: model.generate(**common, stopping_criteria=StoppingCriteriaList([cached])),
        "tail": lambda: model.generate(**common, stopping_criteria=StoppingCriteriaList([tail.criterion(width)])),
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    outputs: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        arms["tail"]()  # warm-up
        for rep in range(args.repeats):
            for name, fn in arms.items():  # interleaved
                t = time.perf_counter()
                out = fn()
                times[name].append(time.perf_counter() - t)
                outputs[name] = out
            print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
        # the parts that differ, interleaved: a build per call vs a check per step
        parts: dict[str, list[float]] = {"build StopStringCriteria": [], "check cached (per step)": [],
                                          "check tail (per step)": [], "decode forward (per step)": []}
        seq = outputs["tail"]
        tail_crit = tail.criterion(width)
        past = model(input_ids=seq[:, :-1], attention_mask=torch.ones_like(seq[:, :-1])).past_key_values
        for _ in range(args.repeats):
            t = time.perf_counter()
            StopStringCriteria(tokenizer=tok, stop_strings=stop)
            parts["build StopStringCriteria"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(20):
                cached(seq, None)
            parts["check cached (per step)"].append((time.perf_counter() - t) / 20)
            t = time.perf_counter()
            for _ in range(20):
                tail_crit(seq, None)
            parts["check tail (per step)"].append((time.perf_counter() - t) / 20)
            step_cache = copy.deepcopy(past)
            t = time.perf_counter()
            model(input_ids=seq[:, -1:], attention_mask=torch.ones_like(seq), past_key_values=step_cache)
            parts["decode forward (per step)"].append(time.perf_counter() - t)
    same = all(torch.equal(outputs["rebuilt"], o) for o in outputs.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"model={args.model} batch={args.batch} max_new_tokens={args.max_new_tokens} repeats={args.repeats} "
          f"stop={stop} vocab={len(tok)}")
    print(f"one-off build: StopStringCriteria {build['cached']:.3f} s, TailStopStrings {build['tail'] * 1000:.3f} ms")
    for k in arms:
        print(f"{k:8s}: median generate {med[k]:.3f} s  ({med['rebuilt'] / med[k]:.2f}x of rebuilt)")
    print(f"tail vs cached StopStringCriteria: {med['cached'] / med['tail']:.3f}x; same tokens in all arms: {same}")
    pm = {k: statistics.median(v) for k, v in parts.items()}
    for k, v in pm.items():
        print(f"{k:28s}: {v * 1000:9.3f} ms (median of {args.repeats})")
    steps = args.max_new_tokens
    rebuilt = pm["build StopStringCriteria"] + steps * pm["check cached (per step)"]
    print(f"stop-string cost per generate call of {steps} steps: rebuilt {rebuilt * 1000:.1f} ms, "
          f"cached {steps * pm['check cached (per step)'] * 1000:.2f} ms, "
          f"tail {steps * pm['check tail (per step)'] * 1000:.2f} ms; "
          f"generating those steps: {steps * pm['decode forward (per step)'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
