"""Envs on a real Ray actor pool (turngym.run.backends.ray_pool) behind the rollout runner: the same episodes as
in process, the back-pressure bound, a worker SIGKILLed mid-episode (replayed, nothing lost or written twice),
an env that cannot be built on a worker, an unreachable cluster, and a tool that raises on a worker.

One single-node Ray session (``ray.init(num_cpus=2)``) is shared by the whole module: Ray starts slowly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from turngym.episode import played_content

ray = pytest.importorskip("ray")

from turngym.agents.env_handle import EnvFactory  # noqa: E402
from turngym.agents.policy import PolicyBase, SamplingParams  # noqa: E402
from turngym.agents.runner import RolloutRunner  # noqa: E402
from turngym.agents.tiny import tiny_model_dir  # noqa: E402
from turngym.envs.calculator import CalculatorEnv  # noqa: E402
from turngym.episode.reader import read_episodes  # noqa: E402
from turngym.run.backends.ray_pool import RayEnvPool, RayPoolError, init_ray  # noqa: E402

CLI = [sys.executable, "-m", "turngym.cli"]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    init_ray(num_cpus=2, resources={"env_node": 4}, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def by_id(episodes):
    return {e.id: played_content(e) for e in episodes}


def within_run(episodes):
    """Episodes of one CLI run by their id within it, without the run's identity (each run draws its own)."""
    out = {}
    for e in episodes:
        run = e.meta["run"]["id"]
        d = played_content(e)
        d.pop("meta")["run"]
        d["id"], d["group"] = e.id.removeprefix(f"{run}|"), e.group.removeprefix(f"{run}|")
        out[d["id"]] = d
    return out


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_pool_plays_the_same_episodes_as_in_process_at_temperature_0(tiny_chat_policy, tmp_path, batching):
    tasks = [0, 1, 2]
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), GREEDY, k=2, concurrency=4,
                          batching=batching).run(tasks)
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 3}, workers=2, envs_per_worker=2) as pool:
        remote = RolloutRunner(tiny_chat_policy, pool, GREEDY, k=2, concurrency=4, batching=batching).run(
            tasks, tmp_path / "e.jsonl")
        assert {s["pid"] for s in pool.stats()} == {w.pid for w in pool.live_workers()}
    assert len(remote) == 6 and by_id(remote) == by_id(local)
    assert all(e.meta["ray"]["worker"].startswith("worker ") and "replays" not in e.meta["ray"] for e in remote)
    assert all(t.action_ids and t.observation_ids is not None for e in remote for t in e.turns[:-1])
    assert by_id(read_episodes(tmp_path / "e.jsonl").episodes) == by_id(local)


def test_never_more_live_episodes_than_slots(tiny_chat_policy):
    made = []
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 2}, workers=2, envs_per_worker=2) as pool:
        class Recording(EnvFactory):  # the pool's envs, counted; its slots declared
            slots = pool.slots

            def __call__(self):
                made.append(pool())
                return made[-1]

        runner = RolloutRunner(tiny_chat_policy, Recording(), GREEDY, k=3, concurrency=64)
        assert runner.concurrency == 4
        eps = runner.run(range(5))
        peaks = [s["peak"] for s in pool.stats()]
        assert len(eps) == 15 and len(made) <= 4
        assert sum(peaks) <= 4 and max(peaks) <= 2 and all(s["live"] == 0 for s in pool.stats())
        envs = made + [pool() for _ in range(pool.slots - len(made))]
        with pytest.raises(RayPoolError, match="all 4 env slots"):
            pool()
        envs[0].close()
        pool()  # a released slot is handed out again


