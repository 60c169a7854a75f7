"""The OpenAI-compatible backend against a fake HTTP server on loopback (a real socket and
real HTTP; only the model behind it is fake)."""

import pytest

from conftest import FakeJSONServer
from turngym.agents.openai_compat import OpenAICompatPolicy
from turngym.agents.policy import GenerationRequest, PolicyError, SamplingParams


def FakeOpenAIServer(fail_first=0, delay=0.0, owner="vllm"):
    """A fake vLLM-shaped model behind a real loopback HTTP server: ``/models`` names its owner,
    503 for the first ``fail_first`` generation requests, then fixed completions."""

    def reply(path, body, n):
        if n <= fail_first:
            return 503, {"error": "busy"}
        if path.endswith("/chat/completions"):
            return 200, {"choices": [{"message": {"content": "<answer>4</answer>"}, "finish_reason": "stop"}]}
        return 200, {"choices": [{"text": "<calc>1+1</calc>", "finish_reason": "stop",
                                  "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -1.0]}}]}

    return FakeJSONServer(reply, delay=delay, get_reply=models_reply(owner))


def models_reply(owner):
    def get_reply(path):
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owner}]}
        return 404, {"error": "not found"}

    return get_reply


def posts(server):
    return server.requests


def test_token_and_chat_requests_round_trip():
    server = FakeOpenAIServer()
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url)
        requests = [GenerationRequest(prompt_ids=[1, 2, 3]), GenerationRequest(messages=[{"role": "user", "content": "hi"}])]
        gens = pol.generate(requests, SamplingParams(max_new_tokens=7, stop=("</calc>",)))
        assert gens[0].token_ids == [5, 6] and gens[0].logprobs == [-0.5, -1.0] and gens[0].text == "<calc>1+1</calc>"
        assert gens[1].token_ids is None and gens[1].text == "<answer>4</answer>"
        paths = sorted(p for p, _ in posts(server))
        assert paths == ["/v1/chat/completions", "/v1/completions"]
        body = dict(posts(server))["/v1/completions"]
        assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 7 and body["stop"] == ["</calc>"]
        assert body["include_stop_str_in_output"] is True and body["return_tokens_as_token_ids"] is True
        assert server.gets == ["/v1/models"]  # asked once who serves
    finally:
        server.close()


def test_transient_errors_are_retried():
    server = FakeOpenAIServer(fail_first=2)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url, retries=3, backoff_s=0.01)
        [g] = pol.generate([GenerationRequest(prompt_ids=[1])], SamplingParams())
        assert g.text and len(posts(server)) == 3
    finally:
        server.close()


def test_the_retry_schedule_and_no_retries():
    """The first attempt runs without tenacity; the waits after it are tenacity's exponential backoff with
    jitter, counted from the first failure, and ``retries=0`` makes one attempt."""
    pol = OpenAICompatPolicy(model="m", base_url="http://127.0.0.1:9/v1", retries=5, backoff_s=1.0, max_backoff_s=8.0)
    for failed, low in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (6, 8.0)]:
        waits = [pol._backoff_s(failed) for _ in range(200)]
        assert all(low <= w <= low + 1.0 for w in waits) and max(waits) - min(waits) > 0.5, (failed, min(waits))
    server = FakeOpenAIServer(fail_first=1)
    try:
        once = OpenAICompatPolicy(model="m", base_url=server.url, retries=0, backoff_s=0.01)
        with pytest.raises(PolicyError, match=r"failed after 1 attempts: HTTP 503"):
            once.generate([GenerationRequest(prompt_ids=[1])], SamplingParams())
        assert len(posts(server)) == 1
    finally:
        server.close()


