"""``turngym ablate`` and ``creditbench`` say what they are doing from the first second: a stage line per
reward × group as it is scored (model-scored rewards take seconds per group on a CPU)."""

from __future__ import annotations

import gymnasium

import turngym  # noqa: F401 - registers the envs
from turngym.cli import main
from turngym.episode import EpisodeWriter


def _play(actions, k):
    env = gymnasium.make("turngym/Calculator-v0")
    env.reset(seed=k, options={"index": 0, "group": "q0", "episode_id": f"q0#{k}"})
    for a in actions:
        env.step(a)
    return env.unwrapped.episode


def test_ablate_prints_each_reward_and_group_as_it_scores(tmp_path, capsys):
    group = [_play(["<calc>84 * 63 + 51</calc>", "<answer>5343</answer>"], 0), _play(["<answer>5292</answer>"], 1)]
    with EpisodeWriter(tmp_path / "episodes.jsonl") as w:
        for e in group:
            w.write(e)
    assert main(["ablate", "--episodes", str(tmp_path / "episodes.jsonl"), "--rewards", "outcome,ttrl",
                 "--out", str(tmp_path / "ab")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert "reading episodes" in lines[0]
    assert any(line.endswith("outcome: group 1/1") for line in lines)
    assert any(line.endswith("ttrl: group 1/1") for line in lines)


def test_creditbench_progress_names_the_env(tmp_path):
    from turngym.credit.creditbench import BenchConfig, run_creditbench
    from turngym.rewards import get_reward

    said: list[str] = []
    summary = run_creditbench(BenchConfig(envs=("mathcode",), groups=2, k=2, designs=("random",)),
                              {"outcome": get_reward("outcome")}, n_boot=10, progress=said.append)
    [env] = summary["envs"]
    assert said == [f"{env} outcome: group 1/2", f"{env} outcome: group 2/2"]
