"""Restoring the state after turn t of a recorded episode, branching from it, and the Monte-Carlo
credit oracle built on branches: replay reproduces every env's recorded observations (MathCode's
interpreter state included), branches reuse the recorded token ids, and MC values equal exact
values where those are known (a deterministic scripted policy; a tabular policy on an exact MDP)."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from turngym.agents.branching import turn_values
from turngym.agents.policy import Generation, PolicyBase, SamplingParams
from turngym.agents.runner import RolloutRunner, RolloutTask
from turngym.credit.mc_oracle import oracle_labels, run_mc_oracle
from turngym.envs.base import restore
from turngym.envs.calculator import CalculatorEnv
from turngym.envs.credit_mdps import VariableHorizonEnv
from turngym.envs.math_code import MathCodeEnv
from turngym.oracles.mdp import softmax_probs, solve


def play(env, actions, seed=0, **options):
    env.reset(seed=seed, options=options)
    for a in actions:
        env.step(a)
    return copy.deepcopy(env.unwrapped.episode)


@pytest.mark.parametrize("after", [0, 1, 2, 3])
def test_calculator_restore_replays_the_recorded_turns(after):
    ep = play(CalculatorEnv(max_turns=4), ["<calc>3*4</calc>", "<calc>12+1</calc>", "<answer>13</answer>"], index=2)
    env = CalculatorEnv(max_turns=4)
    assert restore(env, ep, after) == []
    assert [t.action for t in env.episode.turns] == [t.action for t in ep.turns[:after]]
    assert [t.observation for t in env.episode.turns] == [t.observation for t in ep.turns[:after]]
    assert env.episode.done == (after == 3)


def test_mathcode_restore_rebuilds_the_interpreter_state_and_flags_a_changed_output():
    cells = ["```python\nx = 6 * 7\nprint('set')\n```", "```python\nprint(x + 1)\n```", "\\boxed{43}"]
    env = MathCodeEnv(dataset="gsm8k", max_turns=4)
    try:
        ep = play(env, cells, index=0)
        fresh = MathCodeEnv(dataset="gsm8k", max_turns=4)
        assert restore(fresh, ep, 2) == []  # turn 1's output (43) needs the variable set in turn 0
        assert "43" in fresh.episode.turns[1].observation
        _, _, _, _, info = fresh.step("\\boxed{43}")
        forged = copy.deepcopy(ep)
        forged.turns[1].observation = forged.turns[1].observation.replace("43", "44")
        assert restore(fresh, forged, 2) == [1]  # flagged, not trusted
        fresh.close()
    finally:
        env.close()


def test_restore_refuses_an_env_that_renders_another_prompt():
    ep = play(MathCodeEnv(dataset="gsm8k", max_turns=2, prompt_style="chat"), ["\\boxed{1}"], index=0)
    with pytest.raises(ValueError, match="another prompt"):
        restore(MathCodeEnv(dataset="gsm8k", max_turns=2, prompt_style="base"), ep, 1)


def test_bfcl_restore_calls_fresh_backends():
    from turngym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv(category="multi_turn_base")
    ep = play(env, ["[ls()]", "[cd(folder='document')]", "[ls()]"], index=0)
    fresh = BFCLEnv(category="multi_turn_base")
    assert restore(fresh, ep, 3) == []
    assert fresh.episode.turns[2].observation == ep.turns[2].observation  # the cd took effect on a fresh backend


def test_search_qa_restore(lucene_index):
    from turngym.corpora.lucene import LuceneRetriever
    from turngym.envs.search_qa import SearchQAEnv

    retriever = LuceneRetriever(lucene_index([{"id": "1", "title": "Paris", "text": "Paris is the capital of France."},
                                              {"id": "2", "title": "Rome", "text": "Rome is the capital of Italy."}]))
    env = SearchQAEnv(dataset="nq", retriever=retriever, max_turns=3)
    ep = play(env, ["<search>capital of France</search>", "<answer>Paris</answer>"],
              task={"question": "q?", "answers": ["Paris"]})
    fresh = SearchQAEnv(dataset="nq", retriever=retriever, max_turns=3)
    assert restore(fresh, ep, 1) == [] and "Paris is the capital" in fresh.episode.turns[0].observation


# ------------------------------------------------------------------ branching through the runner

def test_branches_reuse_the_recorded_token_ids(tiny_chat_policy):
    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), SamplingParams(max_new_tokens=8, seed=0), k=1)
    [ep] = runner.run([0])
    assert len(ep.turns) >= 2, "need a multi-turn episode"
    brancher = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), SamplingParams(max_new_tokens=8, seed=1),
                             k=2, run_tag="b")
    out = brancher.run([RolloutTask(branch=ep, after=1, k=2)])
    assert len(out) == 2
    prefix = ep.token_layout().turn_ends[0]
    for b in out:
        assert b.meta["branch"] == {"of": ep.id, "after": 1, "replay_differs": []}
        assert b.token_layout().ids[:prefix] == ep.token_layout().ids[:prefix]  # the same ids, not re-tokenised
        assert b.turns[0].action == ep.turns[0].action and b.turns[0].action_ids == ep.turns[0].action_ids


# ------------------------------------------------------------------ the oracle against exact values

class ScriptedCalculator(PolicyBase):
    """A fake policy (test only): computes 6*7 with the tool, then answers 42; deterministic."""

    name = "scripted"
    tokenizer = None
    max_context = None
    prompt_format = "chat"

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            # Calculator appends a tool result to the assistant's own text
            used_tool = any(m["role"] == "assistant" and "<result>" in m["content"] for m in r.messages)
            out.append(Generation(text="<answer>42</answer>" if used_tool else "<calc>6*7</calc>"))
        return out


def test_mc_values_of_a_deterministic_policy_are_exact(tmp_path):
    """The record answered 41 after the tool; the policy would answer 42. So V = 1 everywhere, Q(turn 1)
    = 0 and Â = (0, −1) exactly, with zero standard error; Q(turn 0) = 1 (the policy finishes right)."""
    task = {"question": "What is 6 times 7?", "answers": ["42"]}
    ep = play(CalculatorEnv(max_turns=3), ["<calc>6*7</calc>", "<answer>41</answer>"], task=task)
    ep.group = "g"
    values = run_mc_oracle([ep], ScriptedCalculator(), lambda: CalculatorEnv(max_turns=3), tmp_path, rollouts=3)
    rows = values[ep.id]
    assert [(r.v, r.q, r.advantage) for r in rows] == [(1.0, 1.0, 0.0), (1.0, 0.0, -1.0)]
    assert all(r.v_se == 0.0 and r.q_se == 0.0 and r.trusted for r in rows)
    assert oracle_labels(values, [ep]) == [[None, 0]]
    again = run_mc_oracle([ep], ScriptedCalculator(), lambda: CalculatorEnv(max_turns=3), tmp_path, rollouts=3)
    assert [r.to_dict() for r in again[ep.id]] == [r.to_dict() for r in rows]  # resumed: nothing played twice
    assert len((tmp_path / "branches.jsonl").read_text().splitlines()) == 3 * 3


class TabularPolicy(PolicyBase):
    """A fake policy (test only): samples the MDP action from a tabular softmax given the state the
    observation names, so its exact values are known by dynamic programming."""

    name = "tabular"
    tokenizer = None
    max_context = None
    prompt_format = "chat"

    def __init__(self, mdp, logits, seed):
        self.mdp, self.probs, self.rng = mdp, softmax_probs(mdp, logits), np.random.default_rng(seed)
        self.index = {n.name: i for i, n in enumerate(mdp.nodes)}

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            name = re.findall(r"State: (.+?)\. Reply", r.messages[-1]["content"])[-1]
            i = self.index[name]
            k = len(self.mdp.nodes[i].actions)
            out.append(Generation(text=self.mdp.nodes[i].actions[int(self.rng.choice(k, p=self.probs[i, :k]))]))
        return out


def test_mc_values_match_exact_values_on_an_mdp(tmp_path):
    env = VariableHorizonEnv()
    mdp = env.mdp
    logits = np.random.default_rng(0).normal(0.0, 0.5, mdp.num_params)
    exact = solve(mdp, logits)
    policy = TabularPolicy(mdp, logits, seed=0)
    runner = RolloutRunner(policy, VariableHorizonEnv, SamplingParams(), k=1, run_tag="rec")
    recorded = [e for e in runner.run([0, 0, 0]) if len(e.turns) >= 2][:1]
    if not recorded:
        recorded = runner.run([RolloutTask(index=0, slot="again")])
    values = run_mc_oracle(recorded, policy, VariableHorizonEnv, tmp_path, rollouts=400, concurrency=64)
    ep = recorded[0]
    for tv in values[ep.id]:
        node = mdp.nodes.index(next(n for n in mdp.nodes if n.name == ep.turns[tv.turn].metrics["oracle_state"]))
        assert abs(tv.v - exact.v[node]) < 4 * tv.v_se + 1e-9, (tv, exact.v[node])
    assert turn_values([ep], [])[ep.id][0].v is None  # no branches: no value, never a made-up one


def test_the_mc_creditbench_command_end_to_end(tmp_path, tiny_chat_policy):
    """``turngym creditbench --oracle mc`` on a tiny model's Calculator episodes: branches, values, a table with
    the reward's declared estimator, an extra one, and the label-free baselines."""
    import json
    import subprocess
    import sys

    from turngym.agents.tiny import tiny_model_dir
    from turngym.episode import EpisodeWriter

    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=6, seed=0), k=2)
    episodes = runner.run([0, 1])
    with EpisodeWriter(tmp_path / "episodes.jsonl") as w:
        for e in episodes:
            w.write(e)
    (tmp_path / "run.json").write_text(json.dumps({"env_kwargs": {"max_turns": 2},
                                                   "sampling": {"temperature": 0.7, "max_new_tokens": 6}}))
    out = subprocess.run([sys.executable, "-m", "turngym.cli", "creditbench", "--oracle", "mc", "--episodes",
                          str(tmp_path / "episodes.jsonl"), "--out", str(tmp_path / "mc"), "--rollouts", "2",
                          "--model", str(tiny_model_dir(chat=True)), "--rewards", "outcome",
                          "--estimators", "turn_loo"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "mc" / "mc_oracle.json").read_text())
    assert summary["sampling"] == {"temperature": 0.7, "max_new_tokens": 6, "seed": 0}  # the recording policy's
    assert [(r["reward"], r["estimator"]) for r in summary["rows"]] == [("outcome", "grpo"), ("outcome", "turn_loo")]
    assert set(summary["baselines"]) == {"position", "remaining", "outcome"}
    assert all("spearman_vs_advantage" in b for b in summary["baselines"].values())  # baselines against Â too
    values = [json.loads(line) for line in (tmp_path / "mc" / "values.jsonl").read_text().splitlines()]
    assert len(values) == sum(len(e.turns) for e in episodes) and all(v["n_v"] == 2 for v in values)
    assert "Monte-Carlo oracle" in (tmp_path / "mc" / "mc_oracle.md").read_text()
    # the cost: every continuation counted (N per prefix, T + 1 prefixes per episode), restore times measured
    cost = summary["cost"]
    assert cost["continuations"] == sum(2 * (len(e.turns) + 1) for e in episodes)
    assert cost["restore_half_s"] > 0 and cost["replay_whole_s"] > 0 and cost["continuations_per_s"] > 0
    assert "## Cost" in (tmp_path / "mc" / "mc_oracle.md").read_text()


