"""Many episodes in flight through the OpenAI-compatible backend (``OpenAICompatPolicy.stream``,
the runner's ``batching="continuous"``), against a fake model behind a real loopback HTTP server
(a real socket and real HTTP; only the model is fake, named as such)."""

import dataclasses
import json
import threading

import pytest

from conftest import FakeJSONServer
from turngym.agents.openai_compat import OpenAICompatPolicy
from turngym.agents.policy import GenerationRequest, PolicyError, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv


def fake_calculator_model(fail_first_try=False, delay=0.0, gather=None):
    """A fake chat model: it computes with ``<calc>`` on its first turn and answers on its second.
    ``fail_first_try``: every distinct request is answered 503 (a busy server) the first time it is
    sent. ``gather``: a barrier every first-turn request waits at, so none is answered until that many
    are open at once."""
    seen, lock = set(), threading.Lock()

    def reply(path, body, n):
        if fail_first_try:
            key = json.dumps(body["messages"], sort_keys=True)
            with lock:
                first = key not in seen
                seen.add(key)
            if first:
                return 503, {"error": "busy"}
        turns = sum(m["role"] == "assistant" for m in body["messages"])
        if gather is not None and turns == 0:
            gather.wait()
        text = "<calc>6*7</calc>" if turns == 0 else "<answer>42</answer>"
        return 200, {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}

    return FakeJSONServer(reply, delay=delay, get_reply=lambda path: (404, {"error": "no /models here"}))


def comparable(ep):
    d = dataclasses.asdict(ep)
    d["meta"].pop("wall_ms", None)
    for t in d["turns"]:
        t.pop("latency_ms", None)
    return d


def play(server, batching, concurrency, n=24, retries=3):
    pol = OpenAICompatPolicy(model="fake", base_url=server.url, server="openai", concurrency=concurrency,
                             retries=retries, backoff_s=0.01)
    runner = RolloutRunner(policy=pol, env_factory=lambda: CalculatorEnv(max_turns=4), concurrency=concurrency,
                           batching=batching, sampling=SamplingParams(max_new_tokens=16))
    try:
        return sorted(runner.run(range(n)), key=lambda e: e.id)
    finally:
        pol.close()


def test_continuous_over_http_keeps_every_slot_busy_and_matches_static():
    gather = threading.Barrier(24, timeout=60)  # broken (and the test failed) unless all 24 are open at once
    server = fake_calculator_model(gather=gather)
    try:
        streamed = play(server, "continuous", concurrency=24)  # past the 16 threads of generate()'s pool
        assert not gather.broken
    finally:
        server.close()
    server = fake_calculator_model()
    try:
        static = play(server, "static", concurrency=4)
    finally:
        server.close()
    assert len(streamed) == 24 and all(len(e.turns) == 2 for e in streamed)
    assert [comparable(e) for e in streamed] == [comparable(e) for e in static]


def test_in_flight_requests_never_exceed_the_bound():
    server = fake_calculator_model(delay=0.02)
    try:
        episodes = play(server, "continuous", concurrency=5, n=20)
        assert len(episodes) == 20 and server.max_active <= 5 and len(server.requests) == 40
    finally:
        server.close()


def test_busy_answers_are_retried_in_the_stream():
    server = fake_calculator_model(fail_first_try=True)
    try:
        episodes = play(server, "continuous", concurrency=8, n=12)
        assert len(episodes) == 12 and all(len(e.turns) == 2 and e.final_answer == "42" for e in episodes)
        assert len(server.requests) == 48  # each of the 24 requests: a 503, then asked again
    finally:
        server.close()


def test_a_server_that_stays_busy_stops_the_stream_with_a_clear_error():
    server = FakeJSONServer(lambda path, body, n: (503, {"error": "busy"}))
    try:
        pol = OpenAICompatPolicy(model="fake", base_url=server.url, server="openai", retries=2, backoff_s=0.01)
        fed = iter([("a", GenerationRequest(messages=[{"role": "user", "content": "hi"}]))])
        with pytest.raises(PolicyError, match=r"failed after 3 attempts: HTTP 503"):
            pol.stream(lambda free: list(fed), lambda key, gen: None, SamplingParams(), 4)
        assert len(server.requests) == 3
    finally:
        server.close()


def test_continuous_against_a_real_server_plays_the_episodes_static_plays(served):
    """``transformers serve`` (a real OpenAI-compatible server, a tiny random model): the stream gives every
    episode, and at temperature 0 the same replies as the static path (the server answers one request at a
    time, so greedy replies do not depend on what else is in flight)."""
    url, model = served
    out = {}
    for batching in ("static", "continuous"):
        pol = OpenAICompatPolicy(model=model, base_url=url, server="openai", concurrency=4)
        runner = RolloutRunner(pol, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=6, temperature=0),
                               concurrency=4, batching=batching)
        try:
            out[batching] = sorted(runner.run(range(6)), key=lambda e: e.id)
        finally:
            pol.close()
    assert len(out["continuous"]) == 6 and all(ep.done for ep in out["continuous"])
    assert [[t.action for t in ep.turns] for ep in out["continuous"]] == [[t.action for t in ep.turns] for ep in out["static"]]
