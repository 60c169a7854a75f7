"""Training rollouts saved as ordinary episode files, so what training saw can be read like any eval run.

Every ``every`` optimizer steps the trainer hands the batch it just scored to :class:`RolloutSaver`,
which appends to one folder (``<output_dir>/rollouts`` by default):

- ``episodes.jsonl``: the batch's episodes (every process's, gathered), each with
  ``meta["train"] = {"step", "reward", "estimator", "turn_rewards", "advantages"}``; one group per
  query per step (``Episode.group`` carries the step), and ``meta["task_key"]`` names the query, so
  one query can be followed across steps (``turngym view`` does);
- ``scores.jsonl``: the same per-turn rewards and advantages in the scores format
  (``turngym.training.scores``): ``turngym view episodes.jsonl --scores scores.jsonl``;
- ``step-NNNNNN/results.json``: that step's outcome and behaviour metrics in the eval results
  format, so ``turngym report rollouts/step-*`` compares steps; ``turngym ablate`` scores the
  episodes file with other rewards like any other.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym._version import __version__
from turngym.episode import Episode, EpisodeWriter
from turngym.training.scores import ScoreRecord

EPISODES_FILE, SCORES_FILE = "episodes.jsonl", "scores.jsonl"


@dataclass
class RolloutSaver:
    """Appends the scored batch of every ``every``-th optimizer step to ``out_dir`` (``every`` 0: never)."""

    out_dir: Path
    every: int
    reward: str
    estimator: str
    last_step: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"rollouts.every must be a whole number of steps, 0 to save none; got {self.every!r}")
        self.out_dir = Path(self.out_dir)

    def due(self, step: int) -> bool:
        """Step ``step`` is saved: the first generation, then the first one ``every`` steps after the last
        saved (a generation may serve several optimizer steps, so exact multiples can be skipped)."""
        return self.every > 0 and (self.last_step is None or step >= self.last_step + self.every)

    def save(self, step: int, episodes: Sequence[Episode], rewards: Sequence[Sequence[float]],
             advantages: Sequence[Sequence[float]], *, k: int, model: str = "") -> Path:
        """Write one step's episodes with their per-turn rewards and advantages; returns the step's folder."""
        if not (len(episodes) == len(rewards) == len(advantages)):
            raise ValueError(f"{len(episodes)} episodes but {len(rewards)} reward and {len(advantages)} advantage rows")
        saved = []
        records = []
        for ep, r, a in zip(episodes, rewards, advantages, strict=True):
            if len(r) != len(ep.turns) or len(a) != len(ep.turns):
                raise ValueError(f"episode {ep.id}: {len(ep.turns)} turns, {len(r)} rewards, {len(a)} advantages")
            copied = copy.copy(ep)  # the trainer's episode is left as it is
            train = {"step": step, "reward": self.reward, "estimator": self.estimator,
                     "turn_rewards": [float(x) for x in r], "advantages": [float(x) for x in a]}
            copied.meta = {**ep.meta, "train": train}
            if model:  # the policy's name while training is "trl"; the model trained is what a reader needs
                copied.meta["model"] = model
            saved.append(copied)
            records.append(ScoreRecord(ep.id, self.reward, train["turn_rewards"], {self.estimator: train["advantages"]}))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with EpisodeWriter(self.out_dir / EPISODES_FILE, fsync=False) as w:
            w.write_all(saved)
        with (self.out_dir / SCORES_FILE).open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(rec.to_dict()) + "\n" for rec in records))
        step_dir = self.out_dir / f"step-{step:06d}"
        step_dir.mkdir(exist_ok=True)
        results = step_results(step, saved, rewards, advantages, k=k, reward=self.reward, estimator=self.estimator)
        tmp = step_dir / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(step_dir / "results.json")
        self.last_step = step
        return step_dir


def step_results(step: int, episodes: Sequence[Episode], rewards: Sequence[Sequence[float]],
                 advantages: Sequence[Sequence[float]], *, k: int, reward: str, estimator: str) -> dict[str, Any]:
    """One step's batch in the eval results format (``turngym.evals.harness.summarise``'s keys)."""
    from turngym.grading.metrics import behaviour_metrics, outcome_metrics, ungraded

    flat_r = [x for row in rewards for x in row]
    flat_a = [x for row in advantages for x in row]
    models = sorted({str(e.meta["model"]) for e in episodes if e.meta.get("model")})
    return {
        "turngym": __version__,
        "env": ",".join(sorted({e.env_id for e in episodes})),
        "model": models[0] if len(models) == 1 else ",".join(models) or "?",
        "k": k,
        "subset": {"count": len({e.group_key for e in episodes}), "train_step": step,
                   "episode_ids": f"meta.train.step == {step} in ../{EPISODES_FILE}"},
        "episodes": len(episodes),
        "metrics": outcome_metrics(episodes, k),
        "ungraded": ungraded(episodes),
        "behaviour": behaviour_metrics(episodes),
        "train": {"step": step, "reward": reward, "estimator": estimator,
                  "turn_reward_mean": sum(flat_r) / len(flat_r) if flat_r else None,
                  "turn_advantage_mean": sum(flat_a) / len(flat_a) if flat_a else None,
                  "turn_advantage_abs_max": max((abs(x) for x in flat_a), default=None)},
    }
