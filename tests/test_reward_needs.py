"""Envs declare what rewards need (RewardNeeds) in each episode; rewards read that, never the env id."""

import json

import pytest

from turngym.episode import DEFAULT_REWARD_NEEDS, Episode, MissingRewardNeeds, RewardNeeds, Turn
from turngym.episode.reader import read_episodes
from turngym.rewards import get_reward
from turngym.rewards.equivalence import CallMatch, MathEquivalence, NormalizedMatch, make_equivalence
from turngym.rewards.evidence import evidence_texts, is_tool_result
from turngym.rewards.support import OFFICIAL_PREFIX, PseudoAnswer

MATH = RewardNeeds(answer_kind="math", answer_cue="boxed", tool_ok_metrics=("exec_ok",))


def ep(i, answer, env_id="lab/Unusual-v0", needs=MATH, question="What is 1/2?"):
    return Episode(id=f"e{i}", env_id=env_id, task={"question": question, "answers": ["1/2"]},
                   turns=[Turn(index=0, action=f"\\boxed{{{answer}}}")], final_answer=answer, outcome={},
                   reward_needs=needs)


def test_a_math_declaration_is_graded_as_math_whatever_the_env_id():
    # "0.5" and "\frac{1}{2}" are one outcome under math-verify, two under normalised text
    group = [ep(0, "0.5"), ep(1, "\\frac{1}{2}"), ep(2, "3")]
    assert isinstance(make_equivalence("auto", group), MathEquivalence)
    # math-verify's first call loads its parsers: done here with room, so the 5 s grading limit below is not hit
    assert MathEquivalence(timeout_s=120).matrix("", ["0.5", "\\frac{1}{2}"]) == [[True, True], [True, True]]
    assert get_reward("ttrl", vote_on="equivalence").score_group(group).diagnostics["clusters"]["labels"] == [0, 0, 1]
    # the same answers under the MathCode id but a text declaration: the declaration decides, not the id
    text = [ep(i, e.final_answer, env_id="turngym/MathCode-v0", needs=DEFAULT_REWARD_NEEDS)
            for i, e in enumerate(group)]
    assert isinstance(make_equivalence("auto", text), NormalizedMatch)
    assert get_reward("ttrl", vote_on="equivalence").score_group(text).diagnostics["clusters"]["labels"] == [0, 1, 2]
    calls = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",))
    assert isinstance(make_equivalence("auto", [ep(0, "[]", needs=calls)]), CallMatch)


def test_the_pseudo_answer_cue_comes_from_the_declaration():
    assert PseudoAnswer.for_episode("auto", ep(0, "1")) == PseudoAnswer.make("boxed")
    assert PseudoAnswer.for_episode("auto", ep(0, "1", needs=DEFAULT_REWARD_NEEDS)).prefix == OFFICIAL_PREFIX
    assert PseudoAnswer.for_episode("official", ep(0, "1")).prefix == OFFICIAL_PREFIX  # explicit config wins


def test_tool_results_follow_the_declared_failure_metrics():
    turn = Turn(index=0, action="run", tool_calls=[{"name": "python"}], observation="Traceback ...",
                metrics={"exec_ok": False, "tool_ok": True})
    assert not is_tool_result(turn, MATH)  # the math env says exec_ok=False marks a failed run
    assert is_tool_result(turn, RewardNeeds("qa_text", "answer_tag", tool_ok_metrics=("tool_ok",)))
    retrieval = RewardNeeds("qa_text", "answer_tag", tool_error_metrics=("retrieval_error",))
    assert not is_tool_result(Turn(index=0, action="s", tool_calls=[{}], observation="x",
                                   metrics={"retrieval_error": "down"}), retrieval)
    with pytest.raises(ValueError, match="answer_kind"):
        RewardNeeds(answer_kind="maths", answer_cue="boxed")
    with pytest.raises(ValueError, match="answer_cue"):
        RewardNeeds(answer_kind="math", answer_cue="box")


def test_declared_needs_round_trip_and_an_old_file_without_them_loads_with_a_clear_message(tmp_path):
    new = ep(0, "0.5")
    assert Episode.from_json(new.to_json()) == new
    old = ep(1, "0.5").to_dict()
    old.pop("reward_needs")  # a file written before episodes carried the declaration
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps({**old, "id": "e2"}) + "\n")
    report = read_episodes(path)
    assert report.errors == [] and [e.reward_needs for e in report.episodes] == [None, None]
    with pytest.raises(MissingRewardNeeds, match=r"e1 \(lab/Unusual-v0\) does not declare.*equivalence='normalized'"):
        get_reward("ttrl", vote_on="equivalence").score_group(report.episodes)
    with pytest.raises(MissingRewardNeeds, match="evidence_source='observations'"):
        evidence_texts(report.episodes[0], source="tool_results")  # the default (every tool response) needs no declaration
    with pytest.raises(MissingRewardNeeds, match="pseudo_answer='official'"):
        PseudoAnswer.for_episode("auto", report.episodes[0])
    # explicit configuration needs no declaration
    assert get_reward("ttrl", equivalence="math").score_group(report.episodes).rewards == [[1.0], [1.0]]
    assert evidence_texts(report.episodes[0], "observations") == []


def test_a_group_with_different_declarations_is_refused():
    with pytest.raises(ValueError, match="different reward needs"):
        make_equivalence("auto", [ep(0, "1"), ep(1, "1", needs=DEFAULT_REWARD_NEEDS)])


def test_the_lm_eval_bridge_takes_its_metrics_from_the_envs_declaration(tmp_path):
    import yaml

    from turngym.integrations.lm_eval_bridge import write_tasks

    write_tasks(tmp_path, ["bamboogle", "gsm8k", "bfcl_irrelevance"], limit=1)
    metrics = {name: [m["metric"] for m in yaml.load((tmp_path / f"turngym_{name}.yaml").read_text(),
                                                     Loader=yaml.BaseLoader)["metric_list"]]
               for name in ("bamboogle", "gsm8k", "bfcl_irrelevance")}
    assert metrics == {"bamboogle": ["em", "f1"], "gsm8k": ["acc"], "bfcl_irrelevance": ["acc"]}
    docs = {name: json.loads((tmp_path / f"turngym_{name}.jsonl").read_text().splitlines()[0])
            for name in ("bamboogle", "bfcl_irrelevance")}
    assert docs["bfcl_irrelevance"]["bfcl"] is True and docs["bamboogle"]["bfcl"] is False
