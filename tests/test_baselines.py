"""Baselines faithful to their papers: FunRL/EGPO (binary reward + entropy-enhanced advantage),
TTRL's vote pool, EMPO's semantic-entropy gate. Hand-computed groups, and real trainer steps with a
tiny random model on CPU."""

import math
import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig  # noqa: E402

from turngym.episode import Episode, Turn  # noqa: E402
from turngym.rewards import GroupReward, get_reward  # noqa: E402
from turngym.training.advantages import EGPO_ALPHA, EGPO_KAPPA, entropy_enhanced, get_estimator  # noqa: E402


def bfcl_ep(i, valid, parse_errors=(), think=True):
    """A BFCL-like episode: one turn per entry of ``parse_errors`` (None = parsed)."""
    errors = list(parse_errors) or [None]
    thought = "<think>call it</think>" if think else ""
    turns = [Turn(index=j, action=f"{thought}[f(x={j})]", parse_error=e, tool_calls=[] if e else [{"name": "f"}])
             for j, e in enumerate(errors)]
    return Episode(id=f"b{i}", env_id="turngym/BFCL-v0", task={"id": "simple_0", "question": "q"}, turns=turns,
                   outcome={"bfcl_valid": valid})


# ------------------------------------------------------------------ FunRL / EGPO


def test_funrl_is_the_binary_format_and_correctness_reward():
    r = get_reward("funrl")
    assert r.score_episode(bfcl_ep(0, True)) == [1.0]
    assert r.score_episode(bfcl_ep(1, False)) == [0.0]                       # well-formed, wrong
    assert r.score_episode(bfcl_ep(2, True, [None, "bad call"])) == [0.0, 0.0]  # correct but a malformed turn
    assert r.score_episode(bfcl_ep(3, True, [None, None])) == [0.0, 1.0]     # on the final turn only
    strict = get_reward("funrl", require_think=True)
    assert strict.score_episode(bfcl_ep(4, True, think=False)) == [0.0]
    assert strict.score_episode(bfcl_ep(5, True)) == [1.0]
    diag = r.score_group([bfcl_ep(0, True), bfcl_ep(2, True, [None, "bad"])]).diagnostics["components"]
    assert diag == [{"format": 1.0, "correct": 1.0}, {"format": 0.0, "correct": 1.0}]


def test_egpo_group_by_hand_with_the_clipping_active():
    group = [bfcl_ep(0, True), bfcl_ep(1, False), bfcl_ep(2, True, [None, "bad"]), bfcl_ep(3, True, [None, None])]
    rewards = get_reward("funrl").score_group(group).rewards
    assert rewards == [[1.0], [0.0], [0.0, 0.0], [0.0, 1.0]]
    # base advantage: GRPO on the episode totals [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    base = get_estimator("egpo")(rewards)
    assert base == [pytest.approx([a]), pytest.approx([-a]), pytest.approx([-a, -a]), pytest.approx([a, a])]
    # tokens of episode 0 (A = +a) and episode 1 (A = -a), entropies 0.5 (alpha*H = 0.2 < |A|/kappa)
    # and 2.0 (alpha*H = 0.8 > |A|/kappa = a/2: clipped); an observation token (A = 0) gets nothing
    adv = torch.tensor([[a, a, 0.0], [-a, -a, 0.0]])
    ent = torch.tensor([[0.5, 2.0, 3.0], [0.5, 2.0, 3.0]], requires_grad=True)
    out = entropy_enhanced(adv, ent)
    assert (EGPO_ALPHA, EGPO_KAPPA) == (0.4, 2.0)
    expected = [[a + 0.2, a + a / 2, 0.0], [-a + 0.2, -a + a / 2, 0.0]]
    assert out.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]
    assert torch.all(torch.sign(out[adv != 0]) == torch.sign(adv[adv != 0]))  # the clip never flips a sign
    assert not out.requires_grad  # entropy is detached
    alt = entropy_enhanced(adv, ent, alpha=0.1, kappa=4.0)
    assert alt[0, 1].item() == pytest.approx(a + 0.2) and alt[1, 1].item() == pytest.approx(-a + 0.2)
    with pytest.raises(ValueError, match="kappa"):
        entropy_enhanced(adv, ent, kappa=0.0)


def _tiny_trainer(tmp_path, env_factory, reward, estimator="turn", **kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    d = str(tiny_model_dir(chat=True))
    torch.manual_seed(0)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=24, max_steps=1, logging_steps=1, report_to="none", use_cpu=True,
                      learning_rate=1e-3, save_strategy="no", seed=0, temperature=1.0)
    return TurnGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(d), processing_class=AutoTokenizer.from_pretrained(d),
                           env_factory=env_factory, reward=reward, args=args, train_dataset=task_dataset(range(8)),
                           estimator=estimator, **kw)


class ParityDigits:
    """Digits-v0 whose outcome varies with the action, so a group has reward variance."""

    @staticmethod
    def make(max_turns=1):
        from turngym.envs.digits import DigitsEnv

        class _Env(DigitsEnv):
            def grade(self, episode):
                return {"correct": float(sum(map(ord, episode.turns[-1].action)) % 2 == 0)}

        return _Env(max_turns=max_turns)


