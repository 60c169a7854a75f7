"""SearchQA-v0 with tool_format='native': search offered as a function tool, Hermes tool calls, tool-role results."""

import json
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.corpora.lucene import LuceneRetriever
from turngym.envs.search_qa import NATIVE_INVALID_ACTION, SEARCH_TOOL

PASSAGES = [
    {"id": "p1", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "p2", "title": "Ed Wood", "text": "Edward Davis Wood Jr. was an American filmmaker and actor."},
]


@pytest.fixture(scope="module")
def retriever(lucene_index):
    return LuceneRetriever(lucene_index(PASSAGES))


def call(query, name="search"):
    return "I should look this up.\n<tool_call>\n" + json.dumps({"name": name, "arguments": {"query": query}}) + "\n</tool_call>"


def make(retriever, **kw):
    env = gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, tool_format="native", **kw)
    env.reset(options={"task": {"question": "Where is the capital of France", "answers": ["Paris"]}})
    return env


def test_native_offers_search_as_a_tool_and_runs_hermes_calls(retriever):
    env = make(retriever)
    check_env(env.unwrapped)
    env.reset(options={"task": {"question": "Where is the capital of France", "answers": ["Paris"]}})
    ep = env.unwrapped.episode
    assert ep.tools == [SEARCH_TOOL] and ep.prompt[0]["role"] == "system" and "<answer>" in ep.prompt[0]["content"]
    assert ep.prompt[1]["content"] == "Question: Where is the capital of France?\n"
    assert env.unwrapped.stop == ("</tool_call>", "</answer>")
    obs, _, term, _, info = env.step(call("capital of France"))
    assert not term and obs.startswith("<information>Doc 1(Title: \"Paris\")") and obs.endswith("</information>\n")
    turn = info["turn"]
    assert turn["observation_role"] == "tool" and env.unwrapped.episode.turns[-1].truth["retrieval_hit"].value is True
    assert turn["tool_calls"] == [{"name": "search", "arguments": {"query": "capital of France"}}]
    _, _, term, _, info = env.step("<answer> Paris </answer>")
    assert term and info["outcome"]["em"] == 1.0


def test_native_bad_calls_say_what_was_wrong(retriever):
    env = make(retriever)
    obs, _, term, _, info = env.step("The capital is probably Paris.")  # neither a call nor an answer
    assert not term and obs == NATIVE_INVALID_ACTION and info["turn"]["observation_role"] == "user"
    obs, _, _, _, info = env.step(call("x", name="lookup"))
    assert "unknown tool 'lookup'" in obs and info["turn"]["parse_error"]
    obs, _, _, _, info = env.step("<tool_call>{not json</tool_call>")
    assert "invalid JSON" in obs and info["turn"]["parse_error"]
    env1 = make(retriever)
    obs, _, _, _, info = env1.step('<tool_call>{"name": "search", "arguments": {"query": 3}}</tool_call>')
    assert "one string argument" in obs and info["turn"]["parse_error"]
    env2 = make(retriever)
    env2.step(call("Ed Wood filmmaker"))
    assert env2.unwrapped.episode.turns[-1].truth["retrieval_hit"].value is False


def test_native_needs_a_chat_model_and_a_known_format(retriever):
    with pytest.raises(ValueError, match="chat model"):
        gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, tool_format="native",
                       prompt_style="base")
    with pytest.raises(ValueError, match="tool_format"):
        gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, tool_format="xml")


def test_native_prompt_renders_through_the_qwen_chat_template(retriever):
    from turngym.agents.loading import CHUNKED_MODELS, cache_root

    if not CHUNKED_MODELS["qwen2.5-coder-0.5b-instruct"].installed() or not any(
            Path(cache_root(), "models").glob("qwen2.5-coder-0.5b-instruct-q4_k_m-*/tokenizer.json")):
        pytest.skip("the instruct model is not installed and converted here")
    from transformers import AutoTokenizer

    from turngym.agents.tokenization import ConversationTokenizer

    model_dir = next(Path(cache_root(), "models").glob("qwen2.5-coder-0.5b-instruct-q4_k_m-*"))
    ct = ConversationTokenizer(AutoTokenizer.from_pretrained(model_dir))
    ep = make(retriever).unwrapped.episode
    text = ct.prompt_text(ep.prompt, tools=ep.tools)
    assert '"name": "search"' in text and "<tool_call>" in text and text.endswith("<|im_start|>assistant\n")
    obs = ct.observation_text("<information>x</information>\n", "tool", [])
    assert "<tool_response>" in obs and obs.endswith("<|im_start|>assistant\n")


def test_search_first_prompt_is_a_named_deviation_and_official_is_the_default(retriever):
    from turngym.envs.search_qa import NATIVE_SYSTEM_PROMPT, SEARCH_FIRST_INSTRUCTION, SEARCH_R1_TEMPLATE

    task = {"task": {"question": "Where is the capital of France", "answers": ["Paris"]}}
    official = make(retriever).unwrapped.episode.prompt
    assert official[0]["content"] == NATIVE_SYSTEM_PROMPT and SEARCH_FIRST_INSTRUCTION not in official[0]["content"]
    first = make(retriever, prompt="search_first").unwrapped.episode.prompt
    assert first[0]["content"] == NATIVE_SYSTEM_PROMPT + " " + SEARCH_FIRST_INSTRUCTION and first[1:] == official[1:]
    tags = gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever)
    tags.reset(options=task)
    assert tags.unwrapped.episode.prompt == [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(
        question="Where is the capital of France?")}]
    tags_first = gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, prompt="search_first")
    tags_first.reset(options=task)
    assert tags_first.unwrapped.episode.prompt == [{"role": "system", "content": SEARCH_FIRST_INSTRUCTION},
                                                   *tags.unwrapped.episode.prompt]
    with pytest.raises(ValueError, match="prompt must be one of"):
        gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, prompt="shout")
