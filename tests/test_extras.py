"""Optional installs: the table in turngym/extras.py agrees with pyproject.toml, and an env or reward whose
extra is missing stops with the one message that names it (a core-only install is checked for real by
scripts/core_install.sh, which scripts/test.sh runs)."""

import tomllib
from pathlib import Path

import gymnasium
import pytest

import turngym  # noqa: F401 - env registration
from turngym import extras
from turngym.corpora.lucene import RetrieverError
from turngym.rewards import get_reward
from turngym.training.config import device_arguments

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_declared_extra_is_in_pyproject_and_all_holds_them():
    optional = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(optional)
    assert set(extras.NEEDS.values()) <= set(extras.EXTRAS)
    (everything,) = optional["all"]
    named = set(everything.partition("[")[2].rstrip("]").split(","))
    assert set(optional) - {"all", "test"} - set(extras.NOT_IN_ALL) == named
    assert set(extras.NOT_IN_ALL) <= set(optional) and not set(extras.NOT_IN_ALL) & named


def test_the_core_needs_no_model_or_search_stack():
    core = " ".join(PYPROJECT["project"]["dependencies"])
    for heavy in ("torch", "transformers", "pyserini", "lm-eval", "trl", "scipy", "math-verify", "sentence-transformers"):
        assert heavy not in core


@pytest.fixture
def absent_extra(monkeypatch):
    """A test-only extra whose module is not installed, declared for the part the test names."""
    monkeypatch.setitem(extras.EXTRAS, "absent", extras.Extra("absent", "a package not installed here",
                                                               ("turngym_test_no_such_module",)))

    def declare(part: str) -> None:
        monkeypatch.setitem(extras.NEEDS, part, "absent")
    return declare


def test_an_env_whose_extra_is_missing_names_the_install_command(absent_extra):
    absent_extra("Digits-v0")
    with pytest.raises(extras.MissingExtra) as exc:
        gymnasium.make("turngym/Digits-v0")
    assert str(exc.value) == ("Digits-v0 needs a package not installed here: pip install 'turngym[absent]' "
                              "(not installed: turngym_test_no_such_module)")


def test_a_reward_whose_extra_is_missing_names_the_install_command(absent_extra):
    absent_extra("the reward 'ttrl'")
    with pytest.raises(extras.MissingExtra, match=r"the reward 'ttrl' needs .*pip install 'turngym\[absent\]'"):
        get_reward("ttrl")
    get_reward("empo")  # a reward with no declared extra is built as before


def test_an_installed_extra_lets_the_part_load():
    assert extras.missing("math") == []  # the test environment has every extra
    env = gymnasium.make("turngym/Calculator-v0")
    assert type(env.unwrapped).__name__ == "CalculatorEnv"
    assert gymnasium.spec("turngym/MathCode-v0").entry_point == "turngym.envs:MathCodeEnv"


def test_bfcl_says_its_no_deps_step_too(absent_extra):
    message = extras.message("BFCL-v0", ["bfcl_eval"])
    assert "pip install 'turngym[bfcl]'; then pip install --no-deps bfcl-eval==" in message


def test_an_undeclared_part_is_refused():
    with pytest.raises(KeyError, match="declare the extra"):
        extras.require("no such part")


def test_without_an_accelerator_training_runs_on_cpu_in_fp32():
    assert device_arguments({"max_steps": 2}, None) == {"max_steps": 2, "use_cpu": True, "bf16": False}
    assert device_arguments({"bf16": True}, None) == {"bf16": True, "use_cpu": True}  # asked for: kept
    assert device_arguments({"max_steps": 2}, "cuda") == {"max_steps": 2}  # TRL's own defaults on a GPU


def test_searchqa_says_at_make_that_a_local_index_needs_the_search_extra(absent_extra):
    part = "BM25 search over a local Lucene index (SearchQA-v0's default retriever)"
    absent_extra(part)
    with pytest.raises(extras.MissingExtra, match=r"pip install 'turngym\[absent\]'"):
        gymnasium.make("turngym/SearchQA-v0", dataset="hotpotqa")
    # a served index needs no extra: the env asks the server instead (here none answers, which is said as such)
    with pytest.raises(RetrieverError, match="retrieval server http://127.0.0.1:9/retrieve is unreachable"):
        gymnasium.make("turngym/SearchQA-v0", dataset="hotpotqa", retriever="http://127.0.0.1:9")
