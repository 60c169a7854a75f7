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
from turngym.rewards.base import GroupReward, GroupScores  # noqa: E402
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

    class FixedRewardsForTest(GroupReward):
        """A fake reward inside this test: fixed per-turn rewards, so the advantages can be computed by hand."""

        name, estimator = "fixed", "turn"

        def __init__(self, rewards):
            self.rewards = rewards

        def score_group(self, episodes):
            return GroupScores(rewards=[list(r) for r in self.rewards])

    rewards = [[0.0, 1.0], [2.0, 0.5]]
    group = [Episode(id=f"e{i}", env_id="t", group="g", turns=[Turn(index=j, action="a") for j in range(2)]) for i in range(2)]
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

    class CountingReward(GroupReward):
        """A fake reward that counts which groups it scores."""

        name = "counting"
        estimator = "turn"

        def __init__(self):
            self.seen = []

        def score_group(self, episodes):
            self.seen.append(int(episodes[0].id))
            return GroupScores([[float(e.id)] for e in episodes])

    reward = CountingReward()
    tr = make_trainer(tmp_path, get_reward("outcome"), estimator="turn")
    tr.reward = reward
    from turngym.episode import Episode

    everyone = [Episode(id=str(i), env_id="t", group=f"g{i // 3}") for i in range(12)]  # 4 groups of 3
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


def test_a_prompts_rollouts_over_two_processes_are_one_group_and_an_incomplete_group_is_refused(tmp_path, monkeypatch):
    """Simulated processes: TRL deals a generation batch of 3 prompts x 4 rollouts out as 6 rows each, so
    prompt 1 is played on both. Both give its rollouts one ``Episode.group`` and distinct numbers; the
    gathered batch, even interleaved, is grouped (and scored) by prompt; a group missing a rollout is refused."""
    from turngym.training.trainer import batch_groups, task_prompt

    class GroupRecorder(GroupReward):
        """A fake reward: rollout k of a group gets reward k on every turn; records the groups it scores."""

        name, estimator = "recorder", "grpo"

        def __init__(self):
            self.groups = []

        def score_group(self, episodes):
            self.groups.append([e.meta["task_key"] for e in episodes])
            return GroupScores([[float(e.meta["k"])] * len(e.turns) for e in episodes])

    tr = make_trainer(tmp_path, get_reward("outcome"), estimator="grpo")
    monkeypatch.setattr(type(tr.accelerator), "num_processes", property(lambda self: 2))
    batch = [task_prompt(index=i) for i in (0, 1, 2) for _ in range(4)]
    played = []
    for rank in (0, 1):
        monkeypatch.setattr(type(tr.accelerator), "process_index", property(lambda self, r=rank: r))
        tr._rollout_calls = 0  # every process is at the same rollout call of the same step
        tr._rollout(batch[6 * rank:6 * rank + 6], tr)
        played.append(list(tr._batch_episodes))
    assert [len(eps) for eps in played] == [6, 6]
    shared = {e.group for e in played[0]} & {e.group for e in played[1]}
    assert len(shared) == 1 and {e.meta["task_key"] for e in played[0] if e.group in shared} == {"1@1"}
    everyone = played[0] + played[1]
    assert len({e.id for e in everyone}) == 12  # the shared group's rollouts are numbered 0..3 across processes
    assert sorted(e.meta["k"] for e in everyone if e.group in shared) == [0, 1, 2, 3]

    mixed = everyone[::2] + everyone[1::2]  # each prompt's rollouts interleaved with the others'
    groups = batch_groups(mixed, 4)
    assert [sorted({e.meta["task_key"] for e in g}) for g in groups] == [["0@0"], ["1@1"], ["2@2"]]
    assert all(len(g) == 4 for g in groups)
    one = next(g for g in groups if g.key in shared)
    assert {id(e) for e in one} & {id(e) for e in played[0]} and {id(e) for e in one} & {id(e) for e in played[1]}

    recorder = GroupRecorder()
    tr.reward = recorder
    monkeypatch.setattr(type(tr.accelerator), "num_processes", property(lambda self: 1))
    monkeypatch.setattr(type(tr.accelerator), "process_index", property(lambda self: 0))
    _, advs = tr.turn_advantages(mixed, 4)
    assert sorted(sorted(set(keys)) for keys in recorder.groups) == [["0@0"], ["1@1"], ["2@2"]]
    assert all(len(keys) == 4 for keys in recorder.groups)
    for g in groups:
        in_order = sorted(g, key=lambda e: e.meta["k"])
        expected = get_estimator("grpo")([[float(e.meta["k"])] * len(e.turns) for e in in_order])
        for e, want in zip(in_order, expected, strict=True):
            assert advs[next(i for i, x in enumerate(mixed) if x is e)] == pytest.approx(want)

    with pytest.raises(ValueError, match="holds 3 rollouts, not num_generations=4"):
        batch_groups(mixed[1:], 4)  # one rollout of prompt 0 missing
    with pytest.raises(ValueError, match="holds 3 rollouts, not num_generations=4"):
        tr.turn_advantages(mixed[1:], 4)


