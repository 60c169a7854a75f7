"""The trainer's scorer and estimator settings: ``scorer: policy`` scores with the live policy,
each process scores only its own groups (once), and the estimators' eps defaults."""

import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig  # noqa: E402

from turngym.agents.tiny import tiny_model_dir  # noqa: E402
from turngym.envs.calculator import CalculatorEnv  # noqa: E402
from turngym.rewards import get_reward  # noqa: E402
from turngym.rewards.base import GroupScores  # noqa: E402
from turngym.training.advantages import get_estimator, zscore  # noqa: E402
from turngym.training.trainer import TurnGRPOTrainer, task_dataset  # noqa: E402


def make_trainer(tmp_path, reward, max_completion_length=16, **kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = str(tiny_model_dir(chat=True))
    torch.manual_seed(0)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=max_completion_length, max_steps=1, logging_steps=1, report_to="none", use_cpu=True,
                      learning_rate=1e-3, save_strategy="no", seed=0, temperature=1.0)
    return TurnGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(d), processing_class=AutoTokenizer.from_pretrained(d),
                           env_factory=lambda: CalculatorEnv(max_turns=3), reward=reward, args=args,
                           train_dataset=task_dataset(range(4)), **kw)


def test_estimator_eps_defaults():
    r = [[0.0, 1.0], [2.0, 0.5]]
    flat = [0.0, 1.0, 2.0, 0.5]
    mean = sum(flat) / 4
    std = (sum((x - mean) ** 2 for x in flat) / 3) ** 0.5
    assert get_estimator("turn")(r)[1][1] == pytest.approx((0.5 - mean) / (std + 1e-6), abs=1e-12)
    assert get_estimator("turn")(r)[1][1] != pytest.approx((0.5 - mean) / (std + 1e-4), abs=1e-9)
    z = zscore([1.0, 0.0, 1.0], 1e-4)
    assert get_estimator("grpo")([[1.0], [0.0], [1.0]]) == [[z[0]], [z[1]], [z[2]]]  # TRL's 1e-4
    sep = get_estimator("igpo_separate")([[0.2, 1.0], [0.6, 0.0]])
    assert sep[0][1] == pytest.approx(zscore([1.0, 0.0], 1e-6)[0], abs=1e-12)


def test_trainer_uses_each_estimators_own_eps_unless_told(tmp_path):
    from turngym.training.config import TrainConfig, build_trainer

    trl = {"output_dir": str(tmp_path / "o"), "per_device_train_batch_size": 4, "num_generations": 4,
           "max_completion_length": 8, "max_steps": 1, "report_to": "none", "use_cpu": True}
    base = dict(env={"id": "turngym/Calculator-v0"}, data={"indices": [0, 4]}, trl=trl,
                model={"name_or_path": str(tiny_model_dir(chat=True))})
    from turngym.episode import Episode, Turn
    from turngym.rewards.base import GroupScores

    class FixedRewardsForTest:
        """A fake reward inside this test: fixed per-turn rewards, so the advantages can be computed by hand."""

        def __init__(self, rewards):
            self.rewards = rewards

        def score_group(self, episodes):
            return GroupScores(rewards=[list(r) for r in self.rewards])

    rewards = [[0.0, 1.0], [2.0, 0.5]]
    group = [Episode(id=f"e{i}", env_id="t", turns=[Turn(index=j, action="a") for j in range(2)]) for i in range(2)]
    tr = build_trainer(TrainConfig(**base, estimator={"name": "turn"}))
    assert tr.advantage_eps is None
    tr.reward = FixedRewardsForTest(rewards)
    _, advs = tr.turn_advantages(group, 2)
    z = zscore([0.0, 1.0, 2.0, 0.5], 1e-6)  # what the trainer feeds the loss uses the estimator's own eps
    assert advs == [pytest.approx([z[0] + z[1], z[1]], abs=1e-12), pytest.approx([z[2] + z[3], z[3]], abs=1e-12)]
    tr = build_trainer(TrainConfig(**base, estimator={"name": "grpo", "eps": 1e-3}))
    assert tr.advantage_eps == 1e-3
    tr.reward = FixedRewardsForTest(rewards)
    z = zscore([1.0, 2.5], 1e-3)
    assert tr.turn_advantages(group, 2)[1] == [pytest.approx([z[0]] * 2), pytest.approx([z[1]] * 2)]


def test_scorer_policy_scores_with_the_live_policy(tmp_path):
    reward = get_reward("igpo", scorer="policy")
    tr = make_trainer(tmp_path, reward, max_completion_length=64, estimator="igpo_separate", stop=(" ",))
    assert reward._scorer.model is tr.model and reward._scorer.tokenizer is tr.processing_class
    tr.train()
    assert tr.state.global_step == 1
    assert reward._scorer.stats["forwards"] > 0  # multi-turn episodes were scored by the policy itself
    assert any("turngym/turn_reward_mean" in h for h in tr.state.log_history)


@pytest.mark.parametrize("n_proc", [2, 3])
def test_each_process_scores_only_its_own_groups_once(tmp_path, monkeypatch, n_proc):
    """Simulated processes: group g is scored on process g mod n; the gathered result is the whole batch."""
    import accelerate.utils

    class CountingReward:
        """A fake reward wrapper that counts which groups it scores."""

        name = "counting"

        def __init__(self):
            self.seen = []

        def score_group(self, episodes):
            self.seen.append(episodes[0])
            return GroupScores([[float(e)] for e in episodes])

    reward = CountingReward()
    tr = make_trainer(tmp_path, get_reward("outcome"), estimator="turn")
    tr.reward = reward
    everyone = list(range(12))  # stand-ins for 12 episodes: 4 groups of 3
    rows_by_proc = []
    placeholder = [(i, [0.0], [0.0]) for i in range(12)]  # what the other processes would send
    for rank in range(n_proc):
        monkeypatch.setattr(type(tr.accelerator), "num_processes", property(lambda self: n_proc))
        monkeypatch.setattr(type(tr.accelerator), "process_index", property(lambda self, r=rank: r))
        captured = []
        monkeypatch.setattr(accelerate.utils, "gather_object",
                            lambda rows, sink=captured: sink.extend(rows) or placeholder)
        tr._score_shared(everyone, 3)
        rows_by_proc.append(captured)
    scored = sorted(reward.seen)
    assert scored == [0, 3, 6, 9]  # every group once, over all processes
    for rank, rows in enumerate(rows_by_proc):
        assert {pos // 3 for pos, _, _ in rows} == set(range(rank, 4, n_proc))
    # with every process's rows gathered, each process gets the whole batch in order
    all_rows = [r for rows in rows_by_proc for r in rows]
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda rows: all_rows)
    rewards, advs = tr._score_shared(everyone, 3)
    assert rewards == [[float(i)] for i in range(12)]
    assert advs[0:3] == get_estimator("turn")([[0.0], [1.0], [2.0]])
