"""Registries map names to import paths resolved on demand; a name is registered once."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from turngym.registry import Registry
from turngym.rewards.base import REWARDS, get_reward, register_reward
from turngym.training.advantages import ESTIMATORS, get_estimator, register_estimator


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_building_a_light_reward_imports_no_model_code():
    """A fresh process: the outcome reward (and TTRL/EMPO with offline equivalence) pull in no torch."""
    code = ("import sys\n"
            "from turngym.rewards import get_reward\n"
            "get_reward('outcome'); get_reward('ttrl'); get_reward('empo')\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'sentence_transformers') if m in sys.modules)\n"
            "assert not heavy, heavy\n"
            "print('ok')\n")
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_second_registration_of_a_name_raises():
    code = ("from turngym.rewards.base import register_reward\n"
            "try:\n"
            "    register_reward('outcome', 'turngym.rewards.outcome:OutcomeReward')\n"
            "except ValueError as exc:\n"
            "    print(exc)\n")
    proc = run_python(code)
    assert proc.returncode == 0 and "reward 'outcome' is already registered" in proc.stdout, proc.stderr
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
        register_estimator("grpo", lambda rewards, gamma=1.0, eps=1e-6: rewards)
    with pytest.raises(ValueError, match="cannot hold"):
        register_reward("a+b", "x:y")


def test_registry_resolves_on_demand_and_refuses_bad_entries():
    reg = Registry("widget", {"json_dumps": "json:dumps"})
    assert reg["json_dumps"] == "json:dumps"  # stored as a path until loaded
    assert reg.load("json_dumps")([1]) == "[1]"
    reg.register("square", lambda x: x * x)
    assert reg.load("square")(3) == 9 and sorted(reg) == ["json_dumps", "square"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("square", lambda x: x)
    with pytest.raises(ValueError, match="'module:attribute'"):
        reg.register("bad", "no_colon_here")
    with pytest.raises(ValueError, match="unknown widget 'nope'; choose one of"):
        reg.load("nope")


def test_every_registered_entry_resolves():
    for name in REWARDS:
        factory = REWARDS.load(name)
        assert callable(factory), name
    for name in ESTIMATORS:  # vine also takes its Monte-Carlo advantages
        kw = {"mc": [[0.5], [-0.5]]} if "branches" in get_estimator(name).needs else {}
        assert get_estimator(name)([[1.0], [0.0]], **kw) is not None


def test_a_user_registered_reward_builds_and_joins_a_composite():
    """In a fresh process, so the registration does not outlive the test."""
    code = """
from turngym.episode import Episode, Turn
from turngym.rewards.base import GroupReward, GroupScores, final_turn_rewards, get_reward, register_reward

class Constant(GroupReward):
    name = "constant"
    estimator = "grpo"

    def __init__(self, value=1.0):
        self.value = value

    def score_group(self, episodes):
        return GroupScores([final_turn_rewards(e, self.value) for e in episodes])

register_reward("constant", Constant)
ep = Episode(id="e", env_id="turngym/X-v0", task={"question": "q"}, turns=[Turn(0, "a"), Turn(1, "b")],
             outcome={"correct": True})
assert get_reward("constant", value=2.0).score_group([ep]).rewards == [[0.0, 2.0]]
both = get_reward("constant+outcome", weights={"outcome": 0.5})
assert both.score_group([ep]).rewards == [[0.0, 1.5]]  # constant 1.0 + 0.5 * outcome 1.0
print("ok")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_rewards_declare_their_contract_and_undeclared_ones_are_refused():
    """Every registered reward is a GroupReward whose class declares its needs; a class that declares no
    estimator, or is no GroupReward, is refused when defined or registered, with one clear message."""
    from turngym.rewards.base import GroupReward, reward_class

    classes = {name: reward_class(name) for name in REWARDS}
    assert all(issubclass(c, GroupReward) and isinstance(c.estimator, str) for c in classes.values())
    assert {n for n, c in classes.items() if c.needs_scorer} == {"siop", "igpo", "igpo_siop"}
    assert {n for n, c in classes.items() if c.needs_judge} == {"scribe", "prm"}
    assert {n for n, c in classes.items() if c.learns_library} == {"scribe"}
    assert {n for n, c in classes.items() if c.requires_gold} == {"igpo", "igpo_siop"}
    assert reward_class("outcome+funrl").__name__ == "CompositeReward"
    with pytest.raises(TypeError, match="declares no paired estimator"):
        type("NoEstimator", (GroupReward,), {})
    with pytest.raises(TypeError, match="GroupReward subclass"):
        register_reward("plain-class", type("Plain", (), {"estimator": "grpo"}))
    assert get_reward("ttrl", n_votes=8).vote_pool() == 8 and get_reward("outcome").vote_pool() is None
    assert get_reward("outcome").training_metrics() == {} and get_reward("outcome").costs() == {}
    with pytest.raises(TypeError, match="takes no scorer"):
        get_reward("outcome").bind_scorer(object())


def test_reward_labels_carry_options_in_one_spelling_and_refuse_unknown_ones():
    from turngym.rewards.base import apply_reward_args, check_label, get_reward, split_label

    assert split_label("siop[prefix=after_observation, eta=2]") == ("siop", {"prefix": "after_observation", "eta": 2})
    assert check_label("siop[prefix=after_observation, eta=2]") == "siop[eta=2.0,prefix=after_observation]"  # a float
    assert check_label("outcome") == "outcome" and check_label("scribe+funrl") == "scribe+funrl"
    r = get_reward("funrl[require_think=true]")
    assert (r.require_think, r.name) == (True, "funrl[require_think=true]")
    assert apply_reward_args(["siop", "outcome", "siop[eta=2]"], ["siop.prefix=after_observation"]) == [
        "siop[prefix=after_observation]", "outcome", "siop[eta=2.0,prefix=after_observation]"]
    for bad, message in (("siop[prefx=1]", "reward 'siop' takes no option 'prefx'; its options: eps, equivalence"),
                         ("siop[prefix]", "option 'prefix' is not key=value"),
                         ("scribe+funrl[x=1]", "a composite takes no options"),
                         ("nope[x=1]", "unknown reward 'nope'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_label(bad)
    with pytest.raises(ValueError, match="given twice"):
        get_reward("funrl[require_think=true]", require_think=False)
    # options take their default's type: YAML 1.1 reads 1e-8 as a string, the float option gets a float
    assert get_reward("siop[eps=1e-8]").eps == 1e-8 and check_label("siop[n_ref=2]") == "siop[n_ref=2]"
    for bad, message in (("funrl[require_think=1]", "option require_think takes a bool (default False), got 1"),
                         ("siop[n_ref=2.5]", "option n_ref takes an int (default 3), got 2.5"),
                         ("siop[lam=half]", "option lam takes a float (default 0.5), got 'half'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            check_label(bad)
