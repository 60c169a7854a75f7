"""Which run an output belongs to: its id, the digest of its settings, and the check that a folder's episodes are
all of one run.

A run's id is drawn when its output is first written, stored in ``run.json`` (key ``run_id``) and kept by every
resume; the runner prefixes it to every group and episode id and records it with the settings digest in each
episode's ``meta["run"]``. So ids never repeat across runs (a scores file of one run cannot match another run's
episodes), and a folder that holds episodes of another model, env, settings or run is refused in one line before
anything is played, instead of being silently mixed into one set of results.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from turngym.agents.runner import new_run_id
from turngym.episode import Episode
from turngym.run.lock import MERGED_RUNS, RUN_ID

__all__ = ["MERGED_RUNS", "RUN_ID", "RunIdentity", "new_run_id", "settings_digest"]


def settings_digest(settings: dict[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of the settings as run.json stores them (keys sorted)."""
    text = json.dumps(json.loads(json.dumps(settings, default=str)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunIdentity:
    """The run that is about to write an output: what its episodes must record to belong to it."""

    id: str  # "" for a run begun before run ids existed: its episodes keep their unprefixed ids
    settings: str  # settings_digest of the run's settings
    env_id: str
    model: str  # the run's --model (what an episode written without a run id must record as meta["model"])
    merged: frozenset[str] = frozenset()  # a merged folder (eval --merge): the shard runs whose episodes it holds

    def mismatch(self, episodes: Iterable[Episode]) -> str | None:
        """What makes ``episodes`` not this run's (each kind of difference with its count), or None."""
        found: dict[str, Counter[str]] = {"env": Counter(), "model": Counter(), "run": Counter(), "settings": Counter()}
        for ep in episodes:
            if ep.env_id != self.env_id:
                found["env"][ep.env_id] += 1
            run = ep.meta.get("run") if isinstance(ep.meta.get("run"), dict) else None
            if run is None:  # written before run ids (or by the Python API without one): its model must be ours
                model = ep.meta.get("model")
                if model is not None and str(model) != self.model:
                    found["model"][str(model)] += 1
                if self.id:  # an episode without a run id in the output of a run that has one
                    found["run"]["(none)"] += 1
                continue
            # the settings digest covers the model, env arguments and sampling: the policy's own name may differ
            if str(run.get("id", "")) != self.id and str(run.get("id", "")) not in self.merged:
                found["run"][str(run.get("id", ""))] += 1
            elif str(run.get("settings", "")) != self.settings and not self.merged:  # shards' settings differ by --shard
                found["settings"][str(run.get("settings", ""))] += 1
        what = {"env": ("env", self.env_id), "model": ("model", self.model), "run": ("run", self.id or "(none)"),
                "settings": ("settings digest", self.settings)}
        parts = [f"{sum(c.values())} of {what[k][0]} {', '.join(repr(v) for v in sorted(c))} (this run's: {what[k][1]!r})"
                 for k, c in found.items() if c]
        return "; ".join(parts) or None
