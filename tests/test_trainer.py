"""TurnGRPOTrainer on CPU with a tiny random model: parity with stock TRL, masking, no length bias,
real steps on each env, resume, and learning on a task with a known right behaviour."""

import copy
import math
import os
import re
from dataclasses import dataclass

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from turngym.agents.tiny import tiny_model_dir  # noqa: E402
from turngym.envs.calculator import CalculatorEnv  # noqa: E402
from turngym.rewards import get_reward  # noqa: E402
from turngym.rewards.base import GroupReward, GroupScores  # noqa: E402
from turngym.training.advantages import get_estimator, zscore  # noqa: E402
from turngym.training.trainer import TurnGRPOTrainer, episode_completion, task_dataset, task_prompt  # noqa: E402


class ParityCalculator(CalculatorEnv):
    """Calculator whose outcome varies with the action (so groups have reward variance)."""

    def grade(self, episode):
        return {"correct": float(sum(map(ord, episode.turns[-1].action)) % 2 == 0)}


@dataclass
class FakeTurnReward(GroupReward):
    """A fake reward: a distinct, known reward on every turn."""

    name: str = "fake-turn"
    estimator = "turn"

    def score_group(self, episodes):
        return GroupScores([[0.5 * (i + 1) - t for t in range(len(e.turns))] for i, e in enumerate(episodes)])


def model_and_tokenizer():
    d = str(tiny_model_dir(chat=True))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(d), AutoTokenizer.from_pretrained(d)


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                max_completion_length=24, max_steps=1, logging_steps=1, report_to="none", use_cpu=True,
                learning_rate=1e-3, save_strategy="no", seed=0, temperature=1.0)
    base.update(kw)
    return GRPOConfig(**base)


def inputs_for(indices, k=4):
    return [{"prompt": task_prompt(index=i)} for i in indices for _ in range(k)]


def test_estimators_by_hand():
    r = [[1.0], [0.0], [1.0], [0.0]]
    z = zscore([1, 0, 1, 0], 1e-4)
    assert get_estimator("grpo")(r, eps=1e-4) == [[z[0]], [z[1]], [z[2]], [z[3]]]
    turn = get_estimator("turn")([[0.0, 1.0], [2.0]], gamma=0.5)
    flat = zscore([0.0, 1.0, 2.0])
    assert turn[0] == pytest.approx([flat[0] + 0.5 * flat[1], flat[1]]) and turn[1] == pytest.approx([flat[2]])
    sep = get_estimator("igpo_separate")([[0.2, 1.0], [0.6, 0.0]], gamma=1.0)
    p, o = zscore([0.2, 0.6]), zscore([1.0, 0.0])
    assert sep == [pytest.approx([p[0] + o[0], o[0]]), pytest.approx([p[1] + o[1], o[1]])]
    assert get_estimator("turn")([[3.0]]) == [[0.0]]  # a single reward gets 0
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        get_estimator("nope")


@pytest.mark.parametrize("estimator,eps", [("turn", 1e-4), ("grpo", None)])  # grpo: its own default is TRL's 1e-4
def test_one_turn_outcome_advantages_and_loss_equal_stock_trl(tmp_path, estimator, eps):
    model, tok = model_and_tokenizer()
    ours = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: ParityCalculator(max_turns=1),
                           reward=get_reward("outcome"), args=config(tmp_path), train_dataset=task_dataset(range(4)),
                           estimator=estimator, advantage_eps=eps)
    batch = inputs_for([0])
    torch.manual_seed(1)
    replay = ours._rollout([b["prompt"] for b in batch], ours)  # the same episodes, as TRL's rollout_func output
    replay_episodes = ours._batch_episodes

    def replay_rollout(prompts, trainer):
        ours._batch_episodes = replay_episodes
        return replay

    ours.rollout_func = replay_rollout
    out_ours = ours._generate_and_score_completions(copy.deepcopy(batch))
    outcomes = replay["turngym_outcome"]
    assert len(set(outcomes)) > 1, "the batch needs reward variance for a meaningful comparison"

    stock = GRPOTrainer(model=model, processing_class=tok, args=config(tmp_path),
                        reward_funcs=[lambda prompts, completions, turngym_outcome, **kw: list(turngym_outcome)],
                        train_dataset=task_dataset(range(4)), rollout_func=lambda prompts, trainer: replay)
    out_stock = stock._generate_and_score_completions(copy.deepcopy(batch))
    mask = out_ours["completion_mask"] * out_ours["tool_mask"]
    expanded = out_stock["advantages"].unsqueeze(1).expand_as(out_ours["advantages"])
    assert torch.allclose(out_ours["advantages"][mask.bool()], expanded[mask.bool()], atol=1e-6)
    model.train()
    ours.current_gradient_accumulation_steps = stock.current_gradient_accumulation_steps = 1
    loss_ours = ours.compute_loss(model, out_ours)
    loss_stock = stock.compute_loss(model, out_stock)
    assert torch.allclose(loss_ours, loss_stock, atol=1e-6)


