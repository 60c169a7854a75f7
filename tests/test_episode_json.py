"""``Episode.to_json`` writes exactly ``json.dumps(to_dict())`` (with surrogates escaped) without its deep copy."""

from __future__ import annotations

import json

import gymnasium

import turngym  # noqa: F401 - registers the envs
from turngym.episode import Episode, RewardNeeds, Turn, escape_surrogates
from turngym.truth import TruthValue


def reference(ep: Episode) -> str:
    return escape_surrogates(json.dumps(ep.to_dict(), ensure_ascii=False, allow_nan=True))


def test_to_json_is_the_text_of_to_dict_for_played_and_hand_made_episodes():
    env = gymnasium.make("turngym/Calculator-v0", max_turns=3)
    env.reset(seed=1, options={"index": 4, "group": "g"})
    for action in ("<calc>84 * 63</calc>", "no tags \ud800 here", "<answer>5292</answer>"):
        env.step(action)
    played = env.unwrapped.episode
    played.add_run_record(prompt_ids=[1, 2, 3], meta={"model": "m", "k": 0, "wall_ms": 1.5})
    played.add_run_record(0, action_ids=[4, 5], action_logprobs=[-0.1, float("nan")], observation_ids=[6],
                          generate_ms=2.0, finish_reason="stop")
    made = Episode(id="x\udfff", env_id="e", task={"q": [1, {"a": (2, 3)}]}, prompt=[{"role": "user", "content": "hi"}],
                   turns=[Turn(index=0, action="a", metrics={"m": 1e309, "n": None},
                               truth={"useful": TruthValue(True, "env")})],
                   outcome={"correct": 0.5}, tools=[{"type": "function"}], meta={"nested": {"k": [1, 2]}},
                   reward_needs=RewardNeeds("math", "boxed", tool_ok_metrics=("ok",), predates=("checker_metric",)))
    bare = Episode(id="b", env_id="e", reward_needs=None)
    for ep in (played, made, bare):
        assert ep.to_json() == reference(ep)
        assert Episode.from_json(ep.to_json()).to_dict() == Episode.from_json(reference(ep)).to_dict()