class KillingPolicy(PolicyBase):
    """Wraps a real policy; before chosen generate calls it SIGKILLs a pool worker's process (mid-episode:
    the episodes on that worker have turns played and are waiting for their next action)."""

    def __init__(self, policy, pool, kill_at):
        self.policy, self.pool, self.kill_at, self.calls, self.killed = policy, pool, set(kill_at), 0, []
        self.tokenizer, self.name = policy.tokenizer, policy.name
        self.max_context = policy.max_context

    def generate(self, requests, sampling):
        self.calls += 1
        if self.calls in self.kill_at:
            victim = self.pool.live_workers()[0]
            os.kill(victim.pid, signal.SIGKILL)
            self.killed.append(victim)
        return self.policy.generate(requests, sampling)


def test_a_worker_killed_mid_episode_loses_nothing_and_writes_nothing_twice(tiny_chat_policy, tmp_path):
    tasks = list(range(6))
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=4), GREEDY, k=2, concurrency=6).run(tasks)
    out = tmp_path / "e.jsonl"
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 4}, workers=2, envs_per_worker=3) as pool:
        policy = KillingPolicy(tiny_chat_policy, pool, kill_at={2, 5})
        RolloutRunner(policy, pool, GREEDY, k=2, concurrency=6).run(tasks, out)
        assert len(policy.killed) == 2 and pool.replaced == 2
        live = pool.live_workers()
        assert len(live) == 2 and not any(w in live for w in policy.killed)  # a dead actor is never handed out again
        assert all(not w.alive for w in policy.killed)
    written = read_episodes(out, strict=True).episodes
    assert len(written) == 12 and len({e.id for e in written}) == 12  # none lost, none twice
    assert by_id(written) == by_id(local)  # replayed episodes are the episodes
    replays = [r for e in written for r in e.meta["ray"].get("replays", [])]
    assert any(r["after_turns"] >= 1 for r in replays) and all(r["replay_differs"] == [] for r in replays)
    assert {r["lost"] for r in replays} <= {w.name for w in policy.killed}


def test_an_env_that_cannot_be_built_on_a_worker_is_one_message():
    with pytest.raises(RayPoolError) as err:
        RayEnvPool("turngym/Calculator-v0", {"no_such_argument": 1}, workers=1, envs_per_worker=1)
    text = str(err.value)
    assert "turngym/Calculator-v0 cannot be built on Ray worker 0" in text and "no_such_argument" in text
    assert "\n" not in text


def test_more_workers_than_the_cluster_can_place_is_one_message_and_leaves_no_actor():
    total = ray.cluster_resources()["CPU"]  # 2: the module's ray.init
    with pytest.raises(RayPoolError) as err:
        RayEnvPool("turngym/Calculator-v0", {}, workers=3, envs_per_worker=1, startup_s=5)
    assert "did not start within 5 s" in str(err.value) and "CPU free" in str(err.value)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == total  # the two placed actors were killed


def test_actors_are_placed_by_the_resources_they_ask_for():
    """Each actor asks for its CPU, no GPU, and the custom resources given (a node label such as env_node)."""
    with RayEnvPool("turngym/Calculator-v0", {}, workers=2, envs_per_worker=1, num_cpus=0.5,
                    resources={"env_node": 1.5}) as pool:
        held = ray.available_resources()
        assert held.get("env_node", 0.0) == 1.0 and held.get("CPU", 0.0) == 1.0 and "GPU" not in held
        assert len(pool.live_workers()) == 2
    with pytest.raises(RayPoolError, match="did not start within 3 s; each worker asks for 1 CPU and"):
        RayEnvPool("turngym/Calculator-v0", {}, workers=1, envs_per_worker=1, resources={"gpu_node": 1}, startup_s=3)


class FakeRaisingCalculator(CalculatorEnv):
    """A fake (test only): the real calculator whose tool raises on one action, as a buggy backend would."""

    def act(self, action):
        if "explode" in action:
            raise ConnectionError("backend went away")
        return super().act(action)


