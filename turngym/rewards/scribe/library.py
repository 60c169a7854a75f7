"""The skill-prototype library: a two-level hierarchy of clustered skills, each distilled into a rubric.

A library is built from skill items (decomposed steps) by hierarchical clustering of their
descriptions (all-MiniLM-L6-v2 embeddings), bottom-up: the descriptions are clustered into
*skills* (HDBSCAN, K-means fallback, as :mod:`~turngym.rewards.scribe.cluster` says), then
the skills' centroids are grouped into *skill families* by average-linkage agglomerative
clustering on cosine distance, cut where the similarity falls below ``family_similarity``.
A family of two or more skills is a level-1 prototype whose skills are its level-2
children; a skill alone in its family is a level-1 prototype with no children. Every
prototype is distilled by the LLM into a rubric (name, when to use, checklist, pitfalls with
scores, the 0-3 scale) from examples drawn across its members, and keeps its centroid for
routing. A family whose distillation fails is left out with its skills (counted).
Libraries are versioned: a refresh with new trajectories writes version + 1.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from turngym.rewards.scribe.cluster import cluster_skills
from turngym.rewards.scribe.prompts import DISTILL_SCHEMA, SCALE, distill_prompt

LIBRARY_FORMAT = "turngym.scribe.library"
LIBRARY_SCHEMA_VERSION = 2


@dataclass
class SkillItem:
    """One decomposed step: what it pursued, the skill it used, and where it is: characters
    ``[start, end)`` of turn ``turn``'s action (``span`` is that text)."""

    subgoal: str
    skill: str
    turn: int = 0
    start: int = 0
    end: int = 0
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
    level: int = 1                      # 1: skill family, 2: skill
    parent: str | None = None           # a skill's family id


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

    def families(self) -> list[SkillPrototype]:
        return [p for p in self.prototypes if p.level == 1]

    def children(self, pid: str) -> list[SkillPrototype]:
        return [p for p in self.prototypes if p.parent == pid]

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
    def from_dict(cls, d: dict[str, Any]) -> SkillLibrary:
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
    def load(cls, path: str | Path) -> SkillLibrary:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no skill library at {path} (build one with `turngym scribe build-library`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_dict(data)


def group_families(centroids: np.ndarray, family_similarity: float) -> list[int]:
    """Family label of each skill centroid: average linkage on cosine distance, cut at ``1 - family_similarity``."""
    if len(centroids) < 2:
        return [0] * len(centroids)
    from scipy.cluster.hierarchy import fcluster, linkage

    tree = linkage(centroids.astype(np.float64), method="average", metric="cosine")
    return [int(x) - 1 for x in fcluster(tree, t=1.0 - family_similarity, criterion="distance")]


def _unit_mean(vectors: np.ndarray) -> np.ndarray:
    m = vectors.mean(axis=0)
    return m / (np.linalg.norm(m) or 1.0)


def build_library(items: Sequence[SkillItem], embedder: Any, llm: Any, *, min_cluster_size: int = 5,
                  family_similarity: float = 0.3, max_noise: float = 0.5, examples_per_prototype: int = 8,
                  version: int = 1, step: int | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> tuple[SkillLibrary, dict[str, float]]:
    """Cluster ``items`` into skills and families and distil each; returns the library and the time per stage (s).
    ``progress`` hears each stage's name as it starts."""
    say = progress or (lambda text: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    say(f"embedding {len(items)} step descriptions…")
    vectors = embedder.embed([it.text for it in items])
    timings["embed_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    say(f"clustering {len(items)} steps into skills and skill families…")
    clusters = cluster_skills(vectors, min_cluster_size=min_cluster_size, max_noise=max_noise, seed=seed)
    skills = [idx for _, idx in sorted(clusters.groups.items())]
    fam_of = group_families(np.stack([_unit_mean(vectors[idx]) for idx in skills]) if skills else np.zeros((0, 1)),
                            family_similarity)
    tree: list[tuple[str, str | None, list[int]]] = []   # (id, parent, member indices)
    for f, fam in enumerate(sorted(set(fam_of))):
        members = [idx for idx, lab in zip(skills, fam_of, strict=True) if lab == fam]
        tree.append((f"f{f}", None, sorted(i for idx in members for i in idx)))
        if len(members) >= 2:
            tree += [(f"f{f}.s{k}", f"f{f}", idx) for k, idx in enumerate(members)]
    timings["cluster_s"] = time.perf_counter() - t0
    rng = random.Random(seed)
    jobs, chosen_of = [], []
    for _, _, idx in tree:
        chosen = idx if len(idx) <= examples_per_prototype else rng.sample(idx, examples_per_prototype)
        examples = [{"skill": items[i].skill, "subgoal": items[i].subgoal, "span": items[i].span} for i in chosen]
        jobs.append((distill_prompt(examples), DISTILL_SCHEMA))
        chosen_of.append(chosen)
    t0 = time.perf_counter()
    say(f"distilling {len(jobs)} rubrics ({sum(p is None for _, p, _ in tree)} families)…")
    rubrics = llm.call_many(jobs) if jobs else []
    timings["distill_s"] = time.perf_counter() - t0
    protos, failed, lost_families = [], 0, set()
    for (pid, parent, idx), rubric, chosen in zip(tree, rubrics, chosen_of, strict=True):
        if rubric is None or (parent is not None and parent in lost_families):
            failed += 1  # kept out of the library, and counted
            if parent is None:
                lost_families.add(pid)
            continue
        protos.append(SkillPrototype(
            id=pid, name=rubric["name"], when_to_use=rubric["when_to_use"], checklist=list(rubric["checklist"]),
            pitfalls=[{"mistake": p["mistake"], "score": int(p["score"])} for p in rubric.get("pitfalls", [])],
            centroid=[float(x) for x in _unit_mean(vectors[idx])], size=len(idx),
            examples=[items[i].skill for i in chosen[:3]], level=1 if parent is None else 2, parent=parent))
    clustering = {"method": clusters.method, "noise_fraction": clusters.noise_fraction, **clusters.params,
                  "family_similarity": family_similarity, "families": sum(p.level == 1 for p in protos),
                  "skills": sum(p.level == 2 for p in protos)}
    lib = SkillLibrary(protos, version=version, embedder=getattr(embedder, "name", "custom"), clustering=clustering,
                       built_at_step=step, source_items=len(items), failed_distillations=failed)
    return lib, timings