def _captured_logps(trainer, out, model):
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; we call compute_loss directly
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        logps, ent, aux = original(*args, **kwargs)
        logps.retain_grad()
        captured["logps"] = logps
        return logps, ent, aux

    trainer._get_per_token_logps_and_entropies = spy
    model.zero_grad()
    trainer.compute_loss(model, out).backward()
    trainer._get_per_token_logps_and_entropies = original
    return captured["logps"].grad


def test_observation_tokens_get_exactly_zero_gradient_and_turn_values_land_on_their_tokens(tmp_path):
    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=3),
                         reward=FakeTurnReward(), args=config(tmp_path, max_completion_length=160),
                         train_dataset=task_dataset(range(4)), estimator="turn", stop=(" ",))
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(inputs_for([0]))
    eps = tr._batch_episodes
    assert any(len(e.turns) > 1 for e in eps), "need multi-turn episodes"
    _, advs = tr.turn_advantages(eps, 4)
    for row, ep in enumerate(eps):
        _, env_mask, _, turn_of = episode_completion(ep)
        for pos, t in enumerate(turn_of):
            assert out["advantages"][row, pos].item() == pytest.approx(advs[row][t] if t >= 0 else 0.0)
        assert out["tool_mask"][row, : len(env_mask)].tolist() == env_mask
    model.train()
    grad = _captured_logps(tr, out, model)
    obs = (out["tool_mask"] == 0) & (out["completion_mask"] == 1)
    assert obs.any() and torch.all(grad[obs] == 0)
    act = (out["tool_mask"] == 1) & (out["completion_mask"] == 1)
    assert grad[act].abs().sum() > 0


def test_no_length_bias_across_episodes_with_different_numbers_of_turns(tmp_path):
    """With TRL's token-level loss (dapo, our default), every action token with the same advantage gets
    the same gradient whatever its episode's length; the per-sequence 'grpo' loss would not."""
    model, tok = model_and_tokenizer()

    @dataclass
    class SameAdvantage(GroupReward):
        name: str = "same"
        estimator = "grpo"

        def score_group(self, episodes):  # first two episodes good, others bad: equal per-turn signal
            return GroupScores([[1.0 if i < 2 else 0.0] * len(e.turns) for i, e in enumerate(episodes)])

    def grads(loss_type):
        tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=3),
                             reward=SameAdvantage(), args=config(tmp_path, loss_type=loss_type, max_completion_length=160),
                             train_dataset=task_dataset(range(4)), estimator="grpo", stop=(" ",))
        torch.manual_seed(0)
        out = tr._generate_and_score_completions(inputs_for([0]))
        lengths = [int((out["completion_mask"][i] * out["tool_mask"][i]).sum()) for i in range(2)]
        model.train()
        g = _captured_logps(tr, out, model)
        act = (out["tool_mask"] == 1) & (out["completion_mask"] == 1)
        per_row = [g[i][act[i]] for i in range(2)]
        return lengths, per_row

    lengths, rows = grads("dapo")
    assert lengths[0] != lengths[1], "the two good episodes must differ in length for this test"
    assert torch.allclose(rows[0].abs().mean(), rows[1].abs().mean(), rtol=1e-4)
    _, rows = grads("grpo")
    assert not torch.allclose(rows[0].abs().mean(), rows[1].abs().mean(), rtol=1e-2)


