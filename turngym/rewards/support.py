"""Support scoring: p(y | τ≤t), the policy's belief in a reference answer y after a trajectory prefix.

p(y | τ≤t) = exp(mean log-probability of y's tokens) after the prefix τ≤t followed by a
pseudo-answer cue (``<answer>``, ``\\boxed{`` ...). Scoring points for an episode with
turns 0..T-1 are t = 0 (prompt only) and one after each non-final turn, so turn i's
process reward is Φ_{i+1} − Φ_i and the final (answer) turn gets none.

``prefix="after_observation"`` (default) scores after turn i's tool output, so the turn
whose call fetched useful evidence gets the credit; ``"before_observation"`` scores right
after the action, which moves that credit to the next turn.

The local scorer builds each episode's KV cache once, growing it point by point, and at
every point runs the cue and all references in one small batch on a copy of that cache. Scoring runs in fp32 by default (bf16 scores
drift by up to 0.7 nats between code paths).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from turngym.episode import Episode

PREFIX_MODES = ("after_observation", "before_observation")


def default_pseudo_answer(env_id: str) -> str:
    if "MathCode" in env_id:
        return "\nThe final answer is \\boxed{"
    if "SearchQA" in env_id or "Calculator" in env_id:
        return "<answer>"
    return "\nAnswer: "


def episode_prefix_ids(episode: Episode, tokenizer: Any, mode: str = "after_observation") -> list[list[int]]:
    """Token ids of τ≤t for every scoring point (each a prefix of the next)."""
    if mode not in PREFIX_MODES:
        raise ValueError(f"prefix must be one of {PREFIX_MODES}, got {mode!r}")
    if episode.prompt_ids is not None and all(t.action_ids is not None for t in episode.turns):
        ids = list(episode.prompt_ids)
        acts = [list(t.action_ids) for t in episode.turns]
        obs = [list(t.observation_ids or []) for t in episode.turns]
    else:  # text-only episodes: tokenise the rendered text piece by piece
        from turngym.agents.tokenization import ConversationTokenizer

        ct = ConversationTokenizer(tokenizer)
        ids = ct.prompt_ids(episode.prompt)
        acts = [ct.encode(t.action) for t in episode.turns]
        obs = [ct.encode(t.observation or "") for t in episode.turns]
    points = [list(ids)]
    for i in range(len(episode.turns) - 1):
        ids += acts[i]
        if mode == "before_observation":
            points.append(list(ids))
            ids += obs[i]
        else:
            ids += obs[i]
            points.append(list(ids))
    return points


class SupportScorer(Protocol):
    tokenizer: Any

    def mean_logprobs(self, points: Sequence[Sequence[int]], cue: Sequence[int],
                      references: Sequence[Sequence[int]]) -> list[list[float]]:
        """``[point][reference]`` mean log p of each reference's tokens after ``point + cue``."""
        ...


