"""``dtype="auto"`` follows what the CPU computes: bf16 only with bf16 arithmetic (else torch emulates it and a
prompt's forward runs several times slower, ``benchmarks/cpu_dtype.py``), fp32 otherwise; bf16 on accelerators."""

import pytest

from turngym.agents import loading
from turngym.agents.loading import auto_dtype, cpu_computes_bf16

X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\nprocessor\t: 1\nflags\t\t: fpu sse avx2\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
X86_AMX = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"
ARM_PLAIN = "processor\t: 0\nFeatures\t: fp asimd evtstrm\n"


@pytest.mark.parametrize(("cpuinfo", "expected"), [(X86_AVX2, False), (X86_BF16, True), (X86_AMX, True),
                                                   (ARM_BF16, True), (ARM_PLAIN, False), ("", False),
                                                   ("model name\t: bf16 marketing name\n", False)])
def test_bf16_arithmetic_is_read_from_the_cpu_flags(cpuinfo, expected):
    assert cpu_computes_bf16(cpuinfo) is expected


@pytest.mark.parametrize("native", [False, True])
def test_auto_dtype_on_cpu_follows_the_flags_and_accelerators_get_bf16(monkeypatch, native):
    monkeypatch.setattr(loading, "cpu_computes_bf16", lambda: native)
    for embedded in (loading.DEFAULT_MODEL, *loading.CHUNKED_MODELS):
        assert auto_dtype(embedded, "cpu") == ("bfloat16" if native else "float32")
        assert auto_dtype(embedded, "cuda") == "bfloat16"
    assert auto_dtype("some/hub-model", "cpu") == "float32"  # a model stored in its own dtype: fp32 on a CPU


def test_the_tiny_model_loads_in_the_auto_dtype_of_this_machine():
    import torch

    from turngym.agents.tiny import tiny_model_dir

    policy = loading.load_hf_policy(str(tiny_model_dir(chat=True)), device="cpu")
    assert next(policy.model.parameters()).dtype == getattr(torch, auto_dtype(str(tiny_model_dir(chat=True)), "cpu"))