def _write_calculator_episodes(path, tiny_chat_policy):
    from turngym.episode import EpisodeWriter

    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=4, seed=0), k=2)
    with EpisodeWriter(path) as w:
        for e in runner.run([0]):
            w.write(e)


def test_the_oracle_reads_a_rollout_files_settings_before_a_folders_run_json(tmp_path):
    import json

    from turngym.credit.mc_oracle import recorded_settings

    episodes = tmp_path / "x.jsonl"
    assert recorded_settings(episodes) == ({}, None)
    (tmp_path / "run.json").write_text(json.dumps({"model": "folder"}))
    assert recorded_settings(episodes) == ({"model": "folder"}, tmp_path / "run.json")
    (tmp_path / "x.jsonl.run.json").write_text(json.dumps({"model": "rollout"}))
    assert recorded_settings(episodes) == ({"model": "rollout"}, tmp_path / "x.jsonl.run.json")
    (tmp_path / "x.jsonl.run.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"x\.jsonl\.run\.json.*not valid JSON"):
        recorded_settings(episodes)


def test_greedy_settings_and_a_resume_with_other_settings_are_refused_before_the_model_loads(tmp_path, tiny_chat_policy):
    """A greedy recording (``turngym eval``'s default temperature 0) gives equal continuations and no standard error:
    refused unless a temperature is given; a resumed oracle folder must keep its settings; the model defaults to the
    recording's."""
    import json

    from turngym.agents.tiny import tiny_model_dir
    from turngym.credit.mc_oracle import run_mc_creditbench
    from turngym.run.lock import RunError

    episodes = tmp_path / "episodes.jsonl"
    _write_calculator_episodes(episodes, tiny_chat_policy)
    model = str(tiny_model_dir(chat=True))
    (tmp_path / "run.json").write_text(json.dumps({"model": model, "env_kwargs": {"max_turns": 2},
                                                   "sampling": {"temperature": 0.0, "max_new_tokens": 4}}))
    with pytest.raises(ValueError, match="greedily"):
        run_mc_creditbench(episodes, tmp_path / "mc", rollouts=2)
    assert not (tmp_path / "mc" / "branches.jsonl").exists()
    summary = run_mc_creditbench(episodes, tmp_path / "mc", rollouts=2, temperature=0.8)
    assert summary["model"] == model and summary["sampling"]["temperature"] == 0.8
    assert summary["settings_from"] == str(tmp_path / "run.json")
    with pytest.raises(RunError, match="other settings"):
        run_mc_creditbench(episodes, tmp_path / "mc", rollouts=2, temperature=1.0)
    again = run_mc_creditbench(episodes, tmp_path / "mc", rollouts=2, temperature=0.8)  # same settings: resumes
    assert again["cost"]["continuations"] == 0
