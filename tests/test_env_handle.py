"""The env handle contract (turngym.agents.env_handle): the runner and the pipeline read declared members of
an env and of its factory, never probe them; the checkers refuse a handle or factory that lies; the runner
announces every reset and step of a tick (the batched forms) before it awaits any, and never keeps more
episodes live than the factory's slots."""

from __future__ import annotations

import ast
from pathlib import Path

import gymnasium
import pytest

import turngym
from conftest import FakeScriptedPolicy
from turngym.agents.checker import EnvContractError, check_env_factory, check_env_handle
from turngym.agents.env_handle import EnvFace, EnvFactory, EnvHandle, LocalEnvs, env_factory
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv

PACKAGE = Path(turngym.__file__).resolve().parent
# where an env or an env factory is handled; a getattr / hasattr there is a probe of an undeclared member
SEAM_FILES = ("agents/runner.py", "run/pipeline.py")
NOT_AN_ENV = {"tok"}  # pipeline.prompt_style reads a tokenizer's chat_template, which transformers does not declare


def probes(path: Path) -> list[str]:
    """``file:line`` of every getattr / hasattr call whose object is not a name in NOT_AN_ENV."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = node.args[0] if node.args else None
            if not (isinstance(target, ast.Name) and target.id in NOT_AN_ENV):
                out.append(f"{path.name}:{node.lineno}")
    return out


def test_the_runner_and_the_pipeline_probe_no_env_or_factory():
    bad = [p for f in SEAM_FILES for p in probes(PACKAGE / f)]
    assert not bad, "getattr/hasattr probes where the env handle is declared: " + ", ".join(bad)


def test_the_probe_finder_finds_a_planted_probe(tmp_path):
    planted = tmp_path / "runner.py"
    planted.write_text("def f(env, tok):\n    a = getattr(env, 'slots', None)\n    b = getattr(tok, 'chat_template', None)\n")
    assert probes(planted) == ["runner.py:2"]


def test_an_in_process_env_is_an_env_handle_and_a_callable_a_factory():
    env = gymnasium.make("turngym/Calculator-v0")
    check_env_handle(env)
    assert isinstance(env, EnvHandle) and isinstance(env.unwrapped, EnvFace)
    factory = env_factory(lambda: CalculatorEnv())
    assert isinstance(factory, LocalEnvs) and factory.slots is None
    check_env_factory(factory)
    assert env_factory(factory) is factory


class FakeListStopEnv(CalculatorEnv):
    """A fake for the checker: stop strings in a list, which a stream's sampling would not take."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.stop = ["</calc>"]  # type: ignore[assignment]  # after the env set its own (from its tag)


def test_the_checkers_refuse_what_breaks_the_contract():
    with pytest.raises(EnvContractError, match="stop must be a tuple"):
        check_env_handle(FakeListStopEnv())
    with pytest.raises(EnvContractError, match="is no env handle"):
        check_env_handle(object())
    with pytest.raises(EnvContractError, match="is no EnvFactory"):
        check_env_factory(lambda: CalculatorEnv())

    class FakeNoSlots(EnvFactory):
        slots = 0

    with pytest.raises(EnvContractError, match="slots must be None or a positive int"):
        check_env_factory(FakeNoSlots())


class RecordingCalculator(CalculatorEnv):
    """A real Calculator env that records the calls it is announced and given, in order."""

    log: list[tuple[str, object]]

    def __init__(self, log: list, **kw):
        super().__init__(**kw)
        self.log = log

    def submit_reset(self, *, seed=None, options=None):
        self.log.append(("submit_reset", options["episode_id"]))

    def reset(self, *, seed=None, options=None):
        self.log.append(("reset", options["episode_id"]))
        return super().reset(seed=seed, options=options)

    def submit_step(self, action):
        self.log.append(("submit_step", action))

    def step(self, action):
        self.log.append(("step", action))
        return super().step(action)


class TwoSlots(EnvFactory):
    """A declared factory with a bound, making recording envs."""

    slots = 2

    def __init__(self):
        self.log: list = []
        self.made = 0

    def __call__(self):
        self.made += 1
        return RecordingCalculator(self.log, max_turns=2)


def test_the_runner_announces_a_ticks_resets_and_steps_and_keeps_to_the_slots(gemma_tokenizer):
    factory = TwoSlots()
    policy = FakeScriptedPolicy(gemma_tokenizer, ["<calc>1+1</calc>", "<answer>2</answer>"])
    runner = RolloutRunner(policy, factory, SamplingParams(max_new_tokens=8, temperature=0), k=3, concurrency=8)
    assert runner.concurrency == 2  # the factory's slots bound the live episodes
    episodes = runner.run([0])
    assert len(episodes) == 3 and factory.made <= 3
    log = factory.log
    # every reset and step was announced first, and all of a tick's announcements come before its first call
    for i, (kind, arg) in enumerate(log):
        if kind in ("reset", "step"):
            assert ("submit_" + kind, arg) in log[:i]
    first_tick = log[:log.index(next(e for e in log if e[0] == "reset"))]
    assert [k for k, _ in first_tick] == ["submit_reset", "submit_reset"]
