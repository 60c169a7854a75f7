"""Continuous batching for a local transformers model: a finished row's slot is refilled at once.

``generate`` runs every row of a batch until its longest row ends, so rows whose turn ended
early sit idle, and a new turn re-reads its whole context. Here one decode loop owns the
batch: when a row ends (EOS, stop string, token cap) its result is delivered immediately;
the caller steps the environment and hands back the row's next request (the same episode's
next turn, whose KV cache is kept and only the new ids are read) or nothing, and the slot
goes to the next waiting request in the same loop.

The batch KV cache is right-aligned: row ``i`` holds its ``n_i`` cached positions in the last
``n_i`` columns and is masked to the left, exactly as left padding in ``generate``, so a row
sees the same positions, mask and sliding windows as in a static batch. New ids for one row
are read in a forward of that row alone (no padding tokens computed), then the batch cache is
rebuilt around it. Greedy requests with identical ids are decoded once and the result copied.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, TopPLogitsWarper

from turngym.agents.policy import Deliver, Feed, Generation, GenerationRequest, PolicyError, SamplingParams


@dataclass
class _Row:
    key: Hashable
    prompt: list[int]  # ids this request conditions on
    cap: int
    cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # (1, H, n, D) per layer
    cached: int = 0  # positions in the cache (prompt + generated, minus the pending token)
    pending: int | None = None  # the sampled token not yet fed
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    followers: list[Hashable] = field(default_factory=list)  # identical greedy requests served by this row
    started: float = field(default_factory=time.perf_counter)


def supports_continuous(model: Any) -> str | None:
    """Why ``model`` cannot run the continuous loop, or None when it can."""
    cfg = model.config.get_text_config(decoder=True)
    if getattr(cfg, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported"
    if any(t not in ("full_attention", "sliding_attention") for t in (getattr(cfg, "layer_types", None) or [])):
        return f"layer types {sorted(set(cfg.layer_types))} (only full and sliding attention)"
    return None


class ContinuousBatcher:
    """The decode loop of :meth:`HFPolicy.stream`; one instance per stream."""

    def __init__(self, policy: Any, sampling: SamplingParams, max_rows: int):
        reason = supports_continuous(policy.model)
        if reason:
            raise PolicyError(f"continuous batching is not available for this model: {reason}")
        self.policy, self.model, self.sampling, self.max_rows = policy, policy.model, sampling, max_rows
        self.device = policy.device
        self.stops = policy.stop_strings(sampling.stop) if any(sampling.stop) else None
        self.greedy = sampling.temperature == 0
        self.top_p = TopPLogitsWarper(sampling.top_p) if not self.greedy and sampling.top_p < 1 else None
        self.rng = torch.Generator(device=self.device)
        if sampling.seed is not None:
            self.rng.manual_seed(sampling.seed)
        else:
            self.rng.seed()
        self.rows: list[_Row] = []  # rows in the batch, in cache order
        self.cache: DynamicCache | None = None
        self.width = 0
        self._index: dict[int, int] = {}  # id(row) -> its row in the batch cache
        self.forwards = 0  # model forward calls (for tests and benchmarks)
        # transformers renamed ``past_key_values`` to ``cache`` during 5.x
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    # ------------------------------------------------------------------ public

    @torch.inference_mode()
    def run(self, feed: Feed, deliver: Deliver) -> None:
        waiting: list[tuple[Hashable, GenerationRequest, _Row | None]] = []
        while True:
            free = self.max_rows - len(self.rows) - len(waiting)
            if free > 0:
                waiting.extend((k, r, None) for k, r in feed(free))
            if waiting:
                ready = self._admit(waiting)
                waiting = []
                waiting.extend(self._finish_rows(ready, deliver))
                continue
            if not self.rows:
                return
            self._decode_step()
            done = [r for r in self.rows if self._ended(r)]
            if done:
                self.rows = [r for r in self.rows if r not in done]
                self._take_out(done)
                waiting.extend(self._finish_rows(done, deliver))

    # ------------------------------------------------------------------ rows in and out

    def _cap(self, req: GenerationRequest) -> int:
        return min(self.sampling.max_new_tokens, req.max_new_tokens or self.sampling.max_new_tokens)

    def _admit(self, waiting: list[tuple[Hashable, GenerationRequest, _Row | None]]) -> list[_Row]:
        """Read each new request's unread ids (one forward per row), sample its first token, and
        put it in the batch. Returns the rows that already ended on that first token."""
        new_rows: list[_Row] = []
        for key, req, previous in waiting:
            prompt = self.policy.encode_request(req)
            if not prompt:
                raise PolicyError("empty prompt: nothing to condition on")
            cap = self._cap(req)
            if self.greedy:  # an identical greedy request in flight gives the same tokens
                leader = next((r for r in self.rows + new_rows if r.prompt == prompt and r.cap == cap), None)
                if leader is not None:
                    leader.followers.append(key)
                    continue
            row = _Row(key=key, prompt=prompt, cap=cap)
            start = 0
            if previous is not None and previous.cache is not None and previous.cached <= len(prompt) \
                    and prompt[:previous.cached] == (previous.prompt + previous.generated)[:previous.cached]:
                row.cache, row.cached, start = previous.cache, previous.cached, previous.cached
            if start == len(prompt):  # nothing new to read: re-read the last id to get its logits
                row.cache = [(k[:, :, :-1], v[:, :, :-1]) for k, v in row.cache]
                row.cached = start = len(prompt) - 1
            self._read(row, prompt[start:])
            new_rows.append(row)
        ended = [r for r in new_rows if self._ended(r)]
        joined = [r for r in new_rows if r not in ended]
        if joined:
            self._rebuild(self.rows + joined)
        return ended

    def _read(self, row: _Row, ids: list[int]) -> None:
        """Feed ``ids`` to ``row`` alone, keep its cache, sample its next token from the last logits."""
        past = DynamicCache(ddp_cache_data=row.cache) if row.cache is not None else DynamicCache()
        n = row.cached
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        positions = torch.arange(n, n + len(ids), device=self.device)[None]
        mask = torch.ones((1, n + len(ids)), dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self._cache_arg: past})
        self.forwards += 1
        row.cache = [(layer.keys, layer.values) for layer in past.layers]
        row.cached = n + len(ids)
        self._sample([row], out.logits[:, -1, :])

    def _take_out(self, rows: Sequence[_Row]) -> None:
        """Copy each ended row's own cache out of the batch cache (it may be continued)."""
        for row in rows:
            i = self._index[id(row)]
            row.cache = [(layer.keys[i:i + 1, :, self.width - row.cached:], layer.values[i:i + 1, :, self.width - row.cached:])
                         for layer in self.cache.layers]
        self._rebuild(self.rows)

    def _rebuild(self, rows: list[_Row]) -> None:
        """The batch cache for ``rows``, right-aligned to the longest, from each row's cache."""
        if self.cache is not None:
            for row in self.rows:
                if id(row) in self._index and row.cache is None:
                    i = self._index[id(row)]
                    row.cache = [(layer.keys[i:i + 1, :, self.width - row.cached:],
                                  layer.values[i:i + 1, :, self.width - row.cached:]) for layer in self.cache.layers]
        self.rows = rows
        if not rows:
            self.cache, self.width, self._index = None, 0, {}
            return
        width = max(r.cached for r in rows)
        layers = []
        for li in range(len(rows[0].cache)):
            ks, vs = [], []
            for r in rows:
                k, v = r.cache[li]
                pad = width - k.shape[2]
                if pad:
                    k = torch.nn.functional.pad(k, (0, 0, pad, 0))
                    v = torch.nn.functional.pad(v, (0, 0, pad, 0))
                ks.append(k)
                vs.append(v)
            layers.append((torch.cat(ks), torch.cat(vs)))
        for r in rows:
            r.cache = None  # the batch cache holds it now
        self.cache, self.width = DynamicCache(ddp_cache_data=layers), width
        self._index = {id(r): i for i, r in enumerate(rows)}

    # ------------------------------------------------------------------ decoding

    def _decode_step(self) -> None:
        rows = self.rows
        tokens = torch.tensor([[r.pending] for r in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([[r.cached] for r in rows], dtype=torch.long, device=self.device)
        mask = torch.zeros((len(rows), self.width + 1), dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            mask[i, self.width - r.cached:] = 1
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self._cache_arg: self.cache})  # the cache grows in place
        self.forwards += 1
        self.width += 1
        for r in rows:
            r.cached += 1
        self._sample(rows, out.logits[:, -1, :])

    def _sample(self, rows: Sequence[_Row], logits: torch.Tensor) -> None:
        """Pick each row's next token; its logprob under the distribution it was drawn from."""
        logits = logits.float()
        if self.greedy:
            picked = logits.argmax(-1)
            logp = torch.log_softmax(logits, -1)
        else:
            scaled = logits / self.sampling.temperature
            logp = torch.log_softmax(scaled, -1)
            warped = self.top_p(None, scaled) if self.top_p is not None else scaled
            picked = torch.multinomial(torch.softmax(warped, -1), 1, generator=self.rng).squeeze(1)
        chosen = logp.gather(1, picked[:, None]).squeeze(1).tolist()
        for r, t, lp in zip(rows, picked.tolist(), chosen, strict=True):
            r.pending = t
            r.generated.append(t)
            r.logprobs.append(lp)

    def _ended(self, row: _Row) -> bool:
        if row.generated[-1] in self.policy.eos_ids or len(row.generated) >= row.cap:
            return True
        return self.stops is not None and self.stops.hit(row.generated)

    def _finish_rows(self, rows: Sequence[_Row], deliver: Deliver) -> list[tuple[Hashable, GenerationRequest, _Row | None]]:
        """Deliver ended rows (and their followers); collect the requests that continue them."""
        nxt: list[tuple[Hashable, GenerationRequest, _Row | None]] = []
        for row in rows:
            gen = self.policy.finish_generation(row.generated, row.logprobs, row.cap, self.sampling.stop)
            gen.meta = {"wall_ms": round((time.perf_counter() - row.started) * 1000.0, 3), "continuous": True}
            for key in [row.key] + row.followers:
                copy = Generation(text=gen.text, token_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                                  finish_reason=gen.finish_reason, meta=dict(gen.meta))
                req = deliver(key, copy)
                if req is not None:
                    nxt.append((key, req, row if key == row.key else None))
        return nxt