def test_a_tool_that_raises_on_a_worker_leaves_turns_rewards_and_truth_aligned():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import this test module
    with RayEnvPool(FakeRaisingCalculator, {"max_turns": 3}, workers=1, envs_per_worker=1) as pool:
        env = pool()
        env.reset(seed=0, options={"index": 0})
        obs, reward, *_ = env.step("<calc>explode</calc>")
        assert "ConnectionError" in obs and reward == 0.0
        env.step("<calc>2 * 3</calc>")
        _, reward, terminated, *_ = env.step("<answer>5343</answer>")
    ep = env.episode
    assert terminated and reward == 1.0 and ep.outcome["correct"] is True
    assert [t.index for t in ep.turns] == [0, 1, 2] and [t.reward for t in ep.turns] == [0.0, 0.0, 1.0]
    assert ep.turns[0].metrics["env_error"]["type"] == "ConnectionError" and "env_error" not in ep.turns[1].metrics
    here = FakeRaisingCalculator(max_turns=3)
    here.reset(seed=0, options={"index": 0})
    for a in ("<calc>explode</calc>", "<calc>2 * 3</calc>", "<answer>5343</answer>"):
        here.step(a)
    assert [(t.observation, t.reward, t.truth) for t in ep.turns] == \
        [(t.observation, t.reward, t.truth) for t in here.unwrapped.episode.turns]