@dataclass
class HFSupportScorer:
    """A local transformers causal LM (the current policy or a frozen copy)."""

    model: Any
    tokenizer: Any
    cached: bool = True  # False: one full forward per (point, reference), the naive baseline
    stats: dict[str, int] = field(default_factory=lambda: {"forwards": 0, "tokens": 0})

    @classmethod
    def load(cls, model: str, dtype: str = "float32", device: str | None = None, **kwargs: Any) -> "HFSupportScorer":
        from turngym.agents.loading import load_hf_policy

        policy = load_hf_policy(model, dtype=dtype, device=device)
        return cls(policy.model, policy.tokenizer, **kwargs)

    def mean_logprobs(self, points, cue, references):
        import torch

        if not points:
            return []
        for a, b in zip(points, points[1:]):
            if list(b[: len(a)]) != list(a):
                raise ValueError("scoring points must be nested prefixes")
        if any(len(r) == 0 for r in references):
            raise ValueError("a reference answer tokenised to nothing")
        with torch.inference_mode():
            return self._cached(points, cue, references) if self.cached else self._naive(points, cue, references)

    def _forward(self, ids: list[int] | list[list[int]], past: Any = None, keep: int = 1):
        import torch

        device = next(self.model.parameters()).device
        batch = ids if ids and isinstance(ids[0], list) else [ids]
        self.stats["forwards"] += 1
        self.stats["tokens"] += sum(len(row) for row in batch)
        # newer transformers 5.x name the cache argument ``cache``; earlier ones ``past_key_values``
        cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        return self.model(input_ids=torch.tensor(batch, device=device), **{cache_kw: past},
                          use_cache=past is not None, logits_to_keep=keep)

    @staticmethod
    def _mean_lp(logits: Any, targets: Sequence[int]) -> float:
        import torch

        lp = torch.log_softmax(logits.float(), dim=-1)
        idx = torch.tensor(list(targets), device=lp.device)
        return float(lp[torch.arange(len(targets), device=lp.device), idx].mean())

    def _naive(self, points, cue, references):
        out = []
        for point in points:
            row = []
            for ref in references:
                seq = list(point) + list(cue) + list(ref)
                logits = self._forward(seq, keep=len(ref) + 1).logits[0, :-1]
                row.append(self._mean_lp(logits, ref))
            out.append(row)
        return out

    def _cached(self, points, cue, references):
        """Prefix KV computed once; every point scores all references in one small batch.

        Full-attention caches are filled with the longest prefix in one forward and cropped
        back per point; caches with sliding-window layers (which cannot be cropped back) are
        grown point by point instead.
        """
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        layers = getattr(cache, "layers", None) or []
        longest = list(points[-1][:-1])
        croppable = bool(layers) and bool(longest) and all(type(x).__name__ == "DynamicLayer" for x in layers)
        if croppable:
            self._forward(longest, past=cache)
        fed = len(longest) if croppable else 0
        out = []
        for point in points:
            upto = len(point) - 1  # the point's last token is fed with each continuation
            if croppable:
                past = copy.deepcopy(cache)
                if fed > upto:
                    past.crop(-(fed - upto))
            else:
                if upto > fed:
                    self._forward(list(point[fed:upto]), past=cache)
                    fed = upto
                past = copy.deepcopy(cache)
            out.append(self._score_point(past, point[-1], cue, references))
        return out

    def _score_point(self, past: Any, last: int, cue: Sequence[int], references: Sequence[Sequence[int]]) -> list[float]:
        # all references at once, right-padded: with causal attention the padding comes after
        # every scored position, so it changes nothing that is read
        tails = [[last] + list(cue) + list(ref) for ref in references]
        width = max(len(t) for t in tails)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if len(tails) > 1:
            past.batch_repeat_interleave(len(tails))
        logits = self._forward([t + [pad] * (width - len(t)) for t in tails], past=past, keep=width).logits
        c = len(cue)
        return [self._mean_lp(logits[j, c:c + len(ref)], ref) for j, ref in enumerate(references)]


@dataclass
class OpenAISupportScorer:
    """vLLM's ``prompt_logprobs`` through its OpenAI-compatible ``/completions`` endpoint.

    All (point, reference) prompts of an episode go in one request; the tokenizer must be
    the served model's.
    """

    model: str
    base_url: str
    tokenizer: Any
    api_key: str | None = None
    timeout_s: float = 120.0
    retries: int = 3

    def mean_logprobs(self, points, cue, references):
        from turngym.agents.openai_compat import OpenAICompatPolicy

        client = OpenAICompatPolicy(model=self.model, base_url=self.base_url, api_key=self.api_key,
                                    timeout_s=self.timeout_s, retries=self.retries)
        prompts, spans = [], []
        for point in points:
            for ref in references:
                seq = list(point) + list(cue) + list(ref)
                prompts.append(seq)
                spans.append((len(seq) - len(ref), list(ref)))
        data = client._post("/completions", {"model": self.model, "prompt": prompts, "max_tokens": 1,
                                             "temperature": 0.0, "prompt_logprobs": 0})
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise RuntimeError(f"server returned {len(choices)} choices for {len(prompts)} prompts")
        flat = []
        for choice, (start, ref) in zip(choices, spans):
            plp = choice.get("prompt_logprobs")
            if not plp:
                raise RuntimeError("server gave no prompt_logprobs (is it vLLM with prompt_logprobs support?)")
            vals = [float(plp[start + k][str(tok)]["logprob"]) for k, tok in enumerate(ref)]
            flat.append(sum(vals) / len(vals))
        n = len(references)
        return [flat[i * n:(i + 1) * n] for i in range(len(points))]


def make_scorer(spec: Any) -> SupportScorer:
    """A scorer object, a local model (directory / hub id / ``default``), or None (error)."""
    if spec is None:
        raise ValueError("this reward needs a support scorer: pass scorer=<model path or id> or a scorer object")
    if isinstance(spec, str):
        return HFSupportScorer.load(spec)
    return spec
