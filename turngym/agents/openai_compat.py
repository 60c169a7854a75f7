"""A Policy backed by any OpenAI-compatible server (vLLM, ``transformers serve``, TGI, hosted APIs).

Three request forms: token ids (``/completions`` with the ids as the prompt; vLLM only: it
accepts ids and, with ``return_tokens_as_token_ids``, reports the sampled ids, which training
needs), plain text (``/completions`` with a text prompt: base models on any server) and
messages (``/chat/completions``). Fields outside the common OpenAI API
(``include_stop_str_in_output``, ``return_tokens_as_token_ids``) are sent only to a server
known to take them: ``server="vllm"``, or ``"auto"`` when ``/models`` says vLLM owns the
model. Servers that follow the OpenAI spec drop the stop string from the text; it is put
back where the text shows which one fired, so actions still parse. Token ids are reported
only where the server returns them. ``generate`` bounds concurrency with a thread pool;
``stream`` (the runner's ``batching="continuous"``) keeps up to ``max_rows`` requests in flight
from one asyncio loop and hands each reply back as it arrives, so hundreds of episodes move
independently instead of waiting for the slowest of a tick. Transient failures (connection
errors, 429, 5xx) are retried by tenacity with exponential backoff and jitter (so many clients
that failed together do not retry together); anything else, or a server that stays down,
raises :class:`PolicyError` naming the URL and the reason.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from turngym.agents.options import PROMPT_FORMATS, SERVERS  # noqa: F401 - declared where the parsers read them
from turngym.agents.policy import (
    Generation,
    GenerationRequest,
    PolicyBase,
    PolicyError,
    SamplingParams,
    restore_stop,
    trim_at_stop,
)
from turngym.envs.base import as_encodable_text
from turngym.envs.parsing import parse_hermes_tool_calls

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_JSON = {"Content-Type": "application/json"}


class _Transient(Exception):
    """A failure worth another attempt (no answer, connection refused, 408/429/5xx); its text says which."""


@dataclass
class OpenAICompatPolicy(PolicyBase):
    """A served model as a :class:`~turngym.agents.policy.Policy`: streams (many requests in flight), no
    in-process weights to score with."""

    supports_stream: ClassVar[bool] = True
    model: str
    base_url: str
    api_key: str | None = None
    concurrency: int = 16
    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 0.5
    tokenizer: Any = None  # set it (a transformers tokenizer) to send token ids and get ids back
    max_context: int | None = None
    server: str = "auto"  # "vllm" | "openai" | "auto" (ask /models who owns the model, once)
    prompt_format: str = "chat"  # without a tokenizer: "chat" (messages) or "text" (a base model's plain prompt)
    max_backoff_s: float = 30.0  # the longest wait between two attempts
    name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.server not in SERVERS:
            raise ValueError(f"server must be one of {SERVERS}, got {self.server!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {self.prompt_format!r}")
        self._kind: str | None = None if self.server == "auto" else self.server
        self._kind_lock = threading.Lock()
        self.base_url = self.base_url.rstrip("/")
        self.name = self.model
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # as many connections as threads (httpx's default pool holds 100: more threads would queue for one)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout_s, headers=headers, limits=limits)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(requests)))) as pool:
            return list(pool.map(lambda r: self._one(r, sampling), requests))

    @property
    def server_kind(self) -> str:
        """"vllm" or "openai" (the common API): as configured, or asked of ``/models`` once."""
        with self._kind_lock:
            if self._kind is None:
                self._kind = self._detect()
            return self._kind

    def _detect(self) -> str:
        """vLLM when ``/models`` says it owns a model; any other answer (another owner, no such
        route) means the common API, which every server takes. A server that cannot be reached
        is an error, as for any request."""
        try:
            resp = self._client.get("/models")
        except httpx.HTTPError:
            resp = None
        if resp is None:  # down or flaky: the retrying path says so with the usual message
            data = self._request("GET", "/models")
        elif resp.status_code == 200:
            try:
                data = resp.json()
            except ValueError:
                return "openai"
        else:
            return "openai"
        models = data.get("data") if isinstance(data, dict) else None
        return "vllm" if any(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in models or []) else "openai"

    def _one(self, req: GenerationRequest, sampling: SamplingParams) -> Generation:
        path, body = self._body(req, sampling)
        return self._parse(path, self._request("POST", path, body), sampling)

    def _body(self, req: GenerationRequest, sampling: SamplingParams) -> tuple[str, dict[str, Any]]:
        """The route and JSON body of one request (``server_kind`` decides the vLLM-only fields)."""
        max_tokens = min(sampling.max_new_tokens, req.max_new_tokens or sampling.max_new_tokens)
        vllm = self.server_kind == "vllm"
        common: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": sampling.temperature,
                                  "top_p": sampling.top_p}
        if sampling.stop:
            common["stop"] = list(sampling.stop)
            if vllm:
                common["include_stop_str_in_output"] = True
        if sampling.seed is not None:
            common["seed"] = sampling.seed
        if req.prompt_ids is not None and not vllm:
            raise PolicyError(f"{self.base_url} is not a vLLM server: it takes no token-id prompts and returns no token "
                              "ids; use the policy without a tokenizer (chat or text prompts), or set server='vllm'")
        if req.prompt_ids is not None or req.prompt_text is not None:
            body = {**common, "prompt": req.prompt_ids if req.prompt_ids is not None else req.prompt_text}
            if vllm:
                body.update(logprobs=1, return_tokens_as_token_ids=True)
            return "/completions", body
        if req.messages is not None:
            body = {**common, "messages": chat_messages(req.messages, bool(req.tools))}
            if req.tools:
                body["tools"] = req.tools
            if req.json_schema:  # OpenAI / vLLM structured output
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "reply", "schema": req.json_schema, "strict": True}}
            return "/chat/completions", body
        raise PolicyError("a GenerationRequest needs prompt_ids, prompt_text or messages")

    def _parse(self, path: str, data: dict[str, Any], sampling: SamplingParams) -> Generation:
        """A completion answer as a :class:`Generation` (the stop string put back where it was dropped)."""
        choice = data["choices"][0]
        if path == "/completions":
            text = choice.get("text", "")
            ids, lps = _ids_and_logprobs(choice.get("logprobs"))
        else:
            message = choice.get("message") or {}
            text = "\n".join(t for t in (message.get("content") or "", hermes_text(message.get("tool_calls") or [])) if t)
            ids, lps = None, None
        # servers that drop the stop string from the text: put it back, so actions parse
        reason = choice.get("finish_reason") or "stop"
        stop_hit = choice.get("stop_reason")
        if isinstance(stop_hit, str) and not text.endswith(stop_hit):
            text += stop_hit
        elif reason == "stop" and sampling.stop and ids is None:
            text = restore_stop(text, sampling.stop)
        text, _ = trim_at_stop(text, sampling.stop)
        return Generation(text=text, token_ids=ids, logprobs=lps, finish_reason="length" if reason == "length" else "stop")

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` of the server and return its JSON answer, with this policy's retries and
        timeout; a failure raises :class:`PolicyError` (e.g. a support scorer asking ``/completions`` for
        prompt log-probabilities)."""
        return self._request("POST", path, body)

    def _retrying(self, cls: type, failed: int) -> Any:
        """tenacity's policy for the attempts after the first ``failed`` ones (which failed): ``retries + 1``
        attempts in all, the waits of :meth:`_backoff_s`; only transient failures are retried."""
        return cls(stop=stop_after_attempt(self.retries + 1 - failed), retry=retry_if_exception_type(_Transient),
                   reraise=False, wait=lambda state: self._backoff_s(state.attempt_number + failed))

    def _backoff_s(self, failed_attempt: int) -> float:
        """Seconds to wait after attempt ``failed_attempt`` failed: tenacity's exponential wait from ``backoff_s``
        capped at ``max_backoff_s``, plus up to ``backoff_s`` of jitter (clients that failed together do not
        retry together)."""
        state = RetryCallState(None, None, (), {})
        state.attempt_number = failed_attempt
        return (wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s) + wait_random(0, self.backoff_s))(state)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        content = json_body(body) if method == "POST" else None

        def attempt() -> dict[str, Any]:
            try:
                resp = self._client.post(path, content=content, headers=_JSON) if content is not None else self._client.get(path)
            except httpx.HTTPError as exc:
                raise _Transient(self._transport_reason(exc)) from exc
            return self._answer(path, resp.status_code, resp.text)

        try:  # the first attempt without tenacity's machinery, which cost more than the request's own client code
            return attempt()
        except _Transient as exc:
            if self.retries == 0:
                raise self._failed(1, exc) from None
        time.sleep(self._backoff_s(1))
        try:
            for retry in self._retrying(Retrying, failed=1):
                with retry:
                    return attempt()
        except RetryError as exc:
            raise self._gave_up(exc, failed=1) from None
        raise AssertionError("unreachable: tenacity returns or raises")

    async def _arequest(self, session: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One POST on an aiohttp session, retried as :meth:`_request`."""
        import aiohttp

        data = json_body(body)

        async def attempt() -> dict[str, Any]:
            try:
                async with session.post(self.base_url + path, data=data, headers=_JSON) as resp:
                    status, text = resp.status, await resp.text()
            except TimeoutError as exc:
                raise _Transient(f"no answer within {self.timeout_s:g} s") from exc
            except aiohttp.ClientError as exc:
                raise _Transient(f"cannot connect ({type(exc).__name__}: {exc})") from exc
            return self._answer(path, status, text)

        try:  # as in _request: tenacity only once the first attempt failed
            return await attempt()
        except _Transient as exc:
            if self.retries == 0:
                raise self._failed(1, exc) from None
        await asyncio.sleep(self._backoff_s(1))
        try:
            async for retry in self._retrying(AsyncRetrying, failed=1):
                with retry:
                    return await attempt()
        except RetryError as exc:
            raise self._gave_up(exc, failed=1) from None
        raise AssertionError("unreachable: tenacity returns or raises")

    def _transport_reason(self, exc: httpx.HTTPError) -> str:
        if isinstance(exc, httpx.TimeoutException):
            return f"no answer within {self.timeout_s:g} s"
        return f"cannot connect ({type(exc).__name__}: {exc})"

    def _answer(self, path: str, status: int, text: str) -> dict[str, Any]:
        """The JSON of a 200; a transient status to retry; any other status a :class:`PolicyError`."""
        if status == 200:
            try:
                return json.loads(text)
            except ValueError:
                raise PolicyError(f"{self.base_url}{path} answered 200 with a body that is not JSON") from None
        if status in _RETRY_STATUS:
            raise _Transient(f"HTTP {status}")
        raise PolicyError(f"{self.base_url}{path} answered HTTP {status}: {text[:300]}")

    def _gave_up(self, exc: RetryError, failed: int) -> PolicyError:
        return self._failed(exc.last_attempt.attempt_number + failed, exc.last_attempt.exception())

    def _failed(self, attempts: int, last: BaseException | None) -> PolicyError:
        return PolicyError(f"server {self.base_url} failed after {attempts} attempts: {last}")

    def stream(self, feed: Any, deliver: Any, sampling: SamplingParams, max_rows: int, prepare: Any = None) -> None:
        """The runner's continuous loop over HTTP: up to ``max_rows`` requests in flight at once.

        ``feed(free)`` gives up to ``free`` new ``(key, request)`` pairs; ``deliver(key, generation)``
        steps that episode and returns its next request or None. Both are called on this thread,
        between awaits of the event loop (the runner's state is never shared between threads; the
        requests in flight keep going on the server meanwhile, as the static runner's replies wait
        while it steps envs); a slot is refilled as soon as its reply is delivered (back-pressure:
        never more than ``max_rows`` requests open). Replies that landed together go to ``prepare`` (where
        given) before any is delivered. A request that fails for good raises its
        :class:`PolicyError` here, after the requests in flight are cancelled."""
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        self.server_kind  # noqa: B018 - asked once, before the loop (a blocking GET)
        asyncio.run(self._stream(feed, deliver, sampling, max_rows, prepare))

    async def _stream(self, feed: Any, deliver: Any, sampling: SamplingParams, max_rows: int, prepare: Any) -> None:
        # aiohttp, not httpx: httpx's async pool spends time quadratic in its open connections, so it
        # served 8x fewer requests/s at 64 in flight (benchmarks/inflight.py)
        import aiohttp

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

        async def one(key: Hashable, req: GenerationRequest) -> tuple[Hashable, Generation]:
            start = time.perf_counter()
            path, body = self._body(req, sampling)
            gen = self._parse(path, await self._arequest(client, path, body), sampling)
            gen.meta = {**gen.meta, "wall_ms": round((time.perf_counter() - start) * 1000.0, 3)}
            return key, gen

        inflight: set[asyncio.Task] = set()
        # each request, once done, lands in this queue: O(1) per reply, where asyncio.wait over the open set
        # re-registers a callback on every open request per wake-up (O(in flight) per reply: at 1024 in
        # flight that loop alone bound the client, benchmarks/ray_pool.py)
        finished: asyncio.Queue[asyncio.Task] = asyncio.Queue()

        def launch(key: Hashable, req: GenerationRequest) -> None:
            task = asyncio.create_task(one(key, req))
            task.add_done_callback(finished.put_nowait)
            inflight.add(task)

        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_rows), headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as client:
                for key, req in feed(max_rows):
                    launch(key, req)
                while inflight:
                    done = [await finished.get()]
                    while not finished.empty():  # every reply that already landed, handled in one pass
                        done.append(finished.get_nowait())
                    inflight.difference_update(done)
                    replies = [task.result() for task in done]
                    if prepare is not None:
                        prepare(replies)
                    for key, gen in replies:
                        nxt = deliver(key, gen)
                        if nxt is not None:
                            launch(key, nxt)
                    free = max_rows - len(inflight)
                    if free > 0:
                        for key, req in feed(free):
                            launch(key, req)
        finally:
            for task in inflight:
                task.cancel()
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)

    def close(self) -> None:
        self._client.close()


def server_options(base_url: str | None, server: str = "auto", prompt_format: str = "chat") -> dict[str, str]:
    """The policy arguments from ``--server``/``--prompt-format``: both apply to ``--base-url``
    only, so a value other than the default without a server URL is a mistake (ValueError)."""
    if server not in SERVERS:
        raise ValueError(f"--server must be one of {', '.join(SERVERS)}, got {server!r}")
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}")
    if not base_url:
        if (server, prompt_format) != ("auto", "chat"):
            raise ValueError("--server and --prompt-format apply to an OpenAI-compatible server only: add --base-url")
        return {}
    return {"server": server, "prompt_format": prompt_format}


def server_settings(options: dict[str, str]) -> dict[str, str]:
    """The server options that differ from the defaults, for a run's stored settings: a run written before
    the options existed (defaults then) resumes under the defaults."""
    return {k: v for k, v in options.items() if v != {"server": "auto", "prompt_format": "chat"}[k]}


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


def json_body(body: dict[str, Any]) -> bytes:
    """A request's JSON as UTF-8 bytes, every string made encodable (:func:`encodable`). Text without
    surrogates (nearly all) is dumped and encoded once, in C: walking every message of a long transcript
    in Python on every request was 4% of a busy client's CPU."""
    try:
        return json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(encodable(body), ensure_ascii=False).encode("utf-8")


def encodable(value: Any) -> Any:
    """``value`` with every string made UTF-8 encodable (lone surrogates, e.g. from a reply the server
    itself sent back, would make the JSON encoder raise before any request is made)."""
    if isinstance(value, str):
        return as_encodable_text(value)
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(v) for v in value]
    return value


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