def test_an_unreachable_address_is_one_line_before_the_model_loads(tmp_path):
    with pytest.raises(RayPoolError, match="cannot reach the Ray cluster at 127.0.0.1:1: "):
        from turngym.run.backends.ray_pool import _reachable

        _reachable("127.0.0.1:1")
    proc = subprocess.run(CLI + ["eval", "--env", "Calculator-v0", "--limit", "1", "--model", str(tiny_model_dir(chat=True)),
                                 "--ray", "127.0.0.1:1", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot reach the Ray cluster at 127.0.0.1:1: "), proc.stderr
    assert "loading model" not in proc.stderr
    main_job = subprocess.run(CLI + ["main-job", "--ray", "127.0.0.1:1", "--out", str(tmp_path / "mj")],
                              capture_output=True, text=True, timeout=120)
    assert main_job.returncode == 1 and "loading agent" not in main_job.stdout
    assert main_job.stderr.strip().splitlines()[-1].startswith("error: cannot reach the Ray cluster at 127.0.0.1:1: ")


def test_ray_missing_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    from turngym.run.pipeline import PipelineError, RunSpec, validate

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(PipelineError) as err:
        validate(RunSpec(env_id="turngym/Calculator-v0", ray="auto"))
    assert "pip install 'turngym[ray]'" in str(err.value) and "\n" not in str(err.value)


def test_the_restart_budget_and_step_budget_reach_the_pool_and_bad_ones_are_one_line():
    from turngym.run.pipeline import PipelineError, RunSpec, ray_pool, validate

    for field, value, said in (("ray_restarts", -1, "--ray-restarts must be >= 0, got -1"),
                               ("step_budget_s", 0.0, "--step-budget-s must be > 0 seconds, got 0.0")):
        with pytest.raises(PipelineError, match=said):
            validate(RunSpec(env_id="turngym/Calculator-v0", ray="auto", **{field: value}))
    spec = RunSpec(env_id="turngym/Calculator-v0", ray="auto", env_workers=1, ray_restarts=3, step_budget_s=4.0)
    pool, env = ray_pool(spec, {"max_turns": 2})
    try:
        assert pool.deaths.budget == 3 and pool.deadline_s() == 4.0 + pool.deadline_slack_s
        env.close()
    finally:
        pool.shutdown()


def test_the_command_line_takes_the_restart_and_step_budgets():
    from turngym.cli import build_parser
    from turngym.cli._common import ray_fields

    args = build_parser().parse_args(["eval", "--env", "Calculator-v0", "--ray", "auto", "--ray-restarts", "0",
                                      "--step-budget-s", "7.5", "--out", "x"])
    assert ray_fields(args) == {"ray": "auto", "env_workers": 2, "envs_per_worker": None, "ray_restarts": 0,
                                "step_budget_s": 7.5}


def test_the_ray_pool_fields_are_declared_once_and_every_carrier_has_them():
    """``RAY_POOL_FIELDS`` names what the command line, the main job and the run spec hand each other."""
    from dataclasses import fields
    from pathlib import Path

    from turngym.evals.mainjob import MainJobConfig
    from turngym.run.pipeline import RAY_POOL_FIELDS, RunSpec

    assert set(RAY_POOL_FIELDS) <= {f.name for f in fields(RunSpec)}
    assert set(RAY_POOL_FIELDS) <= {f.name for f in fields(MainJobConfig)}
    cfg = MainJobConfig(out=Path("x"), ray="auto", env_workers=3, ray_restarts=1, step_budget_s=2.0)
    spec = RunSpec(env_id="turngym/Calculator-v0", **cfg.ray_fields())
    assert (spec.ray, spec.env_workers, spec.envs_per_worker, spec.ray_restarts, spec.step_budget_s) == ("auto", 3, None, 1, 2.0)


def test_a_stale_recorded_head_is_one_line_within_seconds(tmp_path):
    """A head that died without ``ray stop`` leaves its address in Ray's temp folder, which ``ray.init()`` joins:
    ``--ray auto`` says so in one line instead of Ray's silent retries."""
    import socket

    with socket.socket() as s:  # a port nobody listens on: the dead head
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(dead)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path)
    start = time.monotonic()
    proc = subprocess.run(CLI + ["eval", "--env", "Calculator-v0", "--limit", "1", "--model", str(tiny_model_dir(chat=True)),
                                 "--ray", "auto", "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert f"the last Ray head started on this machine, {dead}" in lines[0] and "ray stop" in lines[0]
    assert took < 60, took


def test_eval_through_the_pool_from_the_command_line(tmp_path):
    """``turngym eval --ray auto`` in a fresh process: it starts a local Ray, plays through the pool and writes
    the same episodes as the in-process eval."""
    args = ["eval", "--env", "Calculator-v0", "--limit", "3", "--max-turns", "2", "--max-new-tokens", "6",
            "--model", str(tiny_model_dir(chat=True))]
    plain = subprocess.run(CLI + args + ["--out", str(tmp_path / "plain")], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    pooled = subprocess.run(CLI + args + ["--out", str(tmp_path / "pool"), "--ray", "auto", "--env-workers", "1"],
                            capture_output=True, text=True, timeout=300)
    assert pooled.returncode == 0, pooled.stderr
    a = read_episodes(tmp_path / "plain" / "episodes.jsonl").episodes
    b = read_episodes(tmp_path / "pool" / "episodes.jsonl").episodes
    assert len(b) == 3 and all(e.meta["ray"]["worker"] == "worker 0" for e in b)
    assert within_run(a) == within_run(b)  # two runs: the same episodes under each run's own id


def test_model_free_rewards_score_on_pool_workers_as_in_process(tiny_chat_policy):
    from turngym.episode import group_episodes
    from turngym.rewards import get_reward

    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1)
    eps = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), sampling, k=3, concurrency=6).run(range(3))
    groups = [list(g) for g in group_episodes(eps)]
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 3}, workers=2, envs_per_worker=1) as pool:
        for reward in ("outcome", "ttrl", "empo", "funrl"):
            remote = pool.score(reward, groups)
            here = [get_reward(reward).score_group(g) for g in groups]
            assert [s.rewards for s in remote] == [s.rewards for s in here] and len(remote) == 3, reward


