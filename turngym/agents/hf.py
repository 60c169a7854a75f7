"""Local transformers policy: batched generation from token ids, with per-token logprobs.

Rows are left-padded into one ``generate`` call; each row is then cut at its own end
(EOS, a stop string, or its per-request token budget). Logprobs are recorded during
decoding by a logits processor, so no (steps x vocab) score tensor is ever kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from turngym.agents.continuous import ContinuousBatcher
from turngym.agents.policy import Deliver, Feed, Generation, GenerationRequest, PolicyBase, PolicyError, Prepare, SamplingParams


class _LogprobRecorder(LogitsProcessor):
    """Keeps log p(token) under the distribution each token was drawn from."""

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0
        self.prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, last_tokens[:, None]).squeeze(1))
            self.prev = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(last_tokens.shape[0], 0)


class TailStopStrings:
    """Stop strings for one tokenizer, built once and reused by every ``generate`` call.

    Transformers' ``stop_strings=`` builds a ``StopStringCriteria`` on every call, which walks
    the whole vocabulary (0.58 s per call for Gemma's 262k tokens). This checks instead, per row
    and step, the text of only the last few generated tokens: every token decodes to at least
    one byte, so ``window`` tokens always cover the longest stop string plus the token that
    completed it. Where the text is cut is decided afterwards by :func:`cut_generation`.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str]):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        if not self.stop:
            raise ValueError("TailStopStrings needs at least one non-empty stop string")
        self.window = max(len(s.encode("utf-8")) for s in self.stop) + 2

    def hit(self, generated: Sequence[int]) -> bool:
        """Whether the text of ``generated`` (the ids after the prompt) now contains a stop string."""
        tail = self.tokenizer.decode(list(generated[-self.window:]), skip_special_tokens=False)
        return any(s in tail for s in self.stop)

    def criterion(self, prompt_width: int) -> StoppingCriteria:
        return _TailStopCriterion(self, prompt_width)


class _TailStopCriterion(StoppingCriteria):
    """One ``generate`` call's view of :class:`TailStopStrings` (rows start after ``prompt_width``)."""

    def __init__(self, stops: TailStopStrings, prompt_width: int):
        self.stops, self.prompt_width = stops, prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        rows = input_ids[:, self.prompt_width:][:, -self.stops.window:].tolist()
        return torch.tensor([self.stops.hit(r) for r in rows], dtype=torch.bool, device=input_ids.device)


@dataclass
class HFPolicy(PolicyBase):
    """A transformers causal LM as a :class:`~turngym.agents.policy.Policy`: streams (continuous batching) and
    scores (its ``model`` is in this process)."""

    model: Any
    tokenizer: Any
    name: str = "hf"
    max_context: int | None = None
    supports_stream: ClassVar[bool] = True
    supports_score: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.max_context is None:
            self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._eos_ids = eos_ids_of(self.model, self.tokenizer)
        self._stop_cache: dict[tuple[str, ...], TailStopStrings] = {}

    def stop_strings(self, stop: Sequence[str]) -> TailStopStrings:
        """The stop-string checker for ``stop``, built on first use and then reused."""
        key = tuple(stop)
        if key not in self._stop_cache:
            self._stop_cache[key] = TailStopStrings(self.tokenizer, key)
        return self._stop_cache[key]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode_request(self, req: GenerationRequest) -> list[int]:
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        if req.prompt_text is not None:
            return self.tokenizer(req.prompt_text, add_special_tokens=True)["input_ids"]
        if req.messages is not None:
            return list(self.tokenizer.apply_chat_template(req.messages, tools=req.tools or None, add_generation_prompt=True,
                                                           tokenize=True, return_dict=False))
        raise PolicyError("a GenerationRequest needs prompt_ids, prompt_text or messages")

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        if not requests:
            return []
        prompts = [self.encode_request(r) for r in requests]
        if any(len(p) == 0 for p in prompts):
            raise PolicyError("empty prompt: nothing to condition on")
        caps = [min(sampling.max_new_tokens, r.max_new_tokens or sampling.max_new_tokens) for r in requests]
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        recorder = _LogprobRecorder(sampling.temperature)
        do_sample = sampling.temperature > 0
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max(caps),
            do_sample=do_sample,
            pad_token_id=pad,
            eos_token_id=sorted(self._eos_ids),
            logits_processor=LogitsProcessorList([recorder]),
            return_dict_in_generate=True,
        )
        if do_sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if any(sampling.stop):
            kwargs["stopping_criteria"] = StoppingCriteriaList([self.stop_strings(sampling.stop).criterion(width)])
        start = time.perf_counter()
        out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), **kwargs)
        logprobs = recorder.finish(out.sequences[:, -1]).cpu()
        seqs = out.sequences[:, width:].cpu()
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        results = []
        for i in range(len(prompts)):
            gen = self.finish_generation(seqs[i].tolist(), logprobs[i].tolist(), caps[i], sampling.stop)
            gen.meta = {"batch_ms": elapsed_ms, "batch_size": len(prompts)}
            results.append(gen)
        return results

    def stream(self, feed: Feed, deliver: Deliver, sampling: SamplingParams, max_rows: int,
               prepare: Prepare | None = None) -> int:
        """Continuous batching: decode up to ``max_rows`` requests at once, deliver each as soon as it
        ends and admit the next one in its place (see :mod:`turngym.agents.continuous`). Each reply is
        delivered the moment it ends, alone, so ``prepare`` is never needed (accepted for the contract).
        Returns the number of model forward calls."""
        batcher = ContinuousBatcher(self, sampling, max_rows)
        batcher.run(feed, deliver)
        return batcher.forwards

    @property
    def eos_ids(self) -> set[int]:
        return self._eos_ids

    def finish_generation(self, ids: list[int], logprobs: list[float], cap: int, stop: Sequence[str]) -> Generation:
        """A generated row as a :class:`Generation`: cut at its end, text without the EOS token."""
        ids, finish = self._cut_row(ids, cap, stop)
        text_ids = ids[:-1] if ids and ids[-1] in self._eos_ids else ids
        return Generation(text=self.tokenizer.decode(text_ids, skip_special_tokens=False), token_ids=ids,
                          logprobs=list(logprobs[: len(ids)]), finish_reason=finish)

    def _cut_row(self, ids: list[int], cap: int, stop: Sequence[str]) -> tuple[list[int], str]:
        return cut_generation(self.tokenizer, ids, cap, stop, self._eos_ids)


def cut_generation(tokenizer: Any, ids: list[int], cap: int, stop: Sequence[str], eos_ids: set[int]) -> tuple[list[int], str]:
    """A generated row cut at its end: the first EOS (kept), the first stop string (kept), or ``cap``."""
    end, finish = min(cap, len(ids)), "length"
    for j, t in enumerate(ids[:end]):
        if t in eos_ids:
            end, finish = j + 1, "stop"
            break
    if stop:
        text = tokenizer.decode(ids[:end], skip_special_tokens=False)
        hits = [(text.find(s), s) for s in stop if s and s in text]
        if hits:
            pos, s = min(hits)
            target = pos + len(s)
            lo, hi = 1, end  # smallest prefix whose text reaches past the stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if len(tokenizer.decode(ids[:mid], skip_special_tokens=False)) >= target:
                    hi = mid
                else:
                    lo = mid + 1
            end, finish = lo, "stop"
    return ids[:end], finish


def eos_ids_of(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for tok in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(tok) if tok in tokenizer.get_vocab() else None
        if tid is not None:
            ids.add(int(tid))
    return ids
