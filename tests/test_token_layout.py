"""One token layout and one group definition, checked once against the episode contract.

The contract (docs/ARCHITECTURE.md, ``turngym.envs.checker``): the model saw the prompt ids, then
each turn's ``action_ids`` and ``observation_ids`` in order; the loss mask is 1 exactly on
action ids; the final turn has no observation. The runner, the trainer and the support scorer
all read that layout from ``Episode.token_layout``.
"""

from __future__ import annotations

import pytest

from turngym.episode import Episode, EpisodeGroup, Turn, group_episodes


def hand_built() -> Episode:
    """Three turns: a tool call answered by a 3-token observation, one answered by 1 token, a final answer."""
    return Episode(
        id="g#0", env_id="turngym/SearchQA-v0", group="g", task={"question": "q?", "answers": ["a"]},
        prompt=[{"role": "user", "content": "q?"}], prompt_ids=[100, 101, 102],
        turns=[Turn(0, "<search>x</search>", observation="<information>d</information>", action_ids=[1, 2],
                    action_logprobs=[-0.1, -0.2], observation_ids=[3, 4, 5]),
               Turn(1, "<search>y</search>", observation="<information>e</information>", action_ids=[6],
                    observation_ids=[7]),
               Turn(2, "<answer>a</answer>", action_ids=[8, 9], action_logprobs=[-0.3, -0.4])],
        final_answer="a", terminated=True)


IDS = [100, 101, 102, 1, 2, 3, 4, 5, 6, 7, 8, 9]
TRAINED = [0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1]
TURN_OF = [-1, -1, -1, 0, 0, 0, 0, 0, 1, 1, 2, 2]


def test_layout_of_a_hand_built_multi_turn_episode():
    lay = hand_built().token_layout()
    assert lay.ids == IDS
    assert lay.trained == TRAINED
    assert lay.turn_of == TURN_OF
    assert lay.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, 0.0, 0.0, 0.0, -0.3, -0.4]  # turn 1 recorded none
    assert lay.prompt_end == 3
    assert lay.action_ends == [5, 9, 12]   # after each action, before its observation
    assert lay.turn_ends == [8, 10, 12]    # after each observation (the final turn has none)
    assert [lay.ids[:e] for e in lay.action_ends][-1] == lay.ids


def test_runner_trainer_and_support_scorer_read_the_same_layout():
    from turngym.rewards.support import scoring_points

    ep = hand_built()
    assert (ep.token_layout().ids, ep.token_layout().trained) == (IDS, TRAINED)
    assert scoring_points(ep, None, "before_observation") == [IDS[:3], IDS[:5], IDS[:9], IDS[:12]]
    assert scoring_points(ep, None, "after_observation") == [IDS[:3], IDS[:8], IDS[:10], IDS[:12]]


def test_trainer_completion_is_the_layout_after_the_prompt():
    from turngym.training.trainer import episode_completion

    ids, mask, lps, turn_of = episode_completion(hand_built())
    assert ids == IDS[3:] and mask == TRAINED[3:]
    assert turn_of == [0, 0, -1, -1, -1, 1, -1, 2, 2]  # advantages go on action tokens only
    assert lps == [-0.1, -0.2, 0.0, 0.0, 0.0, 0.0, 0.0, -0.3, -0.4]


def test_layout_refuses_episodes_it_cannot_lay_out():
    ep = hand_built()
    ep.prompt_ids = None
    with pytest.raises(ValueError, match="has no token ids"):
        ep.token_layout()
    ep = hand_built()
    ep.turns[1].action_ids = None
    with pytest.raises(ValueError, match="turn 1 has no action_ids"):
        ep.token_layout()
    ep = hand_built()
    ep.turns[2].action_logprobs = [-0.3]
    with pytest.raises(ValueError, match="1 logprobs for 2 action ids"):
        ep.token_layout()


def make(i: int, group: str | None, question: str) -> Episode:
    return Episode(id=f"e{i}", env_id="turngym/SearchQA-v0", group=group, task={"question": question})


def test_groups_are_built_from_episode_group_in_first_seen_order():
    eps = [make(0, "a", "qa"), make(1, "b", "qb"), make(2, "a", "qa"), make(3, None, "qc")]
    groups = group_episodes(eps)
    assert [g.key for g in groups] == ["a", "b", "e3"]  # an episode without a group is its own
    assert [[e.id for e in g] for g in groups] == [["e0", "e2"], ["e1"], ["e3"]]
    assert groups[0].question == "qa" and groups[0].task == {"question": "qa"}
    assert groups[0].env_id == "turngym/SearchQA-v0"
    assert len(groups[0]) == 2 and groups[0][1].id == "e2" and [e.id for e in groups[0][:1]] == ["e0"]
    assert EpisodeGroup.of(groups[0]) is groups[0]
    assert EpisodeGroup.of(eps[:1]).key == "a"


def test_a_group_holds_one_query():
    with pytest.raises(ValueError, match="one query; got 2 different questions"):
        group_episodes([make(0, "a", "q1"), make(1, "a", "q2")])
    with pytest.raises(ValueError, match="one query"):
        EpisodeGroup.of([make(0, "a", "q1"), make(1, "b", "q2")])
    with pytest.raises(ValueError, match="at least one episode"):
        EpisodeGroup.of([])