def test_a_training_step_plays_its_rollouts_on_the_pool(tmp_path):
    """The trainer's rollouts through the pool (``rollout_envs``): real TRL generation on a tiny model."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.rewards import get_reward
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    d = str(tiny_model_dir(chat=True))
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16, max_steps=1, logging_steps=1, report_to="none", use_cpu=True,
                      save_strategy="no", seed=0)
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 2}, workers=2, envs_per_worker=2) as pool:
        tr = TurnGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(d), processing_class=AutoTokenizer.from_pretrained(d),
                             env_factory=lambda: CalculatorEnv(max_turns=2), rollout_envs=pool,
                             reward=get_reward("outcome"), args=args, train_dataset=task_dataset(range(4)))
        tr.train()
    assert tr.state.global_step == 1 and len(tr._batch_episodes) == 4
    assert all(e.meta["ray"]["worker"].startswith("worker ") and e.prompt_ids for e in tr._batch_episodes)


def test_the_train_config_takes_a_ray_section_and_refuses_unknown_keys(tmp_path):
    import yaml

    from turngym.training.config import TrainConfig

    path = tmp_path / "run.yaml"
    base = {"env": {"id": "turngym/Calculator-v0"}, "trl": {"output_dir": str(tmp_path)}}
    path.write_text(yaml.safe_dump({**base, "ray": {"address": "auto", "workers": 4, "envs_per_worker": 16}}))
    assert TrainConfig.load(path).ray == {"address": "auto", "workers": 4, "envs_per_worker": 16}
    path.write_text(yaml.safe_dump({**base, "ray": {"nodes": 2}}))
    with pytest.raises(ValueError, match=r"unknown key ray.nodes; allowed: \['address', 'envs_per_worker', 'restarts', "
                                         r"'step_budget_s', 'workers'\]"):
        TrainConfig.load(path)
    path.write_text(yaml.safe_dump({**base, "ray": {"restarts": 0, "step_budget_s": 2.5}}))
    assert TrainConfig.load(path).ray == {"restarts": 0, "step_budget_s": 2.5}
    path.write_text(yaml.safe_dump({**base, "ray": "auto"}))
    assert TrainConfig.load(path).ray == {"address": "auto"}
    for bad, said in (({"workers": 0}, "ray.workers must be a whole number >= 1, got 0"),
                      ({"address": "127.0.0.1"}, "ray.address must be 'auto', HOST:PORT or ray://HOST:PORT"),
                      ({"restarts": -1}, "ray.restarts must be a whole number >= 0, got -1"),
                      ({"step_budget_s": 0}, "ray.step_budget_s must be a number of seconds > 0, got 0"),
                      (["auto"], "'ray' must be a mapping")):
        path.write_text(yaml.safe_dump({**base, "ray": bad}))
        with pytest.raises(ValueError, match=said):
            TrainConfig.load(path)


def test_the_ray_section_is_checked_after_the_overrides_and_before_the_model_loads(tmp_path):
    """``ray.worker=5`` on the command line (a misspelt key) and an address that is not a cluster: one line each,
    before TRL, transformers or the model load."""
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"env": {"id": "turngym/Calculator-v0"}, "trl": {"output_dir": str(tmp_path)},
                                    "ray": {"workers": 1}}))
    for override, said in (("ray.worker=5", "error: unknown key ray.worker; allowed: "),
                           ("ray.address=127.0.0.1:1", "error: cannot reach the Ray cluster at 127.0.0.1:1: ")):
        proc = subprocess.run(CLI + ["train", "--config", str(path), override], capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(said), proc.stderr
        assert "importing TRL" not in proc.stderr and "loading the model" not in proc.stderr


def test_branches_restored_on_the_pool_equal_those_restored_in_process(tiny_chat_policy):
    """The Monte-Carlo oracle's continuations (``RolloutTask.branch``: reset, replay, reseed) through the pool."""
    from turngym.agents.branching import branch_tasks

    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    eps = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), sampling, k=1, concurrency=2).run([0, 1])
    tasks = branch_tasks(eps, 1)
    local = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=3), GREEDY, concurrency=4).run(tasks)
    with RayEnvPool("turngym/Calculator-v0", {"max_turns": 3}, workers=2, envs_per_worker=2) as pool:
        remote = RolloutRunner(tiny_chat_policy, pool, GREEDY, concurrency=4).run(tasks)
    assert len(remote) == len(tasks) and by_id(remote) == by_id(local)
    assert all(e.meta["branch"]["replay_differs"] == [] for e in remote)