def calculator_episode(actions, group="q0"):
    env = CalculatorEnv(max_turns=3)
    env.reset(seed=0, options={"index": 0, "group": group})
    for action in actions:
        env.step(action)
    return env.episode


def test_a_biased_estimator_meeting_groups_of_varying_length_is_named_once_with_its_exact_oracle_cosine(tmp_path):
    """Issue #37 item 5: the warning reads the estimator's declaration (unbiased, exact_cosine), never its name."""
    import warnings

    varying = [calculator_episode(["<calc>84 * 63 + 51</calc>", "<answer>5343</answer>"]),
               calculator_episode(["<answer>5343</answer>"])]
    equal = [calculator_episode(["<answer>5343</answer>"]), calculator_episode(["<answer>1</answer>"])]
    for estimator, episodes, want in (("turn", varying, 1), ("turn", equal, 0), ("turn_loo", varying, 0),
                                      ("grpo", varying, 0)):
        tr = make_trainer(tmp_path, get_reward("outcome"), estimator=estimator)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):  # three batches: one warning at most
                tr._score_groups(episodes, [episodes], None)
        named = [w for w in seen if "is biased when a group's episodes differ in length" in str(w.message)]
        assert len(named) == want, (estimator, [str(w.message) for w in seen])
        if want:
            text = str(named[0].message)
            assert "'turn'" in text and "0.84" in text and "1 to 2 turns" in text and "turn_loo" in text


def test_an_ungraded_episode_gets_advantage_0_and_is_left_out_of_its_groups_statistics(tmp_path):
    """The grader failed on rollout 3 (no answer caused it): its advantage is 0 and the other three are
    normalised among themselves, as if it had not been played; a refused answer (rollout 1) is wrong."""
    from turngym.episode import Episode, Turn

    def rollout(i, outcome):
        return Episode(id=f"e{i}", env_id="turngym/MathCode-v0", task={"question": "q", "answers": ["1"]}, group="g",
                       turns=[Turn(index=j, action="a") for j in range(2)], outcome=outcome)

    group = [rollout(0, {"correct": True, "graded": True}), rollout(1, {"correct": False, "graded": True}),
             rollout(2, {"correct": False, "graded": True}), rollout(3, {"correct": False, "graded": False})]
    tr = make_trainer(tmp_path, get_reward("outcome"), estimator="grpo")
    rewards, advs = tr.turn_advantages(group, 4)
    z = get_estimator("grpo")([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    assert advs[:3] == [pytest.approx(a) for a in z] and advs[3] == [0.0, 0.0]
    assert rewards[3] == [0.0, 0.0]
    tr.estimator_name, tr.estimator = "rloo", get_estimator("rloo")
    assert tr.turn_advantages(group, 4)[1] == [pytest.approx([1.0, 1.0]), pytest.approx([-0.5, -0.5]),
                                                pytest.approx([-0.5, -0.5]), [0.0, 0.0]]
    everyone_ungraded = [rollout(i, {"correct": False, "graded": False}) for i in range(4)]
    assert tr.turn_advantages(everyone_ungraded, 4)[1] == [[0.0, 0.0]] * 4