def _train(tmp_path, env_factory, steps=1, **kw):
    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=env_factory, reward=get_reward("outcome"),
                         args=config(tmp_path, max_steps=steps, **kw), train_dataset=task_dataset(range(8)),
                         estimator="turn")
    tr.train()
    return tr


def test_real_steps_on_calculator_and_mathcode(tmp_path):
    from turngym.envs.math_code import MathCodeEnv
    from turngym.sandbox import SandboxLimits, SandboxPool

    tr = _train(tmp_path, lambda: CalculatorEnv(max_turns=3), steps=2)
    assert tr.state.global_step == 2 and all(math.isfinite(h.get("loss", 0.0)) for h in tr.state.log_history)
    with SandboxPool(size=1, limits=SandboxLimits(wall_s=2, cpu_s=2), preload=("math",)) as pool:
        tr = _train(tmp_path, lambda: MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=2))
    assert tr.state.global_step == 1


def test_real_steps_on_search_qa(tmp_path):
    from turngym.envs.search_qa import SearchQAEnv

    tr = _train(tmp_path, lambda: SearchQAEnv(dataset="bamboogle", max_turns=2))
    assert tr.state.global_step == 1 and tr._batch_episodes[0].env_id == "turngym/SearchQA-v0"


def test_resuming_from_a_checkpoint_reproduces_the_next_step(tmp_path):
    def run(out, steps, resume=None):
        model, tok = model_and_tokenizer()
        args = config(tmp_path, output_dir=str(out), max_steps=steps, save_strategy="steps", save_steps=1)
        tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: ParityCalculator(max_turns=2),
                             reward=get_reward("outcome"), args=args, train_dataset=task_dataset(range(8)))
        tr.train(resume_from_checkpoint=resume)
        return tr

    full = run(tmp_path / "full", 2)  # writes checkpoint-1 and checkpoint-2: an "interrupted" run stops after 1
    resumed = run(tmp_path / "resumed", 2, resume=str(tmp_path / "full" / "checkpoint-1"))
    assert resumed.state.global_step == 2
    history = lambda tr: [h for h in tr.state.log_history if "loss" in h][-1]  # noqa: E731
    assert history(resumed)["loss"] == pytest.approx(history(full)["loss"], abs=1e-6)
    assert history(resumed)["turngym/turn_reward_mean"] == history(full)["turngym/turn_reward_mean"]
    assert any(not torch.allclose(a, b)
               for a, b in zip(model_and_tokenizer()[0].parameters(), full.model.parameters(), strict=True))
    for p_full, p_res in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.allclose(p_full, p_res, atol=1e-6)


