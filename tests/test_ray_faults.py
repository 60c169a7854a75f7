"""The Ray env pool through what a cluster really does (turngym.run.backends.ray_pool, ray_faults): actors that
die while starting, before ready, mid-episode or together; a crash loop; a frozen actor (SIGSTOP) past its
deadline; what cannot cross the process boundary (an unpicklable info value or exception, an env that kills its
process). Real Ray (``ray.init(num_cpus=2)``, shared by the module), real SIGKILL / SIGSTOP of actor processes.

The envs named Fake* are fakes (test only): the real calculator with one hostile behaviour added."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time

import pytest

from turngym.episode import played_content

ray = pytest.importorskip("ray")

from turngym.agents.policy import PolicyBase, SamplingParams  # noqa: E402
from turngym.agents.runner import RolloutRunner  # noqa: E402
from turngym.envs.calculator import CalculatorEnv  # noqa: E402
from turngym.episode.reader import read_episodes  # noqa: E402
from turngym.run.backends.ray_faults import EnvCallError  # noqa: E402
from turngym.run.backends.ray_pool import RayEnvPool, RayPoolError, init_ray  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module
    yield
    ray.shutdown()


def by_id(episodes):
    return {e.id: played_content(e) for e in episodes}


def tokens(tmp_path, n):
    """``n`` one-use tokens in a folder: each actor that takes one (an atomic remove) dies while it starts."""
    folder = tmp_path / "deaths"
    folder.mkdir()
    for i in range(n):
        (folder / str(i)).touch()
    return str(folder)


class FakeDyingCalculator(CalculatorEnv):
    """A fake (test only): the real calculator whose construction SIGKILLs its own process while a token is left."""

    def __init__(self, die_dir=None, **kwargs):
        for name in sorted(os.listdir(die_dir)) if die_dir else []:
            try:
                os.remove(os.path.join(die_dir, name))
            except FileNotFoundError:
                continue
            os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(**kwargs)


class Saboteur(PolicyBase):
    """Wraps a real policy; before chosen generate calls it sends ``sig`` to the processes of pool actors (all
    live ones with ``together``), so the episodes on them have turns played and wait for their next action."""

    def __init__(self, policy, pool, at, sig=signal.SIGKILL, together=False):
        self.policy, self.pool, self.at, self.sig, self.together = policy, pool, dict(at), sig, together
        self.calls, self.hit = 0, []
        self.tokenizer, self.name, self.max_context = policy.tokenizer, policy.name, policy.max_context

    def generate(self, requests, sampling):
        self.calls += 1
        if self.calls in self.at:
            live = self.pool.live_workers()
            victims = live if self.at[self.calls] == "all" else [live[0]]
            for w in victims:
                os.kill(w.pid, self.sig)
                self.hit.append(w)
        return self.policy.generate(requests, sampling)


def test_actors_killed_while_starting_are_replaced_and_nothing_is_lost(tiny_chat_policy, tmp_path):
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), GREEDY, k=2, concurrency=4).run(range(3))
    start = time.monotonic()
    with RayEnvPool(FakeDyingCalculator, {"max_turns": 3, "die_dir": tokens(tmp_path, 3)}, workers=2,
                    envs_per_worker=2) as pool:
        assert len(pool.live_workers()) == 2 and time.monotonic() - start < 60
        causes = [d.cause for d in pool.deaths.record]
        assert len(causes) == 3 and all(c.startswith("lost before it was ready") for c in causes), causes
        remote = RolloutRunner(tiny_chat_policy, pool, GREEDY, k=2, concurrency=4).run(range(3), tmp_path / "e.jsonl")
    assert by_id(remote) == by_id(local) == by_id(read_episodes(tmp_path / "e.jsonl", strict=True).episodes)


def test_a_crash_loop_ends_the_run_in_one_line_within_bounded_time(tmp_path):
    start = time.monotonic()
    with pytest.raises(RayPoolError) as err:
        RayEnvPool(FakeDyingCalculator, {"die_dir": tokens(tmp_path, 50)}, workers=1, envs_per_worker=1, restarts=3)
    text = str(err.value)
    assert "4 Ray env actors lost in this run, more than its budget of 3" in text and "\n" not in text
    assert "lost before it was ready" in text
    assert time.monotonic() - start < 60
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == 2  # no actor left holding a CPU


@pytest.mark.parametrize("concurrency", [1, 4])
def test_actors_killed_together_lose_nothing_and_write_nothing_twice(tiny_chat_policy, tmp_path, concurrency):
    """Recovery moves an episode onto the other actor, dead too but not yet found: it moves again (no raw
    ActorDiedError)."""
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=4), GREEDY, k=2,
                          concurrency=concurrency).run(range(3))
    out = tmp_path / "e.jsonl"
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 4}, workers=2, envs_per_worker=2) as pool:
        saboteur = Saboteur(tiny_chat_policy, pool, at={2: "all", 5: "all"})
        RolloutRunner(saboteur, pool, GREEDY, k=2, concurrency=concurrency).run(range(3), out)
        assert len(saboteur.hit) == 4 and pool.replaced == 4 and len(pool.deaths.record) == 4
    written = read_episodes(out, strict=True).episodes
    assert len(written) == 6 and by_id(written) == by_id(local)
    replays = [r for e in written for r in e.meta["ray"].get("replays", [])]
    assert replays and all(r["replay_differs"] == [] for r in replays)


def test_a_frozen_actor_misses_its_deadline_is_killed_and_its_episodes_replayed(tiny_chat_policy, tmp_path, caplog):
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=4), GREEDY, k=2, concurrency=4).run(range(2))
    out = tmp_path / "e.jsonl"
    with caplog.at_level(logging.WARNING, logger="turngym.ray"):
        with RayEnvPool("turngym/Calculator-v0", {"max_turns": 4}, workers=2, envs_per_worker=2, step_budget_s=1.0,
                        deadline_slack_s=4.0) as pool:
            saboteur = Saboteur(tiny_chat_policy, pool, at={2: "one"}, sig=signal.SIGSTOP)
            RolloutRunner(saboteur, pool, GREEDY, k=2, concurrency=4).run(range(2), out)
            [frozen] = saboteur.hit
            assert not frozen.alive and pool.replaced >= 1
            assert pool.deaths.record[0].cause.startswith("missed its deadline")
    said = [r.getMessage() for r in caplog.records if "missed its deadline" in r.getMessage()]
    assert len(said) == 1 and f"pid {frozen.pid}" in said[0]  # said once, though two episodes waited on it
    written = read_episodes(out, strict=True).episodes
    assert by_id(written) == by_id(local)
    assert any(r["reason"].startswith("missed its deadline") for e in written for r in e.meta["ray"].get("replays", []))
    deadline = time.monotonic() + 20  # killed through Ray, though stopped: its process is gone
    while time.monotonic() < deadline and os.path.exists(f"/proc/{frozen.pid}"):
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{frozen.pid}") or open(f"/proc/{frozen.pid}/stat").read().split()[2] == "Z"


class FakeLockInfoCalculator(CalculatorEnv):
    """A fake (test only): the real calculator whose step info holds a lock (which cannot be pickled)."""

    def _info(self):
        return {**super()._info(), "lock": threading.Lock()}


def test_an_unpicklable_info_value_stays_with_its_episode_and_the_episodes_equal_in_process(tiny_chat_policy):
    local = RolloutRunner(tiny_chat_policy, lambda: FakeLockInfoCalculator(max_turns=3), GREEDY, k=2,
                          concurrency=4).run(range(4))
    with RayEnvPool(FakeLockInfoCalculator, {"max_turns": 3}, workers=2, envs_per_worker=3) as pool:
        remote = RolloutRunner(tiny_chat_policy, pool, GREEDY, k=2, concurrency=4).run(range(4))
        env = pool()
        _, info = env.reset(seed=0, options={"index": 0})
        assert info["lock"] == "<not picklable: lock>"
    assert len(remote) == 8 and by_id(remote) == by_id(local)
    assert all(e.meta["ray"]["unpicklable_info"] == ["lock"] for e in remote)


class FakeUnpicklableError(Exception):
    def __init__(self, lock):
        super().__init__("the backend's lock is held")
        self.lock = lock


class FakeRaisingCalculator(CalculatorEnv):
    """A fake (test only): the real calculator whose step raises an exception that cannot be pickled."""

    def step(self, action):
        if "raise" in action:
            raise FakeUnpicklableError(threading.Lock())
        return super().step(action)


def test_an_unpicklable_exception_arrives_named_for_its_env_only():
    with RayEnvPool(FakeRaisingCalculator, {"max_turns": 3}, workers=1, envs_per_worker=2) as pool:
        bad, good = pool(), pool()
        for env in (bad, good):
            env.submit_reset(seed=0, options={"index": 0})
        for env in (bad, good):
            env.reset(seed=0, options={"index": 0})
        bad.submit_step("<calc>raise</calc>")
        good.submit_step("<calc>2 * 3</calc>")  # in the same message to the actor
        with pytest.raises(EnvCallError, match="FakeUnpicklableError: the backend's lock is held"):
            bad.step("<calc>raise</calc>")
        obs, *_ = good.step("<calc>2 * 3</calc>")
        assert "6" in obs and pool.replaced == 0


class FakeBrokenItemCalculator(CalculatorEnv):
    """A fake (test only): the real calculator whose step raises on item 1's second turn, an exception that
    cannot be pickled (``unpicklable``) or a plain one, whatever the policy wrote."""

    def __init__(self, unpicklable: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.unpicklable = unpicklable

    def step(self, action):
        ep = self.episode
        if ep is not None and ep.task.get("index") == 1 and len(ep.turns) == 1:
            raise FakeUnpicklableError(threading.Lock()) if self.unpicklable else ValueError("item 1 breaks its env")
        return super().step(action)


@pytest.mark.parametrize("unpicklable", [True, False], ids=["unpicklable", "plain"])
def test_an_env_whose_step_raises_ends_that_episode_with_its_error_record_in_process_and_under_ray(
        tiny_chat_policy, tmp_path, unpicklable):
    kwargs = {"unpicklable": unpicklable, "max_turns": 3}
    local = RolloutRunner(tiny_chat_policy, lambda: FakeBrokenItemCalculator(**kwargs), GREEDY, k=2,
                          concurrency=4).run(range(3), tmp_path / "local.jsonl")
    with RayEnvPool(FakeBrokenItemCalculator, kwargs, workers=2, envs_per_worker=3) as pool:
        remote = RolloutRunner(tiny_chat_policy, pool, GREEDY, k=2, concurrency=4).run(range(3), tmp_path / "ray.jsonl")
        assert pool.replaced == 0  # an env that raised is not a lost actor
    assert len(remote) == 6 and by_id(remote) == by_id(local)  # the same episodes end the same way
    kind = "FakeUnpicklableError" if unpicklable else "ValueError"
    for ep in read_episodes(tmp_path / "ray.jsonl", strict=True).episodes:
        errors = [t.metrics["env_error"] for t in ep.turns if "env_error" in t.metrics]
        if ep.task["index"] == 1:  # that episode's error record: its second turn, then ended and graded
            assert [e["type"] for e in errors] == [kind] and len(ep.turns) == 2
            assert ep.truncated and ep.meta["truncation"] == "env_error" and ep.outcome is not None
            assert "test_ray_faults.py" in errors[0]["where"]  # where it raised, taken on the worker
        else:
            assert errors == [] and len(ep.turns) >= 1


class FakeExitingCalculator(CalculatorEnv):
    """A fake (test only): the real calculator whose tool ends its process on one action, as a hostile cell could."""

    def act(self, action):
        if "exit" in action:
            os._exit(3)
        return super().act(action)


def test_an_env_that_kills_its_process_is_that_episodes_error_record(caplog):
    with caplog.at_level(logging.WARNING, logger="turngym.ray"):
        with RayEnvPool(FakeExitingCalculator, {"max_turns": 4}, workers=2, envs_per_worker=1) as pool:
            poisoned, other = pool(), pool()
            poisoned.reset(seed=0, options={"index": 0, "episode_id": "calc#poison"})
            other.reset(seed=0, options={"index": 1})
            poisoned.step("<calc>2 * 3</calc>")
            obs, reward, terminated, truncated, info = poisoned.step("<calc>exit</calc>")
            other.step("<calc>2 * 3</calc>")
            assert len(pool.live_workers()) == 2
    ep = poisoned.episode
    assert (obs, reward, terminated, truncated) == ("", 0.0, False, True)
    assert ep.truncated and ep.meta["truncation"] == "env_process_died" and len(ep.turns) == 2
    assert ep.turns[1].action == "<calc>exit</calc>" and ep.turns[1].metrics["env_error"]["type"] == "WorkerDied"
    assert ep.turns[0].observation and ep.meta["ray"]["error"]["episode"] == "calc#poison"
    assert "outcome" in info or ep.outcome  # graded on the turns it played
    said = [r.getMessage() for r in caplog.records if "calc#poison" in r.getMessage()]
    assert len(said) == 1 and "the run goes on" in said[0]
    assert len(other.episode.turns) == 1 and other.episode.turns[0].observation


def test_a_chaos_run_loses_nothing_and_writes_nothing_twice(tiny_chat_policy, tmp_path):
    """SIGKILLs at random moments (while actors start, mid-episode, two at once) and one SIGSTOP, on a 2-worker
    pool: every episode written once and equal to the in-process run."""
    rng = random.Random(52)
    tasks = list(range(6))
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=4), GREEDY, k=2, concurrency=4).run(tasks)
    out = tmp_path / "e.jsonl"
    kills = dict.fromkeys(rng.sample(range(2, 14), 4), "one")
    kills[rng.choice([k for k in range(2, 14) if k not in kills])] = "all"
    stop_at = rng.choice([k for k in range(2, 14) if k not in kills])
    with RayEnvPool(FakeDyingCalculator, {"max_turns": 4, "die_dir": tokens(tmp_path, 2)}, workers=2, envs_per_worker=2,
                    step_budget_s=1.0, deadline_slack_s=4.0, restarts=20) as pool:
        killer = Saboteur(tiny_chat_policy, pool, at=kills)
        stopper = Saboteur(killer, pool, at={stop_at: "one"}, sig=signal.SIGSTOP)
        RolloutRunner(stopper, pool, GREEDY, k=2, concurrency=4).run(tasks, out)
        faults = len(killer.hit) + len(stopper.hit) + 2
        assert len(pool.deaths.record) >= faults - 1  # a stopped actor also SIGKILLed counts once
    written = read_episodes(out, strict=True).episodes
    assert len(written) == 12 and len({e.id for e in written}) == 12
    assert by_id(written) == by_id(local)
