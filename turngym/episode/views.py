"""What one reader may see of an episode: the content two backends must agree on, a reward's view (no truth),
and the truth as turn labels for credit tables; one place each, so no caller strips or reads truth its own way."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from turngym.episode.groups import EpisodeGroup
from turngym.episode.record import Episode
from turngym.truth import TruthError, TruthMap, binary_label


def played_content(ep: Episode) -> dict[str, Any]:
    """What an episode says, without when and where it was played (wall and turn timings, the Ray worker that
    played it): the record two backends of the same run must agree on."""
    d = ep.to_dict()
    d["meta"] = {k: v for k, v in d["meta"].items() if k not in ("wall_ms", "ray")}
    for t in d["turns"]:
        t["latency_ms"] = {}
    return d


def reward_view(episodes: Sequence[Episode]) -> Any:
    """The episodes as a reward may see them: shallow copies whose turns carry no truth.

    Every place that hands episodes to ``score_group`` (ablate, creditbench, the trainer) goes
    through here, so a reward cannot read the truth it is scored against. An
    :class:`~turngym.episode.EpisodeGroup` stays one (same key and task).
    """
    copies = tuple(dataclasses.replace(ep, turns=[dataclasses.replace(t, truth={}) for t in ep.turns])
                   for ep in episodes)
    if isinstance(episodes, EpisodeGroup):
        return EpisodeGroup(episodes.key, episodes.task, copies)
    return list(copies)


def turn_labels(ep: Episode, key: str | None = None, mapping: TruthMap | None = None) -> list[int | None]:
    """Each turn's label (1 useful, 0 not, None unlabelled) from the truth namespace only.

    ``key`` None: the one key the episode's turns carry (none: all unlabelled; several: refused, name one).
    Values pass through ``mapping`` when given, else must be binary (True / False / 1 / 0): never cast
    with ``bool()``, so a −1 label is not "useful".
    """
    if key is None:
        keys = sorted({k for t in ep.turns for k in t.truth})
        if len(keys) > 1:
            raise TruthError(f"episode {ep.id} carries several truth keys {keys}; name the one to score with --truth")
        if not keys:
            return [None] * len(ep.turns)
        key = keys[0]
    out: list[int | None] = []
    for t in ep.turns:
        tv = t.truth.get(key)
        if tv is None or tv.value is None or (isinstance(tv.value, float) and math.isnan(tv.value)):
            out.append(None)
            continue
        if mapping is not None:
            found, lab = mapping.label(tv.value)
            if not found:
                raise TruthError(f"truth {key!r} = {tv.value!r} on turn {t.index} of episode {ep.id} is not in "
                                 f"--truth-map; add it (VALUE:1, VALUE:0 or VALUE:skip)")
            out.append(lab)
            continue
        try:
            out.append(binary_label(tv.value))
        except ValueError:
            raise TruthError(f"truth {key!r} = {tv.value!r} ({tv.source}) on turn {t.index} of episode {ep.id} is not "
                             "binary (True/False/1/0); give --truth-map, e.g. '+1:1,-1:0,0:skip'") from None
    return out
