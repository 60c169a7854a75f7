"""A forced start of the reply (``TextEnv.reply_prefill``; SearchQA-v0's ``force_first_search``):
prompt tokens the model continues, never trained, seen by the env together with the continuation."""

from __future__ import annotations

import gymnasium
import pytest

import turngym  # noqa: F401
from turngym.agents.openai_compat import OpenAICompatPolicy
from turngym.agents.policy import PolicyError, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.corpora.lucene import LuceneRetriever
from turngym.envs.base import render_episode
from turngym.envs.parsing import parse_hermes_tool_calls
from turngym.envs.search_qa import FIRST_SEARCH_PREFILL
from turngym.episode import Episode, Turn

PASSAGES = [
    {"id": "p1", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "p2", "title": "Ed Wood", "text": "Edward Davis Wood Jr. was an American filmmaker and actor."},
]
TASK = {"question": "Where is the capital of France", "answers": ["Paris"]}


@pytest.fixture(scope="module")
def retriever(lucene_index):
    return LuceneRetriever(lucene_index(PASSAGES))


def factory(retriever, **kw):
    return lambda: gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, max_turns=2, **kw)


def test_prefill_ids_sit_before_the_action_and_are_not_trained():
    ep = Episode(id="e#0", env_id="turngym/SearchQA-v0", prompt_ids=[100, 101],
                 turns=[Turn(0, "<search>x</search>", prefill="<search>", prefill_ids=[7, 8], action_ids=[1, 2],
                             action_logprobs=[-0.5, -0.25], observation="<information>d</information>",
                             observation_ids=[3]),
                        Turn(1, "<answer>a</answer>", action_ids=[4])])
    lay = ep.token_layout()
    assert lay.ids == [100, 101, 7, 8, 1, 2, 3, 4]
    assert lay.trained == [0, 0, 0, 0, 1, 1, 0, 1]
    assert lay.turn_of == [-1, -1, 0, 0, 0, 0, 0, 1]
    assert lay.logprobs == [0.0, 0.0, 0.0, 0.0, -0.5, -0.25, 0.0, 0.0]
    assert lay.action_ends == [6, 8] and lay.turn_ends == [7, 8]
    assert Turn.from_dict(ep.turns[0].to_dict()) == ep.turns[0]  # round-trips through the JSONL record


@pytest.mark.parametrize("fmt", ["tags", "native"])
def test_forced_first_search_executes_and_only_the_continuation_is_trained(retriever, tiny_chat_policy, fmt):
    """FakeScriptedPolicy (tests/conftest.py, a fake named as such) completes the opened call; the search runs."""
    from conftest import FakeScriptedPolicy

    tok = tiny_chat_policy.tokenizer
    rest = "capital France</search>" if fmt == "tags" else 'capital France"}}\n</tool_call>'
    fake = FakeScriptedPolicy(tok, [rest, "<answer> Paris </answer>"])
    runner = RolloutRunner(fake, factory(retriever, tool_format=fmt, force_first_search=True),
                           SamplingParams(max_new_tokens=32, temperature=0.0), concurrency=1)
    ep = runner.run([_adhoc()])[0]
    first, second = ep.turns
    prefill = FIRST_SEARCH_PREFILL[fmt]
    assert first.prefill == prefill and first.action == prefill + rest  # the env saw prefill + continuation
    assert first.metrics["action"] == "search" and first.metrics["n_docs"] >= 1 and first.truth["retrieval_hit"].value
    assert first.tool_calls == [{"name": "search", "arguments": {"query": "capital France"}}]
    assert second.prefill is None and second.prefill_ids is None and ep.outcome["em"] == 1.0  # first turn only
    prefill_ids = list(tok(prefill, add_special_tokens=False)["input_ids"])
    assert first.prefill_ids == prefill_ids
    assert fake.calls[0] == ep.prompt_ids + prefill_ids  # the model continued the prompt and the prefill
    ids, trained = token_arrays(ep)
    assert ids[: len(fake.calls[1])] == fake.calls[1]  # the layout is what the model saw next turn
    p = len(ep.prompt_ids)
    assert trained[p: p + len(prefill_ids)] == [0] * len(prefill_ids)
    assert trained[p + len(prefill_ids): p + len(prefill_ids) + len(first.action_ids)] == [1] * len(first.action_ids)
    assert sum(trained) == len(first.action_ids) + len(second.action_ids)
    assert f"forced prefix {prefill!r}" in render_episode(ep)  # the transcript shows it
    # re-tokenised from text (support scoring with tokens="text"), the prefill is counted once, inside the action
    from turngym.rewards.support import scoring_points

    points = scoring_points(ep, tok, tokens="text")
    assert points[1][len(points[0]):] == list(tok(first.action, add_special_tokens=False)["input_ids"])


def _adhoc():
    from turngym.agents.runner import RolloutTask

    return RolloutTask(task=TASK)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_tiny_model_continues_the_prefill_under_both_batchings(retriever, tiny_chat_policy, batching):
    """The real (tiny random) model: whatever it writes, the first action starts with the prefill and the
    episode's layout is the ids it was conditioned on."""
    runner = RolloutRunner(tiny_chat_policy, factory(retriever, tool_format="native", force_first_search=True),
                           SamplingParams(max_new_tokens=8, temperature=0.0), concurrency=2, batching=batching)
    eps = runner.run([_adhoc()])
    first = eps[0].turns[0]
    assert first.action.startswith(FIRST_SEARCH_PREFILL["native"]) and first.prefill_ids
    assert first.action == first.prefill + tiny_chat_policy.tokenizer.decode(
        [t for t in first.action_ids if t not in tiny_chat_policy.eos_ids], skip_special_tokens=False)
    ids, trained = token_arrays(eps[0])
    assert len(ids) == len(trained) and sum(trained) == sum(len(t.action_ids) for t in eps[0].turns)


