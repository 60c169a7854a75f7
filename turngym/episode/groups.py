"""Episodes in groups: the K rollouts of one query, scored together (by ``Episode.group_key``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turngym.episode.needs import RewardNeeds
from turngym.episode.record import Episode


@dataclass(frozen=True)
class EpisodeGroup(Sequence):
    """The K rollouts of one query, in order, with the task they played.

    ``key`` is the episodes' ``Episode.group`` (an episode without one is a group of its own,
    keyed by its id). Built by :func:`group_episodes` from saved or fresh episodes, or by
    :meth:`of` from episodes already known to form one group (a trainer's slice, a reward's
    input); either way the episodes must be rollouts of one query (one question).
    """

    key: str
    task: dict[str, Any]
    episodes: tuple[Episode, ...]

    def __post_init__(self) -> None:
        if not self.episodes:
            raise ValueError("a group needs at least one episode")
        questions = {str(e.task.get("question")) for e in self.episodes}
        if len(questions) > 1:
            raise ValueError(f"a group must hold rollouts of one query; got {len(questions)} different questions")

    @classmethod
    def of(cls, episodes: Sequence[Episode]) -> EpisodeGroup:
        """``episodes`` as one group (a group is returned as it is)."""
        if isinstance(episodes, EpisodeGroup):
            return episodes
        first = episodes[0] if episodes else None
        return cls(first.group_key if first else "", first.task if first else {}, tuple(episodes))

    @property
    def question(self) -> str:
        return str(self.task.get("question", ""))

    @property
    def env_id(self) -> str:
        return self.episodes[0].env_id

    def __getitem__(self, i):  # type: ignore[override]
        return list(self.episodes[i]) if isinstance(i, slice) else self.episodes[i]

    def __len__(self) -> int:
        return len(self.episodes)


def group_episodes(episodes: Iterable[Episode]) -> list[EpisodeGroup]:
    """Episodes grouped by ``Episode.group`` (alone when it has none), groups in first-seen order."""
    by_key: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_key.setdefault(ep.group_key, []).append(ep)
    return [EpisodeGroup(key, eps[0].task, tuple(eps)) for key, eps in by_key.items()]


def group_needs(episodes: Sequence[Episode], purpose: str) -> RewardNeeds:
    """The declaration the episodes of one group share (they come from one env configuration)."""
    if not episodes:
        raise ValueError("a group needs at least one episode")
    needs = episodes[0].needs(purpose)
    for ep in episodes[1:]:
        if ep.needs(purpose) != needs:
            raise ValueError(f"episodes {episodes[0].id} and {ep.id} of one group declare different reward needs "
                             f"({needs} vs {ep.reward_needs}); a group must come from one env configuration")
    return needs