def test_reward_rises_on_a_task_with_known_right_behaviour():
    """Digits-v0 (reply with digits): the README's training curve, shortened."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("train_curve", Path(__file__).parents[1] / "benchmarks" / "train_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    vals = [h["turngym/outcome"] for h in mod.train(steps=45, seed=0)]
    first, last = sum(vals[:10]) / 10, sum(vals[-10:]) / 10
    assert last > first + 0.15, (first, last)


def test_train_command_with_yaml_lora_kl_and_tensorboard(tmp_path):
    import subprocess
    import sys

    import yaml

    cfg = {
        "env": {"id": "turngym/Digits-v0", "kwargs": {"max_turns": 2}},
        "data": {"indices": [0, 16]},
        "reward": {"name": "outcome"},
        "estimator": {"name": "igpo_separate", "gamma": 0.9},
        "model": {"name_or_path": str(tiny_model_dir(chat=True))},
        "peft": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "max_episode_tokens": 32,
        "trl": {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 4, "num_generations": 4,
                "max_completion_length": 16, "max_steps": 2, "logging_steps": 1, "report_to": "tensorboard",
                "use_cpu": True, "beta": 0.04, "loss_type": "dr_grpo", "save_steps": 1, "disable_tqdm": True},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "turngym.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # progress without TRL's bar: the stages, then a line per step with its outcome reward (and an ETA but the last)
    said = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("[") and " s] " in line]
    assert said[0] == f"reading {path}…" and "loading the model from" in said[3], said
    steps = [line for line in said if line.startswith("step ") and ": rollouts" not in line]
    assert [line.split(",")[0] for line in steps] == ["step 1/2", "step 2/2"], said
    # each step's 4 episodes report as they end, before the step's own line
    for n, step_line in enumerate(steps, 1):
        before = said[:said.index(step_line)]
        assert f"step {n}/2: rollouts 0/4 episodes, 0 turns" in before, said
        assert any(line.startswith(f"step {n}/2: rollouts 4/4 episodes, ") for line in before), said
    assert "outcome reward" in steps[0] and ", ETA " in steps[0] and "ETA" not in steps[1]
    run = tmp_path / "run"
    assert (run / "checkpoint-2").is_dir() and (run / "adapter_config.json").exists()
    assert list(run.rglob("events.out.tfevents.*"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"env": {"id": "turngym/Digits-v0"}, "trl": {"no_such_option": 1}}))
    proc = subprocess.run([sys.executable, "-m", "turngym.cli", "train", "--config", str(bad)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "bad trl arguments" in proc.stderr


TWO_PROCESS_SCRIPT = """
import os, torch
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig
from turngym.agents.tiny import tiny_model_dir
from turngym.training.trainer import TurnGRPOTrainer, task_dataset
from turngym.envs.calculator import CalculatorEnv
from turngym.rewards import get_reward
d = str(tiny_model_dir(chat=True))
torch.manual_seed(0)
args = GRPOConfig(output_dir=os.environ["OUT"], per_device_train_batch_size=4, num_generations=2, max_completion_length=200,
                  max_steps=2, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=0)
rank = int(os.environ["RANK"])
tr = TurnGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(d), processing_class=AutoTokenizer.from_pretrained(d),
                     env_factory=lambda: CalculatorEnv(max_turns=2 + rank), reward=get_reward("outcome"), args=args,
                     train_dataset=task_dataset(range(8)), stop=(" ",))
tr.train()
print(f"RESULT rank={rank} processes={tr.accelerator.num_processes} turns={max(len(e.turns) for e in tr._batch_episodes)} "
      f"steps={tr.state.global_step}")
"""


def test_two_processes_with_unequal_turn_counts_do_not_deadlock(tmp_path):
    """Ranks whose episodes end early keep joining generate calls until every rank is done."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "two.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(script)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OUT": str(tmp_path / "out")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the two processes share stdout, so another's print can land on the same line: find the records, not lines
    results = sorted(re.findall(r"RESULT rank=\d+ processes=\d+ turns=\d+ steps=\d+", proc.stdout))
    assert results == ["RESULT rank=0 processes=2 turns=2 steps=2", "RESULT rank=1 processes=2 turns=3 steps=2"]


def test_real_steps_on_bfcl_with_the_funrl_reward(tmp_path):
    from turngym.envs.bfcl.env import BFCLEnv

    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: BFCLEnv(category="simple_python"),
                         reward=get_reward("funrl"), args=config(tmp_path, max_steps=1),
                         train_dataset=task_dataset(range(8)), estimator="turn")
    tr.train()
    assert tr.state.global_step == 1 and all(math.isfinite(h.get("loss", 0.0)) for h in tr.state.log_history)
    ep = tr._batch_episodes[0]
    assert ep.env_id == "turngym/BFCL-v0" and "bfcl_valid" in ep.outcome


def test_trainer_calls_the_reward_observe_hook_every_step(tmp_path):
    """SCRIBE refreshes its library through this hook; a fake reward records the calls."""

    class FakeObservingReward(GroupReward):
        name = "fake-observing"
        estimator = "turn"

        def __init__(self):
            self.steps = []
            self.inner = get_reward("outcome")

        def score_group(self, episodes):
            return self.inner.score_group(episodes)

        def observe(self, step, episodes):
            self.steps.append((step, len(episodes)))

    reward = FakeObservingReward()
    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=2),
                         reward=reward, args=config(tmp_path, max_steps=2), train_dataset=task_dataset(range(8)),
                         estimator="turn")
    tr.train()
    assert [s for s, _ in reward.steps] == [0, 1] and all(n == 4 for _, n in reward.steps)


