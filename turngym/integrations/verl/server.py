"""verl's ``generate`` (token ids in, token ids out) answered by a turngym policy.

verl's agent loops call ``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` and get a
``TokenOutput``. :class:`PolicyServerClient` answers it with any turngym :class:`~turngym.agents.policy.Policy` that
takes token ids (a local transformers model, an OpenAI-compatible server given a tokenizer), one request at a time
in a worker thread, so verl's own agent loop machinery runs on a CPU with a real model: the tests and
``benchmarks/verl_agent_loop.py`` drive it so. On GPUs verl's vLLM or SGLang servers answer instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from turngym.agents.policy import GenerationRequest, Policy, SamplingParams


class PolicyServerClient(LLMServerClient):
    """An ``LLMServerClient`` whose replies come from ``policy`` (no Ray, no load balancer)."""

    def __init__(self, config: Any, policy: Policy, max_tokens: int | None = None):
        super().__init__(config, load_balancer_handle=None)
        self.policy = policy
        self.default_max_tokens = int(max_tokens or config.actor_rollout_ref.rollout.response_length)
        self.lock: asyncio.Lock | None = None  # made in the loop that first awaits it

    @staticmethod
    def sampling(params: dict[str, Any], default_max_tokens: int) -> SamplingParams:
        """verl's (vLLM-style) sampling dict as turngym's; what turngym's policies cannot honour is refused."""
        top_k = params.get("top_k", -1)
        if top_k not in (None, -1, 0):
            raise ValueError(f"top_k={top_k}: turngym policies sample from the full (top-p) distribution; set top_k=-1")
        if float(params.get("repetition_penalty", 1.0) or 1.0) != 1.0:
            raise ValueError("repetition_penalty other than 1.0 is not supported by turngym policies")
        max_tokens = params.get("max_tokens", params.get("max_new_tokens", default_max_tokens))
        return SamplingParams(max_new_tokens=max(1, int(max_tokens)), temperature=float(params.get("temperature", 1.0)),
                              top_p=float(params.get("top_p", 1.0) or 1.0), stop=tuple(params.get("stop") or ()),
                              seed=params.get("seed"))

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        sampling = self.sampling(sampling_params, self.default_max_tokens)
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:  # one model, one forward at a time
            gen = (await asyncio.to_thread(self.policy.generate, [GenerationRequest(prompt_ids=list(prompt_ids))],
                                           sampling))[0]
        if gen.token_ids is None:
            raise ValueError(f"policy {self.policy.name!r} returned no token ids; verl needs a token-level backend")
        logprobs = list(gen.logprobs) if sampling_params.get("logprobs") and gen.logprobs is not None else None
        return TokenOutput(token_ids=list(gen.token_ids), log_probs=logprobs, stop_reason="completed",
                           extra_fields={"finish_reason": gen.finish_reason})