def test_retries_wait_the_backoff_counted_from_the_first_failure(monkeypatch):
    """Against a server that is down, each retry waits tenacity's exponential backoff for the attempt that
    just failed (1, 2, 4 s from backoff_s=1, plus up to 1 s of jitter), then gives up after retries + 1."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    pol = OpenAICompatPolicy(model="m", base_url=f"http://127.0.0.1:{port}/v1", server="openai", retries=3,
                             backoff_s=1.0, max_backoff_s=8.0, timeout_s=2)
    with pytest.raises(PolicyError, match=r"failed after 4 attempts: cannot connect"):
        pol.generate([GenerationRequest(messages=[{"role": "user", "content": "hi"}])], SamplingParams())
    assert len(waits) == 3 and all(low <= w <= low + 1.0 for w, low in zip(waits, [1.0, 2.0, 4.0], strict=True)), waits
    with pytest.raises(ValueError, match="retries must be >= 0"):
        OpenAICompatPolicy(model="m", base_url="http://127.0.0.1:9/v1", retries=-1)


def test_concurrency_limit_is_respected():
    server = FakeOpenAIServer(delay=0.1)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url, concurrency=2)
        pol.generate([GenerationRequest(prompt_ids=[i]) for i in range(6)], SamplingParams())
        assert server.max_active <= 2 and len(posts(server)) == 6
    finally:
        server.close()


def test_server_down_is_a_clear_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    pol = OpenAICompatPolicy(model="m", base_url=f"http://127.0.0.1:{port}/v1", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(PolicyError, match=r"failed after 2 attempts: cannot connect"):
        pol.generate([GenerationRequest(prompt_ids=[1])], SamplingParams())


def test_native_tool_calls_go_out_as_tools_and_come_back_as_hermes_text():
    def reply(path, body, n):
        call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"a": true}'}}
        return 200, {"choices": [{"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}]}

    server = FakeJSONServer(reply)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url, server="vllm")
        tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
        history = [{"role": "user", "content": "list"},
                   {"role": "assistant", "content": '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'},
                   {"role": "tool", "content": "a.txt"}, {"role": "user", "content": "again"}]
        [gen] = pol.generate([GenerationRequest(messages=history, tools=tools)], SamplingParams(max_new_tokens=8))
        assert gen.text == '<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>'
        body = server.requests[0][1]
        assert body["tools"] == tools
        sent = body["messages"]
        assert sent[1]["tool_calls"][0]["function"] == {"name": "ls", "arguments": "{}"} and sent[1]["content"] is None
        assert sent[2] == {"role": "tool", "tool_call_id": sent[1]["tool_calls"][0]["id"], "content": "a.txt"}
    finally:
        server.close()


@pytest.mark.parametrize("models", ["someone", None])  # another owner; no /models at all (404)
def test_common_api_servers_get_no_vllm_fields_and_stop_strings_come_back(models):
    def reply(path, body, n):
        if path.endswith("/chat/completions"):  # the OpenAI spec: the stop string is not in the text
            return 200, {"choices": [{"message": {"content": "I will look. <search>capital of France"},
                                      "finish_reason": "stop"}]}
        return 200, {"choices": [{"text": " 4", "finish_reason": "length"}]}

    server = FakeJSONServer(reply, get_reply=models_reply(models) if models else None)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url)
        sampling = SamplingParams(max_new_tokens=5, stop=("</search>", "</answer>"))
        chat, text = pol.generate([GenerationRequest(messages=[{"role": "user", "content": "q"}]),
                                   GenerationRequest(prompt_text="2 + 2 =")], sampling)
        assert pol.server_kind == "openai"
        assert chat.text == "I will look. <search>capital of France</search>" and chat.token_ids is None
        assert text.text == " 4" and text.token_ids is None and text.finish_reason == "length"
        for path, body in posts(server):
            assert not {"include_stop_str_in_output", "return_tokens_as_token_ids", "logprobs"} & set(body), path
        with pytest.raises(PolicyError, match="not a vLLM server"):
            pol.generate([GenerationRequest(prompt_ids=[1, 2])], sampling)
    finally:
        server.close()


def test_restore_stop_only_where_the_text_shows_which_fired():
    from turngym.agents.policy import restore_stop

    stops = ("</search>", "</answer>")
    assert restore_stop("<search>a</search> then <answer>b", stops) == "<search>a</search> then <answer>b"  # holds one
    assert restore_stop("x <answer>b", stops) == "x <answer>b</answer>"
    assert restore_stop("<answer>b</answer> <search>c", stops) == "<answer>b</answer> <search>c"  # already holds one
    assert restore_stop("no tags", stops) == "no tags"
    assert restore_stop("<search>q", ("\n\n",)) == "<search>q"  # not a closing tag: nothing to infer


def test_a_lone_surrogate_in_a_reply_does_not_abort_the_next_turn():
    """Turn 1's reply holds a lone surrogate (JSON allows the escape); turn 2 sends it back in the
    history. The request goes out with U+FFFD in its place instead of failing in the JSON encoder."""
    def reply(path, body, n):
        return 200, {"choices": [{"message": {"content": "<calc>1+1</calc> \ud800"}, "finish_reason": "stop"}]}

    server = FakeJSONServer(reply)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url, server="openai")
        history = [{"role": "user", "content": "add"}]
        [first] = pol.generate([GenerationRequest(messages=history)], SamplingParams(max_new_tokens=8))
        assert "\ud800" in first.text
        history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "2"}]
        [second] = pol.generate([GenerationRequest(messages=history)], SamplingParams(max_new_tokens=8))
        assert second.text and len(server.requests) == 2
        assert server.requests[1][1]["messages"][1]["content"] == "<calc>1+1</calc> \ufffd"
    finally:
        server.close()