def test_egpo_in_the_trainer_adds_the_clipped_entropy_term_on_action_tokens(tmp_path):
    from turngym.training.trainer import task_prompt

    tr = _tiny_trainer(tmp_path, ParityDigits.make, get_reward("outcome"), estimator="egpo",
                       estimator_options={"alpha": 0.4, "kappa": 2.0})
    batch = [{"prompt": task_prompt(index=i)} for i in (0, 1) for _ in range(4)]
    for seed in range(5):
        torch.manual_seed(seed)
        out = tr._generate_and_score_completions(batch)
        _, base = tr.turn_advantages(tr._batch_episodes, 4)
        if any(abs(v) > 0 for ep in base for v in ep):
            break
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    base_table = torch.zeros_like(out["advantages"])
    for row in range(len(tr._batch_episodes)):
        base_table[row, : int(out["completion_mask"][row].sum())] = base[row][0]
    base_table = base_table * mask
    bonus = out["advantages"] - base_table
    nz = base_table != 0
    assert nz.any(), "need reward variance"
    assert torch.all(bonus[nz] >= -1e-6) and torch.all(bonus[nz] <= base_table[nz].abs() / 2.0 + 1e-6)
    assert torch.all(bonus[~nz] == 0)
    assert bonus[nz].abs().sum() > 0
    assert torch.all(torch.sign(out["advantages"][nz]) == torch.sign(base_table[nz]))
    with pytest.raises(ValueError, match="takes no options"):
        _tiny_trainer(tmp_path, ParityDigits.make, get_reward("outcome"), estimator="turn", estimator_options={"alpha": 1})


def test_egpo_trains_a_step(tmp_path):
    tr = _tiny_trainer(tmp_path, ParityDigits.make, get_reward("outcome"), estimator="egpo")
    tr.train()
    assert tr.state.global_step == 1
    logged = [h for h in tr.state.log_history if "turngym/egpo_entropy_mean" in h]
    assert logged and logged[0]["turngym/egpo_entropy_mean"] > 0


# ------------------------------------------------------------------ TTRL


def qa_ep(i, answer, question="Where is the Eiffel Tower?"):
    turns = [Turn(index=0, action=f"<answer>{answer}</answer>")]
    return Episode(id=f"q{i}", env_id="turngym/SearchQA-v0", task={"question": question, "answers": ["Paris"]},
                   turns=turns, final_answer=answer, outcome={})


def test_ttrl_majority_over_a_vote_pool_larger_than_the_group():
    group = [qa_ep(0, "London"), qa_ep(1, "London"), qa_ep(2, "Paris"), qa_ep(3, None)]
    alone = get_reward("ttrl").score_group(group)
    assert alone.rewards == [[1.0], [1.0], [0.0], [0.0]] and alone.diagnostics["votes"] == 4
    pool = [qa_ep(4 + j, "paris") for j in range(3)] + [qa_ep(7, "Rome")]
    voted = get_reward("ttrl", n_votes=8).score_group(group, vote_pool=pool)
    assert voted.rewards == [[0.0], [0.0], [1.0], [0.0]]   # Paris: 4 of 8 votes beats London's 2
    assert voted.diagnostics["votes"] == 8 and len(voted.rewards) == 4
    with pytest.raises(ValueError, match="n_votes"):
        get_reward("ttrl", n_votes=0)


def test_ttrl_trainer_plays_the_vote_pool_and_trains_the_group(tmp_path):
    from turngym.training.trainer import task_prompt

    seen = {}

    class RecordingTTRL(GroupReward):
        """The real TTRL reward, recording the pool it was given (a spy, not a fake)."""

        name = "ttrl"
        estimator = "grpo"
        inner = get_reward("ttrl", n_votes=6)

        def vote_pool(self):
            return self.inner.vote_pool()

        def score_group(self, episodes, vote_pool=None):
            seen.setdefault("pools", []).append((len(episodes), len(vote_pool or [])))
            return self.inner.score_group(episodes, vote_pool=vote_pool)

    tr = _tiny_trainer(tmp_path, lambda: ParityDigits.make(), RecordingTTRL())
    tr.model.train()
    out = tr._generate_and_score_completions([{"prompt": task_prompt(index=0)} for _ in range(4)])
    assert seen["pools"] == [(4, 2)]
    assert out["advantages"].shape[0] == 4 and len(tr._batch_episodes) == 4
    assert [e.meta["k"] for e in tr._batch_episodes] == [0, 1, 2, 3]   # the first num_generations are trained
    assert sorted(e.meta["k"] for eps in tr._voters.values() for e in eps) == [4, 5]
    tr.model.eval()  # evaluation: no vote pool
    tr._generate_and_score_completions([{"prompt": task_prompt(index=1)} for _ in range(4)])
    assert seen["pools"][-1] == (4, 0)


# ------------------------------------------------------------------ EMPO


def test_empo_semantic_entropy_gate_on_and_off():
    confident = [qa_ep(0, "Paris"), qa_ep(1, "Paris"), qa_ep(2, "Paris"), qa_ep(3, "London")]  # strings: EMPO's clusters
    res = get_reward("empo").score_group(confident)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert res.diagnostics["semantic_entropy"] == pytest.approx(h) and not res.diagnostics["gated"]
    assert res.rewards == [[0.75], [0.75], [0.75], [0.25]]
    scattered = [qa_ep(0, "Paris"), qa_ep(1, "London"), qa_ep(2, "Rome"), qa_ep(3, None)]  # H = log 4: gated
    res = get_reward("empo").score_group(scattered)
    assert res.diagnostics["semantic_entropy"] == pytest.approx(math.log(4)) and res.diagnostics["gated"]
    assert res.rewards == [[0.0]] * 4
    off = get_reward("empo", entropy_threshold=None).score_group(scattered)
    assert not off.diagnostics["gated"] and off.rewards == [[0.25], [0.25], [0.25], [0.0]]
    tight = get_reward("empo", entropy_threshold=0.5).score_group(confident)   # H = 0.562 >= 0.5
    assert tight.diagnostics["gated"] and tight.rewards == [[0.0]] * 4
    with pytest.raises(ValueError, match="entropy_threshold"):
        get_reward("empo", entropy_threshold="high")
