import os
import signal
import subprocess
import sys
import time

import torch

from turngym.agents.policy import GenerationRequest, PolicyBase, SamplingParams
from turngym.agents.runner import RolloutRunner, RolloutTask
from turngym.agents.tiny import tiny_model_dir
from turngym.envs.calculator import CalculatorEnv
from turngym.episode.reader import read_episodes


def test_k_rollouts_share_a_group_and_ids_are_unique(tiny_chat_policy):
    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=2), SamplingParams(max_new_tokens=8),
                           k=3, concurrency=4)
    eps = runner.run([0, 1, RolloutTask(task={"question": "What is 2+2?", "answers": ["4"]})])
    assert len(eps) == 9 and len({e.id for e in eps}) == 9
    groups = {}
    for e in eps:
        groups.setdefault(e.group, []).append(e)
    assert sorted(len(v) for v in groups.values()) == [3, 3, 3]
    for members in groups.values():
        assert len({m.task["question"] for m in members}) == 1
        assert len({m.seed for m in members}) == 3


def test_runners_sharing_an_env_pool_make_each_env_once_and_play_the_same(tiny_chat_policy):
    made = []

    def factory():
        made.append(CalculatorEnv(max_turns=2))
        return made[-1]

    def play(runner):
        return [(e.id, [t.action for t in e.turns], e.outcome) for e in runner.run([0, 1])]

    pool: list = []
    sampling = SamplingParams(max_new_tokens=8, temperature=0.0)  # greedy: the same episodes whatever the batch
    play(RolloutRunner(tiny_chat_policy, factory, sampling, k=2, concurrency=3, env_pool=pool))
    n = len(made)
    assert n > 0 and sorted(map(id, pool)) == sorted(map(id, made))
    again = play(RolloutRunner(tiny_chat_policy, factory, sampling, k=2, concurrency=3, env_pool=pool))
    assert len(made) == n  # the second runner reset the pooled envs instead of making new ones
    fresh = play(RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=2), sampling, k=2, concurrency=3))
    assert sorted(again, key=str) == sorted(fresh, key=str)


def test_batched_generation_pads_and_cuts_each_row(tiny_chat_policy):
    tok = tiny_chat_policy.tokenizer
    short = tok("hi", add_special_tokens=False)["input_ids"]
    long = tok("What is 12 * 34 + 5? " * 4, add_special_tokens=False)["input_ids"]
    gens = tiny_chat_policy.generate([GenerationRequest(prompt_ids=short), GenerationRequest(prompt_ids=long, max_new_tokens=3)],
                                     SamplingParams(max_new_tokens=10, temperature=0))
    alone = tiny_chat_policy.generate([GenerationRequest(prompt_ids=short)], SamplingParams(max_new_tokens=10, temperature=0))
    assert gens[0].token_ids == alone[0].token_ids  # left padding does not change greedy output
    assert len(gens[1].token_ids) <= 3
    assert all(len(g.logprobs) == len(g.token_ids) for g in gens)


