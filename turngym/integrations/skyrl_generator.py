"""Group rewards (SIOP, TTRL, EMPO, IGPO, ...) placed per turn on what SkyRL's stock generator returns.

SkyRL's ``SkyRLGymGenerator`` plays each trajectory alone, so a reward that needs all K samples of a prompt
never reaches it. :class:`TurnRewardGenerator` wraps any SkyRL generator: it awaits the wrapped ``generate``
and then :func:`place_group_rewards` reads each row's turngym episode back from ``env_metrics`` (where
``TurngymSkyRLEnv.get_metrics`` puts it), scores the groups with a turngym reward through
:func:`turngym.integrations.edges.score_groups` and puts turn t's reward on the last token of turn t's reply,
as SkyRL's generator places a step's reward (``_build_per_token_rewards``, at the step's ``response_end_idx``)
when no stop string makes it append a masked EOS (then SkyRL's reward sits on that EOS, one token later).

SkyRL's ``grpo``/``rloo`` estimators sum a row's token rewards into one score; the per-turn placement keeps
turn credit only under estimators that read positions (``reinforce++``, ``gae``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import skyrl_gym
from skyrl_gym.envs.registration import load_env_creator

from turngym.episode import Episode
from turngym.integrations.edges import score_groups
from turngym.integrations.skyrl import EPISODE_METRIC, TurngymSkyRLEnv


def reply_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of 1s in a row's loss mask: the reply tokens of each turn, in order
    (observation tokens have mask 0)."""
    spans, start = [], None
    for i, m in enumerate([*loss_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _not_turngym(row: int, env_class: str | None) -> ValueError:
    return ValueError(f"row {row} ({env_class or 'env class unknown'}) is not a turngym env (TurngymSkyRLEnv): "
                      f"no episode in its env_metrics[{EPISODE_METRIC!r}] for a group reward to score")


def place_group_rewards(generator_output: dict[str, Any], reward: Any = "outcome", *,
                        env_classes: Sequence[str] | None = None, zero_on_non_stop: bool = False) -> dict[str, Any]:
    """Set ``generator_output["rewards"]`` to token-level group rewards and return the output (other fields as
    they were). ``reward``: a turngym reward or its registered name. Each row's episode comes from its
    ``env_metrics``; its groups (``Episode.group``) are scored together. Turn t's reward lands on the last token
    of the t-th run of 1s in the row's loss mask, 0 elsewhere. A row whose mask is all 0 (SkyRL's overlong
    filtering masked it) keeps its total on its last token, so its group's sums stay whole.
    ``zero_on_non_stop``: SkyRL's ``zero_reward_on_non_stop``, applied again to the new rewards."""
    if generator_output.get("is_last_step") is not None:
        raise ValueError("step-wise trajectories (generator.step_wise_trajectories) are not supported: "
                         "each row must be a whole trajectory")
    masks = generator_output["loss_masks"]
    if not generator_output.get("env_metrics"):
        raise ValueError("the generator output has no env_metrics (SkyRL's batched single-turn generation returns "
                         "none): the episodes cannot be read back; use SkyRL's agent loop (generator.batched=false)")
    metrics = generator_output["env_metrics"]
    if len(metrics) != len(masks):
        raise ValueError(f"{len(metrics)} env_metrics rows for {len(masks)} loss masks")
    episodes = []
    for i, m in enumerate(metrics):
        if not isinstance(m, Mapping) or not isinstance(m.get(EPISODE_METRIC), Mapping):
            raise _not_turngym(i, env_classes[i] if env_classes is not None else None)
        episodes.append(Episode.from_dict(m[EPISODE_METRIC]))
    per_turn = score_groups(reward, episodes).rewards
    stops = generator_output.get("stop_reasons") or [None] * len(masks)
    rewards = []
    for i, (ep, mask, turn_rewards) in enumerate(zip(episodes, masks, per_turn, strict=True)):
        row = [0.0] * len(generator_output["response_ids"][i])
        spans = reply_spans(mask)
        if not spans and row and stops[i] not in (None, "stop"):
            row[-1] = float(sum(turn_rewards))
        elif len(spans) != len(turn_rewards):
            raise ValueError(f"row {i} (episode {ep.id}) has {len(spans)} reply spans in its loss mask but "
                             f"{len(turn_rewards)} turns: the replies cannot be matched to turns")
        else:
            for (_start, end), r in zip(spans, turn_rewards, strict=True):
                row[end - 1] += float(r)
        if zero_on_non_stop and stops[i] not in (None, "stop"):
            row = [0.0] * len(row)
        rewards.append(row)
    generator_output["rewards"] = rewards
    return generator_output


def is_turngym_env(env_class: str) -> bool:
    """Whether ``env_class`` is registered in skyrl-gym as a :class:`TurngymSkyRLEnv`."""
    spec = skyrl_gym.registry.get(env_class)
    if spec is None:
        return False
    made = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    return isinstance(made, type) and issubclass(made, TurngymSkyRLEnv)


class TurnRewardGenerator:
    """A SkyRL generator (duck-typed ``GeneratorInterface``: SkyRL only awaits ``generate(batch)``) that plays
    the batch with ``generator`` and replaces its rewards by a turngym group reward placed per turn.

    ``reward``: a turngym reward or its registered name, configured by ``reward_args``. The K samples of a
    prompt form one group: each row's SkyRL uid (``trajectory_ids[i].instance_id``) goes to its env as
    ``group`` unless the row names one. An eval batch (``batch_metadata.training_phase == "eval"``) keeps the
    env's own rewards, which is what eval measures. Other attributes are the wrapped generator's.
    Not subclassing skyrl's ``GeneratorInterface`` keeps this importable where only skyrl-gym is installed."""

    def __init__(self, generator: Any, reward: Any = "outcome", **reward_args: Any):
        from turngym.rewards import get_reward

        if reward_args and not isinstance(reward, str):
            raise ValueError("reward_args configure a reward named by its string; pass a reward object as is")
        self.generator = generator
        self.reward = get_reward(reward, **reward_args) if isinstance(reward, str) else reward

    def __getattr__(self, name: str) -> Any:
        if name == "generator":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.generator, name)

    async def generate(self, input_batch: dict[str, Any], disable_tqdm: bool = False) -> dict[str, Any]:
        classes = list(input_batch["env_classes"])
        meta = input_batch.get("batch_metadata")
        if getattr(meta, "training_phase", "train") == "eval":
            return await self._wrapped(input_batch, disable_tqdm)
        turngym_class = {c: is_turngym_env(c) for c in set(classes)}
        for i, env_class in enumerate(classes):
            if not turngym_class[env_class]:  # refused before anything is generated
                raise _not_turngym(i, env_class)
        output = await self._wrapped(with_groups(input_batch), disable_tqdm)
        cfg = getattr(self.generator, "generator_cfg", None)
        return place_group_rewards(output, self.reward, env_classes=classes,
                                   zero_on_non_stop=bool(getattr(cfg, "zero_reward_on_non_stop", False)))

    async def _wrapped(self, batch: dict[str, Any], disable_tqdm: bool) -> dict[str, Any]:
        if disable_tqdm and "disable_tqdm" in inspect.signature(self.generator.generate).parameters:
            return await self.generator.generate(batch, disable_tqdm=True)
        return await self.generator.generate(batch)


def with_groups(input_batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with each row's SkyRL uid as its env's ``group`` (rows naming a group keep it); the input's
    rows are not modified. Without ``trajectory_ids`` the batch is returned as is (each row a group of one)."""
    ids = input_batch.get("trajectory_ids")
    if not ids:
        return input_batch
    rows = []
    for row, tid in zip(input_batch.get("env_extras") or [{} for _ in ids], ids, strict=True):
        row = dict(row or {})
        info = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
        if row.get("group") is None and info.get("group") is None:
            row["group"] = tid.instance_id
        rows.append(row)
    return {**input_batch, "env_extras": rows}
