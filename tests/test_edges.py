"""The edges of a rollout that every adapter shares (turngym.integrations.edges): probing an env, a server's
reply as the env's action, grouping by ``Episode.group_key`` and scoring through the reward's declared
estimator. No adapter does any of these itself (the names it would need are grepped for)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import turngym
from turngym.episode import Episode, Turn
from turngym.integrations.edges import check_indices, probe, reply_action, score_groups
from turngym.rewards import get_reward
from turngym.training.advantages import get_estimator

INTEGRATIONS = Path(turngym.__file__).resolve().parent / "integrations"
SHARED = {"edges.py", "envs.py", "__init__.py"}
BACKENDS = {"ray_pool.py"}  # the runner's env backend (scores model-free rewards on its workers), no adapter
# what grouping, scoring, estimating or restoring a stop string by hand would call
OWN_WORK = {"score_group", "get_estimator", "advantages_per_group", "group_episodes", "EpisodeGroup", "zscore",
            "restore_stop", "trim_at_stop", "group_key"}


def own_work(path: Path) -> list[str]:
    """``file:line name`` of every use of a name in OWN_WORK (called, imported or read as an attribute; not as
    ``self.name``: another stack's method the adapter overrides, verifiers' ``Rubric.score_group``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            names = [node.attr]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
        out += [f"{path.name}:{node.lineno} {n}" for n in names if n in OWN_WORK]
    return out


def test_no_adapter_groups_scores_or_restores_stop_strings_itself():
    adapters = [p for p in sorted(INTEGRATIONS.glob("*.py")) if p.name not in SHARED | BACKENDS]
    assert len(adapters) >= 5
    bad = [hit for p in adapters for hit in own_work(p)]
    assert not bad, "adapters doing the shared edges' work: " + ", ".join(bad)


def test_the_grep_finds_planted_work(tmp_path):
    planted = tmp_path / "adapter.py"
    planted.write_text("from turngym.agents.policy import trim_at_stop\n\ndef f(r, eps):\n"
                       "    s = r.score_group(eps)\n    return [t - sum(s) for t in s], [e.group_key for e in eps],"
                       " self.score_group\n")
    assert own_work(planted) == ["adapter.py:1 trim_at_stop", "adapter.py:4 score_group", "adapter.py:5 group_key"]


def episode(i: int, group: str | None, correct: bool, turns: int = 1) -> Episode:
    ep = Episode(id=f"e{i}", env_id="turngym/Calculator-v0", task={"question": f"q{group}", "answers": ["1"]},
                 group=group, final_answer="1" if correct else "2")
    ep.turns = [Turn(index=t, action="a") for t in range(turns)]
    ep.outcome = {"correct": correct}
    ep.terminated = True
    return ep


def test_groups_are_scored_apart_by_group_key_through_the_declared_estimator():
    eps = [episode(0, "a", True), episode(1, "b", True), episode(2, "a", False), episode(3, "b", True),
           episode(4, None, True)]
    scores = score_groups("outcome", eps)
    assert scores.estimator == get_reward("outcome").estimator == "grpo"
    assert scores.totals == [1.0, 1.0, 0.0, 1.0, 1.0]
    grpo = get_estimator("grpo")
    a = grpo([[1.0], [0.0]])
    assert scores.advantages[0] == a[0] and scores.advantages[2] == a[1]
    assert scores.advantages[1] == scores.advantages[3] == [0.0]  # group b: equal rewards, no advantage
    assert scores.advantages[4] == [0.0]  # no group: a group of one
    assert score_groups("outcome", eps, estimator="rloo").advantages[0] == get_estimator("rloo")([[1.0], [0.0]])[0]


def test_an_estimator_needing_more_than_rewards_is_refused():
    for name, need in (("gigpo", "states"), ("vine", "branches"), ("egpo", "entropy")):
        with pytest.raises(ValueError, match=f"estimator '{name}' needs {need} beyond the rewards"):
            score_groups("outcome", [episode(0, "a", True)], estimator=name)


def test_a_reply_becomes_the_envs_action():
    stop = ("</calc>", "</answer>")
    assert reply_action("<calc>1+1", "stop", stop) == "<calc>1+1</calc>"  # a dropped stop string put back
    assert reply_action("<calc>1+1", None, stop) == "<calc>1+1</calc>"  # the server did not say why it stopped
    assert reply_action("<calc>1+1", "length", stop) == "<calc>1+1"  # cut at the token limit: left open
    assert reply_action("<calc>1</calc> more <answer>2</answer>", "stop", stop) == "<calc>1</calc>"
    assert reply_action("plain", "stop", ()) == "plain"


def test_probing_checks_the_env_and_closes_it():
    with probe("Calculator-v0") as raw:
        assert raw.num_items() == 10_000 and raw.stop == ("</calc>", "</answer>")
    with pytest.raises(ValueError, match="unknown env 'turngym/Nope-v0'"):
        with probe("Nope-v0"):
            pass
    assert check_indices([0, 3], 4, "e") == [0, 3]
    for bad in (4, -1, True, "1"):
        with pytest.raises(ValueError, match=f"index {bad!r} is out of range: e has 4 items"):
            check_indices([0, bad], 4, "e")
