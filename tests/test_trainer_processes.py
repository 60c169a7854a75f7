"""The trainer across processes: two processes (torchrun, gloo on CPU) give the same per-turn advantages and the
same loss as one process on the same seed and the same global batch. Generation is replaced by a fake that is
a function of the prompt alone (named as one, test only), so both runs play the same episodes whatever process
plays them; everything else (TRL's sampler dealing the batch out by rank, the rollouts, gathering the episodes,
scoring whole groups, the loss) is the real trainer's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import json, os, sys, torch
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from dataclasses import dataclass
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig
from turngym.agents.tiny import tiny_model_dir
from turngym.envs.calculator import CalculatorEnv
from turngym.rewards.base import GroupReward, GroupScores
from turngym.training.trainer import TurnGRPOTrainer, task_dataset


@dataclass
class FakeRolloutReward(GroupReward):
    """A fake reward (test only): a known, distinct reward per rollout number and turn."""
    name: str = "fake-rollout"
    estimator = "turn"

    def score_group(self, episodes):
        return GroupScores([[0.5 * (e.meta["k"] + 1) - 0.25 * t for t in range(len(e.turns))] for e in episodes])


class FakeGenerationTrainer(TurnGRPOTrainer):
    """The real trainer whose generation is a fake (test only): the reply is a function of the prompt ids."""
    def _generate_single_turn(self, prompts, *args):
        tok = self.processing_class
        out = []
        for ids in prompts:
            n = sum(ids) % 7
            text = f"<calc>{n}*3</calc>" if len(ids) % 3 else f"<answer>{n}</answer>"
            out.append(tok(text, add_special_tokens=False)["input_ids"])
        return out, None

    def _score_shared(self, everyone, group_size, voters=None):
        rewards, advs = super()._score_shared(everyone, group_size, voters)
        self.seen = {e.id.split("|", 1)[1]: a for e, a in zip(everyone, advs)}  # the id within the training run
        return rewards, advs


d = str(tiny_model_dir(chat=True))
torch.manual_seed(0)
procs = int(os.environ.get("WORLD_SIZE", "1"))
args = GRPOConfig(output_dir=os.environ["OUT"], per_device_train_batch_size=8 // procs, num_generations=4,
                  max_completion_length=48, max_steps=1, logging_steps=1, report_to="none", use_cpu=True,
                  save_strategy="no", seed=0, loss_type="dr_grpo", learning_rate=1e-3)
tr = FakeGenerationTrainer(model=AutoModelForCausalLM.from_pretrained(d), processing_class=AutoTokenizer.from_pretrained(d),
                           env_factory=lambda: CalculatorEnv(max_turns=3), reward=FakeRolloutReward(), args=args,
                           train_dataset=task_dataset(range(6)))
tr.train()
local = sorted({e.group for e in tr._batch_episodes})
with open(os.path.join(os.environ["OUT"], f"groups-{tr.accelerator.process_index}.json"), "w") as fh:
    json.dump(local, fh)  # a file per rank: two ranks' lines on one stdout pipe were once read as one
if tr.accelerator.is_main_process:
    loss = [h["loss"] for h in tr.state.log_history if "loss" in h][0]
    print("RESULT " + json.dumps({"processes": tr.accelerator.num_processes, "loss": loss, "advantages": tr.seen}),
          flush=True)
'''


def run(tmp_path: Path, processes: int) -> tuple[dict, list[list[str]]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OUT": str(tmp_path / f"out{processes}")}
    if processes == 1:
        cmd = [sys.executable, str(script)]
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(key, None)
    else:
        import socket

        with socket.socket() as sock:  # a free rendezvous port: another job on this machine may hold the default
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(processes),
               "--master_port", str(port), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [result] = re.findall(r"RESULT (\{.*\})", proc.stdout)
    out = tmp_path / f"out{processes}"
    groups = [json.loads((out / f"groups-{rank}.json").read_text()) for rank in range(processes)]
    return json.loads(result), groups


def test_two_processes_give_the_advantages_and_loss_of_one(tmp_path):
    one, _ = run(tmp_path, 1)
    two, groups = run(tmp_path, 2)
    assert one["processes"] == 1 and two["processes"] == 2
    assert len(one["advantages"]) == 8 and two["advantages"] == one["advantages"]
    assert any(a != 0.0 for adv in one["advantages"].values() for a in adv)
    assert abs(two["loss"] - one["loss"]) <= 1e-5 * max(1.0, abs(one["loss"]))
    assert len(groups) == 2 and not set(groups[0]) & set(groups[1])  # a group is never split across ranks