def test_gigpo_gets_the_envs_anchor_states_and_estimator_options_reach_the_estimator(tmp_path, monkeypatch):
    """GiGPO's step groups come from ``TextEnv.anchor_state`` (turns that saw the same env output share
    one); ``estimator_options`` of the estimator itself are passed through."""
    import turngym.training.trainer as trainer_module

    seen = {}

    def spy(rewards, gamma=1.0, eps=1e-6, states=None, omega=1.0, mode="mean_norm"):
        seen.update(states=states, omega=omega, mode=mode)
        return get_estimator("gigpo")(rewards, gamma=gamma, eps=eps, states=states, omega=omega, mode=mode)

    import dataclasses

    declared = dataclasses.replace(get_estimator("gigpo"), function=spy)  # the declaration, its function spied on
    monkeypatch.setattr(trainer_module, "get_estimator", lambda name: declared if name == "gigpo" else get_estimator(name))
    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=3),
                         reward=FakeTurnReward(), args=config(tmp_path, max_completion_length=160),
                         train_dataset=task_dataset(range(4)), estimator="gigpo", stop=(" ",),
                         estimator_options={"omega": 0.5, "mode": "mean_std_norm"})
    group = []
    for k, calc in enumerate(["6*7", "6*7", "2+2", "6*7"]):
        env = CalculatorEnv(max_turns=3)
        env.reset(seed=k, options={"task": {"question": "What is 6 times 7?", "answers": ["42"]}})
        env.step(f"thinking {k} <calc>{calc}</calc>")
        env.step("<answer>42</answer>")
        env.episode.group = "q"
        group.append(copy.deepcopy(env.episode))
    tr.turn_advantages(group, 4)
    assert seen["omega"] == 0.5 and seen["mode"] == "mean_std_norm"
    first, second = zip(*seen["states"], strict=True)
    assert len(set(first)) == 1  # every rollout starts from the task's prompt
    assert second[0] == second[1] == second[3] != second[2]  # the same calculation shows the same result
    with pytest.raises(ValueError, match="takes no options"):
        TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=3),
                        reward=FakeTurnReward(), args=config(tmp_path), train_dataset=task_dataset(range(4)),
                        estimator="turn", estimator_options={"omega": 1.0})


def test_the_rewards_declared_estimator_is_the_default(tmp_path):
    from turngym.rewards.base import declared_estimator

    assert (declared_estimator("outcome"), declared_estimator("siop"), declared_estimator("igpo"),
            declared_estimator("scribe+funrl")) == ("grpo", "turn_loo", "igpo", "turn_loo")
    model, tok = model_and_tokenizer()
    for reward, want in ((get_reward("outcome"), "grpo"), (get_reward("funrl"), "grpo")):
        tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=2),
                             reward=reward, args=config(tmp_path), train_dataset=task_dataset(range(4)))
        assert tr.estimator_name == want
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=2),
                         reward=get_reward("outcome"), args=config(tmp_path), train_dataset=task_dataset(range(4)),
                         estimator="turn_loo")
    assert tr.estimator_name == "turn_loo"


def test_vine_trains_on_monte_carlo_advantages_from_branches(tmp_path):
    """``vine``: after the rollout every episode is branched after each prefix with the live policy;
    each turn's Â = Q̂ − V̂ is what lands on its tokens (the reward is not used)."""
    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=2),
                         reward=FakeTurnReward(), args=config(tmp_path, max_completion_length=64),
                         train_dataset=task_dataset(range(4)), estimator="vine", estimator_options={"rollouts": 2},
                         stop=(" ",))
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(inputs_for([0]))
    eps = tr._batch_episodes
    assert all(len(e.meta["vine"]) == len(e.turns) for e in eps)
    _, advs = tr.turn_advantages(eps, 4)
    assert advs == [[0.0 if a is None else a for a in e.meta["vine"]] for e in eps]
    for row, ep in enumerate(eps):
        _, _, _, turn_of = episode_completion(ep)
        for pos, t in enumerate(turn_of):
            if t >= 0:
                assert out["advantages"][row, pos].item() == pytest.approx(advs[row][t])
