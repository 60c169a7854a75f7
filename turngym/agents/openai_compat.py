"""A Policy backed by any OpenAI-compatible server (vLLM, TGI, hosted APIs).

Requests with token ids go to ``/completions`` with the ids as the prompt (vLLM accepts
that and, with ``return_tokens_as_token_ids``, reports sampled ids); requests with only
messages go to ``/chat/completions``. A thread pool bounds concurrency; transient
failures (connection errors, 429, 5xx) are retried with backoff; anything else, or a
server that stays down, raises :class:`PolicyError` naming the URL and the reason.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx

from turngym.agents.policy import Generation, GenerationRequest, PolicyError, SamplingParams, trim_at_stop
from turngym.envs.parsing import parse_hermes_tool_calls

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class OpenAICompatPolicy:
    model: str
    base_url: str
    api_key: str | None = None
    concurrency: int = 16
    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 0.5
    tokenizer: Any = None  # set it (a transformers tokenizer) to send token ids and get ids back
    max_context: int | None = None
    name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.base_url = self.base_url.rstrip("/")
        self.name = self.model
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout_s, headers=headers)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(requests)))) as pool:
            return list(pool.map(lambda r: self._one(r, sampling), requests))

    def _one(self, req: GenerationRequest, sampling: SamplingParams) -> Generation:
        max_tokens = min(sampling.max_new_tokens, req.max_new_tokens or sampling.max_new_tokens)
        common: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": sampling.temperature,
                                  "top_p": sampling.top_p}
        if sampling.stop:
            common["stop"] = list(sampling.stop)
            common["include_stop_str_in_output"] = True
        if sampling.seed is not None:
            common["seed"] = sampling.seed
        if req.prompt_ids is not None or req.prompt_text is not None:
            body = {**common, "prompt": req.prompt_ids if req.prompt_ids is not None else req.prompt_text,
                    "logprobs": 1, "return_tokens_as_token_ids": True}
            data = self._post("/completions", body)
            choice = data["choices"][0]
            text = choice.get("text", "")
            ids, lps = _ids_and_logprobs(choice.get("logprobs"))
        elif req.messages is not None:
            body = {**common, "messages": chat_messages(req.messages, bool(req.tools))}
            if req.tools:
                body["tools"] = req.tools
            if req.json_schema:  # OpenAI / vLLM structured output
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "reply", "schema": req.json_schema, "strict": True}}
            data = self._post("/chat/completions", body)
            choice = data["choices"][0]
            message = choice.get("message") or {}
            text = "\n".join(t for t in (message.get("content") or "", hermes_text(message.get("tool_calls") or [])) if t)
            ids, lps = None, None
        else:
            raise PolicyError("a GenerationRequest needs prompt_ids, prompt_text or messages")
        # servers that drop the stop string from the text: put it back, so actions parse
        reason = choice.get("finish_reason") or "stop"
        stop_hit = choice.get("stop_reason")
        if isinstance(stop_hit, str) and not text.endswith(stop_hit):
            text += stop_hit
        text, _ = trim_at_stop(text, sampling.stop)
        return Generation(text=text, token_ids=ids, logprobs=lps, finish_reason="length" if reason == "length" else "stop")

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last = ""
        for attempt in range(self.retries + 1):
            try:
                resp = self._client.post(path, json=body)
            except httpx.TimeoutException:
                last = f"no answer within {self.timeout_s:g} s"
            except httpx.TransportError as exc:
                last = f"cannot connect ({type(exc).__name__}: {exc})"
            else:
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError:
                        raise PolicyError(f"{self.base_url}{path} answered 200 with a body that is not JSON") from None
                if resp.status_code not in _RETRY_STATUS:
                    raise PolicyError(f"{self.base_url}{path} answered HTTP {resp.status_code}: {resp.text[:300]}")
                last = f"HTTP {resp.status_code}"
            if attempt < self.retries:
                time.sleep(self.backoff_s * (2 ** attempt))
        raise PolicyError(f"server {self.base_url} failed after {self.retries + 1} attempts: {last}")

    def close(self) -> None:
        self._client.close()


def _ids_and_logprobs(lp: dict[str, Any] | None) -> tuple[list[int] | None, list[float] | None]:
    """vLLM reports sampled tokens as ``token_id:123`` when asked; anything else: no ids."""
    if not lp or not lp.get("tokens"):
        return None, None
    ids = []
    for tok in lp["tokens"]:
        if not isinstance(tok, str) or not tok.startswith("token_id:"):
            return None, lp.get("token_logprobs")
        ids.append(int(tok.split(":", 1)[1]))
    return ids, [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs", [])]


def hermes_text(tool_calls: list[dict[str, Any]]) -> str:
    """A chat API's structured tool calls as Hermes ``<tool_call>`` text, as local models write them."""
    out = []
    for call in tool_calls:
        fn = call.get("function") or {}
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass  # kept as the raw string: the env reports it as malformed
        out.append("<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}) + "</tool_call>")
    return "\n".join(out)


def chat_messages(messages: list[dict[str, str]], with_tools: bool) -> list[dict[str, Any]]:
    """Our transcript for a chat API: Hermes calls become ``tool_calls``, tool results get their ids."""
    if not with_tools:
        return messages
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for n, m in enumerate(messages):
        if m["role"] == "assistant" and "<tool_call>" in m["content"]:
            parsed = parse_hermes_tool_calls(m["content"])  # a malformed block keeps the calls before it
            calls = [{"id": f"call_{n}_{k}", "type": "function",
                      "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                     for k, c in enumerate(parsed.calls)]
            text = re.sub(r"<tool_call>.*?</tool_call>", "", m["content"], flags=re.DOTALL).strip()
            out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            pending = [c["id"] for c in calls]
        elif m["role"] == "tool" and pending:
            out.append({"role": "tool", "tool_call_id": pending[0], "content": m["content"]})
            pending = []
        else:
            out.append({"role": "user" if m["role"] == "tool" else m["role"], "content": m["content"]})
    return out
