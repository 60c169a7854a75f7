"""The ``turngym`` agent loop run by verl's own ``AgentLoopWorker`` (hydra instantiation of the registered loop,
verl's padding and batching), its ``generate`` answered by a real tiny model: the same episodes as turngym's runner
at temperature 0, and a batch whose ids, mask, turn spans and scores are those episodes'."""

from __future__ import annotations

import pytest
import torch
from verl_harness import generate, rows

RESPONSE = 56  # after a first turn of 10 reply + 41 observation tokens, the second reply gets the 5 left (cut by the budget)
OVERRIDES = ("actor_rollout_ref.rollout.prompt_length=256", f"actor_rollout_ref.rollout.response_length={RESPONSE}",
             "actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
             "+turngym.env_id=Calculator-v0", "+turngym.max_tokens_per_turn=10")
ITEMS = [0, 1, 2, 3]


def record(ep):
    """What the two paths must agree on: the env's text, the ids the model saw, rewards and the outcome."""
    return {"prompt_ids": ep.prompt_ids, "final_answer": ep.final_answer, "outcome": ep.outcome,
            "terminated": ep.terminated, "truncated": ep.truncated,
            "turns": [(t.action, t.observation, t.reward, t.parse_error, t.action_ids, t.observation_ids, t.prefill_ids)
                      for t in ep.turns]}


@pytest.fixture(scope="module")
def played(make_worker):
    worker, _cfg = make_worker(*OVERRIDES)
    return generate(worker, rows(ITEMS, k=2))


def test_the_agent_loop_plays_the_runners_episodes_at_temperature_0(played, tiny_policy):
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner
    from turngym.envs.calculator import CalculatorEnv
    from turngym.episode import Episode

    runner = RolloutRunner(tiny_policy, lambda: CalculatorEnv(max_turns=3), SamplingParams(max_new_tokens=10, temperature=0),
                           k=1, concurrency=1, max_episode_tokens=RESPONSE)
    expected = {ep.task["index"]: record(ep) for ep in runner.run(ITEMS)}
    got = [Episode.from_json(s) for s in played.non_tensor_batch["turngym_episode"]]
    assert [ep.task["index"] for ep in got] == [i for i in ITEMS for _ in range(2)]
    for ep in got:
        assert record(ep) == expected[ep.task["index"]]
    turns = [len(ep.turns) for ep in got]
    assert max(turns) > 1, "the test needs multi-turn episodes"
    assert any(ep.truncated for ep in got), "the test needs an episode ended by a limit"
    assert any(0 < len(t.action_ids) < 10 for ep in got for t in ep.turns), "the test needs a reply cut by the budget"


def test_the_batch_is_the_episodes_ids_with_observations_masked(played):
    from turngym.episode import Episode
    from turngym.integrations.verl.estimators import turn_ranges

    responses, mask = played.batch["responses"], played.batch["response_mask"]
    assert responses.shape[1] == RESPONSE
    for i, line in enumerate(played.non_tensor_batch["turngym_episode"]):
        ep = Episode.from_json(line)
        layout = ep.token_layout()
        ids, trained = layout.ids[layout.prompt_end:][:RESPONSE], layout.trained[layout.prompt_end:][:RESPONSE]
        assert responses[i, :len(ids)].tolist() == ids
        assert mask[i].tolist() == trained + [0] * (RESPONSE - len(trained))
        prompt = played.batch["prompts"][i]
        assert prompt[prompt.shape[0] - len(ep.prompt_ids):].tolist() == ep.prompt_ids  # left-padded, as verl pads
        spans = [tuple(s) for s in played.non_tensor_batch["turn_spans"][i]]
        assert spans == turn_ranges(mask[i]) and len(spans) == len(ep.turns)
        for t, (a, b) in zip(ep.turns, spans, strict=True):
            assert responses[i, a:b].tolist() == t.action_ids
        env_return = sum(t.reward for t in ep.turns)
        assert played.batch["rm_scores"][i].sum().item() == pytest.approx(env_return)
        assert played.non_tensor_batch["turn_scores"][i] == [t.reward for t in ep.turns]
        assert played.non_tensor_batch["turn_metrics"][i] == [t.metrics for t in ep.turns]


def test_a_prompt_longer_than_verl_allows_is_refused_in_one_line(make_worker):
    worker, _cfg = make_worker("actor_rollout_ref.rollout.prompt_length=8", "actor_rollout_ref.rollout.response_length=16",
                               "+turngym.env_id=Calculator-v0")
    with pytest.raises(ValueError, match=r"prompt of episode .* tokens, more than rollout.prompt_length=8") as err:
        generate(worker, rows([0], k=1))
    assert "\n" not in str(err.value)


def test_a_row_chooses_its_env_and_agent_loop(make_worker):
    """``agent_name`` per row selects the loop (verl's per-row field); ``extra_info.env_id`` the env."""
    import numpy as np

    worker, _cfg = make_worker("actor_rollout_ref.rollout.prompt_length=256", "actor_rollout_ref.rollout.response_length=16",
                               "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent")
    batch = rows([0], k=1, env_id="Digits-v0")
    batch.non_tensor_batch["agent_name"] = np.array(["turngym"], dtype=object)
    out = generate(worker, batch)
    from turngym.episode import Episode

    assert Episode.from_json(out.non_tensor_batch["turngym_episode"][0]).env_id == "turngym/Digits-v0"
    assert torch.is_tensor(out.batch["rm_scores"])
