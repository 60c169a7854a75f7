"""Constrained choice for local models: pick an enum value by the model's own log-probabilities.

A judge's score (0-3) or a router's prototype id is one value from a fixed list. With a
local transformers model there is no need to hope the sampled text is one of them: each
option is scored as a continuation of the prompt and the most likely one is taken (greedy)
or one is drawn from the renormalised distribution (temperature > 0). The rest of the JSON
is then generated after it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch


@torch.inference_mode()
def option_logprobs(policy: Any, prompt_text: str, options: Sequence[str], add_special_tokens: bool = True) -> list[float]:
    """log p(option | prompt) for each option text, in one padded forward pass (a policy that declares
    ``supports_score``: its ``model`` and ``tokenizer`` are in this process)."""
    tok, model = policy.tokenizer, policy.model
    base = tok(prompt_text, add_special_tokens=add_special_tokens)["input_ids"]
    seqs = [tok(prompt_text + o, add_special_tokens=add_special_tokens)["input_ids"] for o in options]
    starts = []
    for s in seqs:  # where the option's tokens begin (a boundary token may merge with the prompt's last)
        k = 0
        while k < min(len(base), len(s)) and base[k] == s[k]:
            k += 1
        starts.append(max(1, k))
    device = next(model.parameters()).device
    if base and all(st == len(base) and len(s) == len(base) + 1 for st, s in zip(starts, seqs, strict=True)):
        # every option is one token after the whole prompt (a judge's 0-3 score): one forward pass of the
        # prompt alone gives them all, instead of one padded copy of the prompt per option
        last = model(input_ids=torch.tensor([base], device=device)).logits[0, -1].float()
        logp1 = torch.log_softmax(last, dim=-1)
        return [float(logp1[s[-1]]) for s in seqs]
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for i, s in enumerate(seqs):
        total = sum(float(logp[i, p - 1, s[p]]) for p in range(starts[i], len(s)))
        out.append(total)
    return out


def pick_option(policy: Any, prompt_text: str, options: Sequence[str], temperature: float = 0.0,
                rng: random.Random | None = None, add_special_tokens: bool = True) -> int:
    scores = option_logprobs(policy, prompt_text, options, add_special_tokens)
    if temperature <= 0:
        return max(range(len(options)), key=lambda i: scores[i])
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return (rng or random.Random()).choices(range(len(options)), weights=weights)[0]
