"""The skill-prototype library: clustered skills, each distilled into a rubric, saved as JSON.

A library is built from skill items (decomposed steps): their skill descriptions are
embedded, clustered, and each cluster is distilled by the LLM into a prototype (name,
when to use, checklist, pitfalls with scores, the 0-3 scale). The centroid of each
cluster is kept for nearest-prototype routing. Libraries are versioned: a refresh with
new trajectories writes version + 1.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from turngym.rewards.scribe.cluster import cluster_skills
from turngym.rewards.scribe.prompts import DISTILL_SCHEMA, SCALE, distill_prompt

LIBRARY_FORMAT = "turngym.scribe.library"
LIBRARY_SCHEMA_VERSION = 1


@dataclass
class SkillItem:
    """One decomposed step: what it pursued, the skill it used, the turns it spans."""

    subgoal: str
    skill: str
    first_turn: int
    last_turn: int
    episode_id: str = ""
    span: str = ""

    @property
    def text(self) -> str:
        """What gets embedded: the skill, with its subgoal for context."""
        return f"{self.skill}. {self.subgoal}"


@dataclass
class SkillPrototype:
    id: str
    name: str
    when_to_use: str
    checklist: list[str]
    pitfalls: list[dict[str, Any]]
    scale: dict[str, str] = field(default_factory=lambda: dict(SCALE))
    centroid: list[float] = field(default_factory=list)
    size: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class SkillLibrary:
    prototypes: list[SkillPrototype]
    version: int = 1
    embedder: str = "default"
    clustering: dict[str, Any] = field(default_factory=dict)
    built_at_step: int | None = None
    source_items: int = 0
    failed_distillations: int = 0

    def by_id(self, pid: str) -> SkillPrototype | None:
        return next((p for p in self.prototypes if p.id == pid), None)

    def centroids(self) -> np.ndarray:
        if not self.prototypes:
            return np.zeros((0, 384), dtype=np.float32)
        return np.asarray([p.centroid for p in self.prototypes], dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {"format": LIBRARY_FORMAT, "schema_version": LIBRARY_SCHEMA_VERSION, "version": self.version,
                "embedder": self.embedder, "clustering": self.clustering, "built_at_step": self.built_at_step,
                "source_items": self.source_items, "failed_distillations": self.failed_distillations,
                "prototypes": [asdict(p) for p in self.prototypes]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SkillLibrary":
        if d.get("format") != LIBRARY_FORMAT:
            raise ValueError(f"not a SCRIBE skill library (format {d.get('format')!r})")
        if int(d.get("schema_version", 0)) > LIBRARY_SCHEMA_VERSION:
            raise ValueError(f"library schema_version {d['schema_version']} is newer than this turngym understands")
        protos = [SkillPrototype(**p) for p in d["prototypes"]]
        return cls(protos, int(d["version"]), d.get("embedder", "default"), d.get("clustering", {}),
                   d.get("built_at_step"), int(d.get("source_items", 0)), int(d.get("failed_distillations", 0)))

    def save(self, path: str | Path) -> Path:
        """Atomic write: a crash mid-save leaves the previous library intact."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "SkillLibrary":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no skill library at {path} (build one with `turngym scribe build-library`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)


def build_library(items: Sequence[SkillItem], embedder: Any, llm: Any, *, min_cluster_size: int = 5,
                  max_noise: float = 0.5, examples_per_prototype: int = 8, version: int = 1,
                  step: int | None = None, seed: int = 0) -> tuple[SkillLibrary, dict[str, float]]:
    """Cluster ``items`` and distil each cluster; returns the library and the time per stage (s)."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    vectors = embedder.embed([it.text for it in items])
    timings["embed_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    clusters = cluster_skills(vectors, min_cluster_size=min_cluster_size, max_noise=max_noise, seed=seed)
    timings["cluster_s"] = time.perf_counter() - t0
    rng = random.Random(seed)
    groups = sorted(clusters.groups.items())
    jobs, members = [], []
    for _, idx in groups:
        chosen = idx if len(idx) <= examples_per_prototype else rng.sample(idx, examples_per_prototype)
        examples = [{"skill": items[i].skill, "subgoal": items[i].subgoal, "span": items[i].span} for i in chosen]
        jobs.append((distill_prompt(examples), DISTILL_SCHEMA))
        members.append((idx, chosen))
    t0 = time.perf_counter()
    rubrics = llm.call_many(jobs) if jobs else []
    timings["distill_s"] = time.perf_counter() - t0
    protos, failed = [], 0
    for n, (rubric, (idx, chosen)) in enumerate(zip(rubrics, members)):
        if rubric is None:
            failed += 1  # kept out of the library, and counted
            continue
        centroid = vectors[idx].mean(axis=0)
        centroid = centroid / (np.linalg.norm(centroid) or 1.0)
        protos.append(SkillPrototype(
            id=f"p{n}", name=rubric["name"], when_to_use=rubric["when_to_use"], checklist=list(rubric["checklist"]),
            pitfalls=[{"mistake": p["mistake"], "score": int(p["score"])} for p in rubric.get("pitfalls", [])],
            centroid=[float(x) for x in centroid], size=len(idx), examples=[items[i].skill for i in chosen[:3]]))
    clustering = {"method": clusters.method, "noise_fraction": clusters.noise_fraction, **clusters.params}
    lib = SkillLibrary(protos, version=version, embedder=getattr(embedder, "name", "custom"), clustering=clustering,
                       built_at_step=step, source_items=len(items), failed_distillations=failed)
    return lib, timings
