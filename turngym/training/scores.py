"""Per-turn scores of saved episodes: the file ``turngym ablate`` writes and ``turngym view --scores`` reads.

Format (JSONL, ``scores.jsonl``): one object per line, one line per (episode, reward)::

    {"episode_id": "q3#0", "reward": "siop", "turn_rewards": [0.12, -0.05, 0.9],
     "advantages": {"turn": [1.1, 0.4, 0.8]},     # optional: estimator name -> one value per turn
     "estimator": "turn"}                           # optional: compute advantages with this estimator

``turn_rewards`` has one finite number per turn of the episode. ``advantages`` maps names of
advantage estimators (``turngym.training.advantages.ESTIMATORS``) to per-turn values; when only
``estimator`` is given, the viewer computes them per group with that estimator's defaults.

Estimators that declare needs beyond the rewards (``EstimatorSpec.needs``) depend on more than a saved
record: ``records_for`` leaves them out, and the viewer labels what it can compute of them from rewards alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.episode import Episode
from turngym.training.advantages import ESTIMATORS, NEEDS, advantages_per_group, get_estimator


def reward_only_estimators() -> list[str]:
    """The registered estimators that a saved episode's rewards determine completely (their declared ``needs``)."""
    return [name for name in ESTIMATORS if get_estimator(name).from_rewards_alone]


def beyond_rewards(name: str) -> str | None:
    """Why ``name``'s advantages from rewards alone are partial (what else it needs), or None."""
    spec = get_estimator(name)
    return None if spec.from_rewards_alone else "; ".join(NEEDS[n] for n in sorted(spec.needs - {"rewards"}))


@dataclass
class ScoreRecord:
    episode_id: str
    reward: str
    turn_rewards: list[float]
    advantages: dict[str, list[float]] = field(default_factory=dict)
    estimator: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"episode_id": self.episode_id, "reward": self.reward, "turn_rewards": self.turn_rewards}
        if self.advantages:
            d["advantages"] = self.advantages
        if self.estimator:
            d["estimator"] = self.estimator
        return d


class ScoresFileError(ValueError):
    """A scores line that does not follow the format; names the file and line."""


def _numbers(value: Any, where: str) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise ScoresFileError(f"{where}: expected a list of numbers, got {str(value)[:80]}")
    out = [float(x) for x in value]
    if not all(math.isfinite(x) for x in out):
        raise ScoresFileError(f"{where}: values must be finite numbers")
    return out


def read_scores(path: str | Path) -> list[ScoreRecord]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"scores file not found: {path}")
    records = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScoresFileError(f"{where}: not JSON ({exc})") from None
        if not isinstance(d, dict) or not isinstance(d.get("episode_id"), str) or not isinstance(d.get("reward"), str):
            raise ScoresFileError(f"{where}: each line needs string fields 'episode_id' and 'reward'")
        adv = d.get("advantages") or {}
        if not isinstance(adv, dict):
            raise ScoresFileError(f"{where}: 'advantages' must map estimator names to lists of numbers")
        estimator = d.get("estimator")
        if estimator is not None and estimator not in ESTIMATORS:
            raise ScoresFileError(f"{where}: unknown estimator {estimator!r}; known: {sorted(ESTIMATORS)}")
        rewards = _numbers(d.get("turn_rewards"), f"{where} turn_rewards")
        advantages = {str(k): _numbers(v, f"{where} advantages[{k}]") for k, v in adv.items()}
        records.append(ScoreRecord(d["episode_id"], d["reward"], rewards, advantages, estimator))
    return records


def records_for(episodes: Sequence[Episode], per_turn: dict[str, list[list[float]]]) -> list[ScoreRecord]:
    """Records for rewards given in episode order, with the group advantages of every registered estimator
    that rewards alone determine (``EstimatorSpec.from_rewards_alone``). Episodes whose rewards are NaN (a
    reward that did not score their group, as a gold-only one) get no record for that reward."""
    groups: dict[str, list[int]] = {}
    for i, ep in enumerate(episodes):
        groups.setdefault(ep.group_key, []).append(i)
    out = []
    estimators = reward_only_estimators()
    for name, rows in per_turn.items():
        scored = [i for i, r in enumerate(rows) if all(math.isfinite(x) for x in r)]  # NaN: a group left unscored
        scored_set = set(scored)
        members = [[i for i in g if i in scored_set] for g in groups.values()]
        adv = {est: advantages_per_group(rows, [g for g in members if g], est) for est in estimators}
        out += [ScoreRecord(episodes[i].id, name, [float(x) for x in rows[i]], {est: adv[est][i] for est in estimators})
                for i in scored]
    return out


def write_scores(path: str | Path, records: Sequence[ScoreRecord]) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
    return path
