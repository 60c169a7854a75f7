"""The OpenAI-compatible backend end to end against a real OpenAI-compatible server:
``transformers serve`` on 127.0.0.1, serving a tiny random model built here from a config
(a local directory, offline: no hub), started by the ``served`` fixture in conftest.py. It speaks
the common API only, so nothing vLLM-only may be sent (it answers HTTP 422 to unknown fields) and
no token ids come back."""

import json

import httpx
import pytest

from turngym.agents.openai_compat import OpenAICompatPolicy
from turngym.agents.policy import GenerationRequest, PolicyError, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv
from turngym.evals.harness import EvalSpec, run_eval


def test_the_server_is_seen_as_common_api_and_both_prompt_forms_work(served):
    url, model = served
    pol = OpenAICompatPolicy(model=model, base_url=url, timeout_s=300)
    sampling = SamplingParams(max_new_tokens=6, temperature=0, stop=("</calc>",))
    chat, text = pol.generate([GenerationRequest(messages=[{"role": "user", "content": "What is 2 + 2?"}]),
                               GenerationRequest(prompt_text="What is 2 + 2? Answer:")], sampling)
    assert pol.server_kind == "openai"
    for g in (chat, text):
        assert isinstance(g.text, str) and g.token_ids is None and g.logprobs is None
        assert g.finish_reason in ("stop", "length")
    with pytest.raises(PolicyError, match="not a vLLM server"):
        pol.generate([GenerationRequest(prompt_ids=[1, 2, 3])], sampling)


def test_vllm_fields_are_what_this_server_refuses(served):
    """Why they must not be sent: the real server answers 422 to them."""
    url, model = served
    r = httpx.post(f"{url}/completions", timeout=300,
                   json={"model": model, "prompt": "hi", "max_tokens": 2, "include_stop_str_in_output": True})
    assert r.status_code == 422 and "include_stop_str_in_output" in r.text


@pytest.mark.parametrize("prompt_format", ["chat", "text"])
def test_episodes_are_played_through_the_server(served, prompt_format):
    url, model = served
    pol = OpenAICompatPolicy(model=model, base_url=url, timeout_s=300, prompt_format=prompt_format)
    runner = RolloutRunner(pol, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=6, temperature=0),
                           k=1, concurrency=2)
    eps = runner.run([0, 1])
    assert len(eps) == 2
    for ep in eps:
        assert ep.done and len(ep.turns) >= 1 and ep.prompt_ids is None
        assert all(t.action_ids is None for t in ep.turns)  # no ids: this server returns none


def test_turngym_eval_with_base_url_writes_episodes(served, tmp_path):
    url, model = served
    res = run_eval(EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, model=model, base_url=url,
                            limit=2, concurrency=2, max_new_tokens=6, temperature=0.0), str(tmp_path))
    assert res["episodes"] == 2
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["env_id"] == "turngym/Calculator-v0" for line in lines)


def test_turngym_eval_cli_passes_server_and_prompt_format(served, tmp_path):
    """``--server openai --prompt-format text`` run end to end; ``--server vllm`` (wrong for this server)
    reaches the requests: the server refuses the vLLM-only field and the command says so."""
    from turngym.cli import main

    url, model = served
    base = ["eval", "--env", "Calculator-v0", "--model", model, "--base-url", url, "--limit", "2", "--max-turns", "2",
            "--max-new-tokens", "6", "--concurrency", "2"]
    assert main(base + ["--server", "openai", "--prompt-format", "text", "--out", str(tmp_path / "text")]) == 0
    assert len((tmp_path / "text" / "episodes.jsonl").read_text().splitlines()) == 2
    settings = json.loads((tmp_path / "text" / "run.json").read_text())
    assert json.dumps(settings).count('"prompt_format": "text"') == 1 and '"server": "openai"' in json.dumps(settings)
    with pytest.raises(SystemExit, match="422"):
        main(base + ["--server", "vllm", "--out", str(tmp_path / "vllm")])