def test_default_is_the_official_free_reply(retriever, tiny_chat_policy):
    env = factory(retriever, tool_format="native")()
    env.reset(options={"task": TASK})
    assert env.unwrapped.reply_prefill() == "" and env.unwrapped.prefills is False
    # an unclosed call is an error by default, and under the option only on the forced first turn
    assert parse_hermes_tool_calls('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}').error
    forced = factory(retriever, tool_format="native", force_first_search=True)()
    forced.reset(options={"task": TASK})
    _, _, _, _, info = forced.step(FIRST_SEARCH_PREFILL["native"] + 'capital of France"}}')
    assert info["turn"]["metrics"]["n_docs"] >= 1 and info["turn"]["parse_error"] is None
    _, _, _, _, info = forced.step('<tool_call>\n{"name": "search", "arguments": {"query": "Paris"}}')
    assert "never closed" in info["turn"]["parse_error"]
    with pytest.raises(ValueError, match="force_first_search must be true or false"):
        gymnasium.make("turngym/SearchQA-v0", dataset="bamboogle", retriever=retriever, force_first_search="yes")


def test_a_backend_without_token_ids_refuses_the_prefill(retriever):
    chat = OpenAICompatPolicy(model="m", base_url="http://127.0.0.1:9/v1", server="openai")  # never contacted
    runner = RolloutRunner(chat, factory(retriever, tool_format="native", force_first_search=True),
                           SamplingParams(max_new_tokens=8), concurrency=1)
    with pytest.raises(PolicyError, match="forced prefix .* has no tokenizer"):
        runner.run([_adhoc()])


def test_one_shot_example_is_in_the_arms_format(retriever):
    def prompt(**kw):
        env = factory(retriever, **kw)()
        env.reset(options={"task": TASK})
        return env.unwrapped.episode.prompt

    official = prompt(tool_format="tags")
    tags = prompt(tool_format="tags", prompt="one_shot")
    assert tags[1:] == official and tags[0]["role"] == "system"  # the official template stays as it is
    assert "<search> Timbuktu city country </search>" in tags[0]["content"] and "<tool_call>" not in tags[0]["content"]
    native = prompt(tool_format="native", prompt="one_shot")[0]["content"]
    assert native.startswith(prompt(tool_format="native")[0]["content"])
    example = native[native.index("<tool_call>"):native.index("</tool_call>") + len("</tool_call>")]
    assert parse_hermes_tool_calls(example).calls == [{"name": "search", "arguments": {"query": "Timbuktu city country"}}]
    assert "<answer> Mali </answer>" in native and "<search>" not in native
    with pytest.raises(ValueError, match="prompt must be one of"):
        factory(retriever, prompt="few_shot")()


def test_igpo_format_check_reads_the_forced_first_search_as_executed(retriever, tiny_chat_policy):
    """A real forced-first-search episode (native format) whose forced call ends with the reply, no
    ``</tool_call>``: the env parses it as vLLM's Hermes parser reads an open call and runs the search. IGPO's
    format check (GuoqingWang1/IGPO ``verl/utils/reward_score/info_gain.py`` lines 7-41, −2 at line 80) reads
    the transcript as executed, so the episode gets its F1, not the −2 the raw actions would give."""
    from conftest import FakeScriptedPolicy
    from turngym.rewards import get_reward
    from turngym.rewards.siop import igpo_tags_balanced, igpo_transcript

    tok = tiny_chat_policy.tokenizer
    fake = FakeScriptedPolicy(tok, ['capital France"}}', "<answer> Paris </answer>"])
    runner = RolloutRunner(fake, factory(retriever, tool_format="native", force_first_search=True),
                           SamplingParams(max_new_tokens=32, temperature=0.0), concurrency=1)
    ep = runner.run([_adhoc()])[0]
    first = ep.turns[0]
    assert first.prefill and "</tool_call>" not in first.action and first.metrics["action"] == "search"
    assert not igpo_tags_balanced("".join(t.action + (t.observation or "") for t in ep.turns))  # raw actions
    assert igpo_tags_balanced(igpo_transcript(ep))
    assert get_reward("igpo").outcome(ep, ["Paris"]) == 1.0


def token_arrays(episode):
    """The ids fed to the model for ``episode`` and its loss mask (1 on generated actions)."""
    layout = episode.token_layout()
    return layout.ids, layout.trained


def test_the_env_records_the_prefill_it_chose_when_the_action_starts_with_it(retriever):
    """No runner: a caller that sends prefill + continuation gets the prefill recorded by the env itself;
    an action that ignores it records none."""
    for action, recorded in (("<search>capital France</search>", "<search>"), ("<answer>Paris</answer>", None)):
        env = factory(retriever, tool_format="tags", force_first_search=True)()
        env.reset(options={"task": TASK})
        assert env.unwrapped.reply_prefill() == "<search>"
        env.step(action)
        assert env.unwrapped.episode.turns[0].prefill == recorded