def test_recorded_logprobs_match_a_direct_forward(tiny_chat_policy):
    tok, model = tiny_chat_policy.tokenizer, tiny_chat_policy.model
    prompt = tok("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    temp = 0.7
    [g] = tiny_chat_policy.generate([GenerationRequest(prompt_ids=prompt)],
                                    SamplingParams(max_new_tokens=12, temperature=temp, seed=3))
    ids = torch.tensor([prompt + g.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temp
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


def test_stop_strings_cut_the_action(tiny_chat_policy):
    from turngym.agents.hf import HFPolicy

    tok = tiny_chat_policy.tokenizer
    ids = tok("<calc>1</calc> and more text", add_special_tokens=False)["input_ids"]
    cut, reason = HFPolicy._cut_row(tiny_chat_policy, ids, cap=100, stop=("</calc>",))
    assert tok.decode(cut).endswith("</calc>") and reason == "stop"


def test_context_limit_truncates_and_keeps_the_episode(tiny_chat_policy, tmp_path):
    class Small(PolicyBase):
        name, tokenizer, max_context = "small", tiny_chat_policy.tokenizer, 60

        def generate(self, reqs, sampling):
            assert all(len(r.prompt_ids) + r.max_new_tokens <= 60 for r in reqs)
            return tiny_chat_policy.generate(reqs, sampling)

    runner = RolloutRunner(Small(), lambda: CalculatorEnv(max_turns=50), SamplingParams(max_new_tokens=16))
    [ep] = runner.run([0], tmp_path / "e.jsonl")
    ids_len = len(ep.prompt_ids) + sum(len(t.action_ids) + len(t.observation_ids or []) for t in ep.turns)
    assert ep.truncated and ep.meta["truncation"] == "context_length"
    assert ids_len >= 60 and ep.outcome == {"correct": False}
    assert read_episodes(tmp_path / "e.jsonl").episodes[0].id == ep.id


ROLLOUT_SCRIPT = """
import sys, time
from turngym.agents.loading import load_hf_policy
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv
policy = load_hf_policy(sys.argv[2], dtype="float32", device="cpu")
inner = policy.generate
def slow(reqs, sampling):
    time.sleep(0.05)
    return inner(reqs, sampling)
policy.generate = slow
RolloutRunner(policy, lambda: CalculatorEnv(max_turns=3), SamplingParams(max_new_tokens=8), k=2,
              concurrency=3).run(range(20), sys.argv[1])
"""


def test_rollout_killed_midway_and_rerun_yields_each_episode_once(tmp_path, tiny_chat_policy):
    out = tmp_path / "episodes.jsonl"
    model_dir = str(tiny_model_dir(chat=True))
    proc = subprocess.Popen([sys.executable, "-c", ROLLOUT_SCRIPT, str(out), model_dir])
    deadline = time.time() + 120
    while time.time() < deadline:
        if out.exists() and len(out.read_bytes().splitlines()) >= 6:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = read_episodes(out)
    assert 6 <= len(first.episodes) < 40, "the kill should land mid-run"
    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), SamplingParams(max_new_tokens=8), k=2,
                           concurrency=3)
    new = runner.run(range(20), out)
    final = read_episodes(out)
    ids = [e.id for e in final.episodes]
    assert len(ids) == 40 and len(set(ids)) == 40
    assert len(new) == 40 - len(first.episodes)
    assert not os.path.exists(str(out) + ".torn") or final.errors == []


def test_the_env_writes_the_text_and_the_runner_only_ids_logprobs_and_timings(tiny_chat_policy):
    """The seam between env and runner: after a run, every text field equals what a bare env records for the
    same actions, and the runner's additions are ids, log-probs, timings and the run's identity only."""
    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), SamplingParams(max_new_tokens=8, seed=0))
    ep = runner.run([0])[0]
    bare = CalculatorEnv(max_turns=3)
    bare.reset(seed=ep.seed, options={"index": 0, "episode_id": ep.id, "group": ep.group})
    for t in ep.turns:
        bare.step(t.action)
    text = ("action", "tool_calls", "parse_error", "observation", "observation_role", "reward", "prefill", "truth")
    for mine, env_only in zip(ep.turns, bare.episode.turns, strict=True):
        assert {f: getattr(mine, f) for f in text} == {f: getattr(env_only, f) for f in text}
        assert mine.action_ids and mine.action_logprobs and "generate" in mine.latency_ms
        assert {k: v for k, v in mine.metrics.items() if k != "finish_reason"} == env_only.metrics
    assert (ep.prompt, ep.outcome, ep.final_answer) == (bare.episode.prompt, bare.episode.outcome, bare.episode.final_answer)
    assert set(ep.meta) - set(bare.episode.meta) <= {"model", "k", "turngym", "task_key", "tokenizer", "wall_ms"}


def test_a_run_record_cannot_write_text_or_unknown_meta():
    import pytest

    from turngym.episode import Episode, Turn

    ep = Episode(id="e", env_id="turngym/Calculator-v0", turns=[Turn(0, "<answer>1</answer>")])
    with pytest.raises(ValueError, match="runner records no episode meta"):
        ep.add_run_record(meta={"outcome": "mine"})
    with pytest.raises(ValueError, match="need the turn's index"):
        ep.add_run_record(action_ids=[1])
    with pytest.raises(ValueError, match="recorded no prefill"):
        ep.add_run_record(0, prefill_ids=[5])
    ep.add_run_record(0, action_ids=[1, 2], action_logprobs=[-0.1, -0.2], generate_ms=1.23456)
    assert (ep.turns[0].action_ids, ep.turns[0].latency_ms["generate"]) == ([1, 2], 1.235)
