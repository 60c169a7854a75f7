"""DESIGN's token invariant: prompt ids + each turn's action ids and observation ids are exactly
what the model was conditioned on, equal what the trainer feeds it, and the loss mask is 1
exactly on action ids."""

import pytest

from conftest import FakeScriptedPolicy
from turngym.agents.policy import PolicyBase, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.agents.tokenization import ConversationTokenizer
from turngym.envs.calculator import CalculatorEnv

# The Gemma turn format (<start_of_turn>role ... <end_of_turn>), written for these tests because the
# bundled Gemma 3 270M is a base model whose tokenizer ships without a chat template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


class ChatCalculator(CalculatorEnv):
    """Calculator whose observations come back as user messages (as BFCL's do)."""

    observation_role = "user"


class Spy(PolicyBase):
    """Records the exact ids every generate call conditioned on."""

    def __init__(self, policy):
        self.policy, self.seen = policy, []
        self.name, self.tokenizer, self.max_context = policy.name, policy.tokenizer, policy.max_context

    def generate(self, requests, sampling):
        self.seen.extend(list(r.prompt_ids) for r in requests)
        return self.policy.generate(requests, sampling)


def _check_prefixes(ep, seen_for_ep):
    ids, mask = token_arrays(ep)
    prefix = list(ep.prompt_ids)
    assert len(seen_for_ep) == len(ep.turns)
    for turn, seen in zip(ep.turns, seen_for_ep, strict=True):
        assert seen == prefix, f"turn {turn.index} was conditioned on different ids"
        prefix = prefix + turn.action_ids + (turn.observation_ids or [])
    assert ids == prefix
    action_positions = []
    pos = len(ep.prompt_ids)
    for t in ep.turns:
        action_positions += range(pos, pos + len(t.action_ids))
        pos += len(t.action_ids) + len(t.observation_ids or [])
    assert [i for i, m in enumerate(mask) if m] == action_positions
    assert len(ids) == len(mask)


@pytest.mark.parametrize("env_cls", [CalculatorEnv, ChatCalculator])
@pytest.mark.parametrize("which", ["tiny_chat_policy", "tiny_plain_policy"])
def test_sampled_rollouts_condition_on_exactly_the_episode_ids(request, which, env_cls):
    spy = Spy(request.getfixturevalue(which))
    runner = RolloutRunner(spy, lambda: env_cls(max_turns=3), SamplingParams(max_new_tokens=12, seed=1),
                           k=1, concurrency=1)
    episodes = runner.run(range(3))
    assert len(episodes) == 3
    start = 0
    for ep in episodes:
        assert all(t.action_ids and len(t.action_logprobs) == len(t.action_ids) for t in ep.turns)
        _check_prefixes(ep, spy.seen[start:start + len(ep.turns)])
        start += len(ep.turns)


def _scripted(tokenizer, template):
    tokenizer = _copy_with_template(tokenizer, template)
    script = ["<calc>12 * 3</calc>", "<calc>36 + 1</calc>", "<answer>37</answer>"]
    policy = FakeScriptedPolicy(tokenizer=tokenizer, script=script)
    runner = RolloutRunner(policy, lambda: ChatCalculator(max_turns=5), SamplingParams(max_new_tokens=8))
    [ep] = runner.run([0])
    return tokenizer, ep, script


def _copy_with_template(tokenizer, template):
    import copy

    tok = copy.deepcopy(tokenizer)
    if template is not None:
        tok.chat_template = template
    return tok


@pytest.mark.parametrize("tok_name,template,close", [
    ("tiny_chat", None, "<|im_end|>\n"),
    ("gemma", GEMMA_TEMPLATE, "<end_of_turn>\n"),
])
def test_chat_episode_ids_equal_the_chat_template_tokenisation(request, tok_name, template, close):
    tok = request.getfixturevalue("tiny_chat_policy").tokenizer if tok_name == "tiny_chat" else \
        request.getfixturevalue("gemma_tokenizer")
    tok, ep, script = _scripted(tok, template)
    messages = list(ep.prompt)
    for t in ep.turns:
        messages.append({"role": "assistant", "content": t.action})
        if t.observation is not None:
            messages.append({"role": "user", "content": t.observation})
    full_text = tok.apply_chat_template(messages, tokenize=False)
    trainer_ids = tok(full_text, add_special_tokens=False)["input_ids"]
    ids, mask = token_arrays(ep)
    assert [t.action for t in ep.turns] == script
    assert trainer_ids == ids + tok(close, add_special_tokens=False)["input_ids"]
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "".join(script)


def test_plain_episode_text_is_prompt_plus_actions_plus_observations(gemma_tokenizer):
    tok = _copy_with_template(gemma_tokenizer, None)
    tok.chat_template = None
    policy = FakeScriptedPolicy(tokenizer=tok, script=["<calc>2 * 21</calc>", "<answer>42</answer>"])
    runner = RolloutRunner(policy, lambda: CalculatorEnv(max_turns=5, prompt_style="base"), SamplingParams())
    [ep] = runner.run([0])
    ids, _ = token_arrays(ep)
    ct = ConversationTokenizer(tok)
    expected = ct.prompt_text(ep.prompt) + "".join(t.action + (t.observation or "") for t in ep.turns)
    assert tok.decode(ids) == expected
    assert ids[0] == tok.bos_token_id
    # Re-tokenising this text may merge tokens across turn boundaries (e.g. "Answer:" + "<calc>"),
    # which is why the trainer takes the episode's ids and never re-tokenises text.


def test_action_closing_is_not_duplicated_when_the_model_generated_it(tiny_chat_policy):
    tok = tiny_chat_policy.tokenizer
    ct = ConversationTokenizer(tok)
    with_close = tok("<calc>1</calc><|im_end|>", add_special_tokens=False)["input_ids"]
    without = tok("<calc>1</calc>", add_special_tokens=False)["input_ids"]
    assert ct.observation_text("o", "user", with_close).startswith("\n<|im_start|>user\no")
    assert ct.observation_text("o", "user", without).startswith("<|im_end|>\n<|im_start|>user\no")
    assert ct.observation_text("o", None, without) == "o"


def token_arrays(episode):
    """The ids fed to the model for ``episode`` and its loss mask (1 on generated actions)."""
    layout = episode.token_layout()
    return layout.ids, layout.trained
