"""Grouping skill descriptions: HDBSCAN, with a K-means fallback when too much is noise.

HDBSCAN (the ``hdbscan`` package) finds groups of any number without being told how many,
and calls points in no dense group noise. When it leaves more than ``max_noise`` of the
points as noise, or finds fewer than two groups, K-means takes over with K chosen by
silhouette score; the result says which method was used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Clusters:
    labels: list[int]                 # -1: noise
    method: str                       # "hdbscan" | "kmeans"
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def groups(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, lab in enumerate(self.labels):
            if lab >= 0:
                out.setdefault(lab, []).append(i)
        return out

    @property
    def noise_fraction(self) -> float:
        return sum(lab < 0 for lab in self.labels) / max(1, len(self.labels))


def cluster_skills(vectors: np.ndarray, min_cluster_size: int = 5, max_noise: float = 0.5,
                   max_k: int = 32, seed: int = 0) -> Clusters:
    n = len(vectors)
    if n == 0:
        return Clusters([], "none")
    if n < max(2 * min_cluster_size, 4):
        return Clusters([0] * n, "single", {"reason": f"only {n} descriptions"})
    distinct = len(np.unique(np.round(vectors, 6), axis=0))
    if distinct < 3:
        return Clusters([0] * n, "single", {"reason": f"only {distinct} distinct descriptions"})
    import hdbscan

    hd = hdbscan.HDBSCAN(min_cluster_size=min_cluster_size, min_samples=max(1, min_cluster_size // 2),
                         metric="euclidean")  # unit vectors: euclidean order equals cosine order
    labels = hd.fit_predict(vectors.astype(np.float64))
    found = len(set(labels) - {-1})
    noise = float(np.mean(labels < 0))
    if found >= 2 and noise <= max_noise:
        return Clusters([int(x) for x in labels], "hdbscan",
                        {"min_cluster_size": min_cluster_size, "noise_fraction": noise, "clusters": found})
    return _kmeans(vectors, max_k, seed, {"hdbscan_clusters": found, "hdbscan_noise": noise})


def _kmeans(vectors: np.ndarray, max_k: int, seed: int, why: dict[str, Any]) -> Clusters:
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    distinct = len(np.unique(np.round(vectors, 6), axis=0))
    best: tuple[float, int, np.ndarray] | None = None
    for k in range(2, min(max_k, distinct - 1) + 1):
        labels = KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(vectors)
        if len(set(labels)) < 2:
            continue
        score = float(silhouette_score(vectors, labels))
        if best is None or score > best[0]:
            best = (score, k, labels)
    if best is None:
        return Clusters([0] * len(vectors), "single", {"reason": "no K gave two groups", **why})
    return Clusters([int(x) for x in best[2]], "kmeans", {"k": best[1], "silhouette": best[0], **why})
