"""The one-process main job: one loaded policy runs evals, the ablation and creditbench, and one report links them."""

import json

import pytest

from turngym.evals.mainjob import EnvRun, MainJobConfig, run_main_job


def test_main_job_reuses_one_policy_and_links_every_stage(tiny_chat_policy, tmp_path, monkeypatch):
    from turngym.agents import loading

    def no_second_load(*args, **kwargs):
        raise AssertionError("the main job loaded a model although one was given")

    monkeypatch.setattr(loading, "load_policy", no_second_load)
    monkeypatch.setattr(loading, "load_hf_policy", no_second_load)
    cfg = MainJobConfig(out=tmp_path, model="tiny", scorer="tiny", k=2, temperature=1.0, concurrency=4,
                        rewards=("outcome", "funrl", "siop", "igpo"), bench_groups=2, bench_k=2, bench_envs=("searchqa",),
                        runs=[EnvRun("calculator", "turngym/Calculator-v0", {"max_turns": 2}, 2, 8)])
    job = run_main_job(cfg, policy=tiny_chat_policy)
    assert job.failures == {}
    text = job.report.read_text()
    for link in ("calculator/report.md", "ablation/ablation.md", "creditbench/creditbench.md"):
        assert f"]({link})" in text and (tmp_path / link).is_file()
    job = json.loads((tmp_path / "main_job.json").read_text())
    assert job["models"]["agent"] == {"name": "tiny"}
    assert set(job["times"]) >= {"load_agent_s", "load_scorer_s", "generation_s", "ablation_s", "creditbench_s"}
    bench = json.loads((tmp_path / "creditbench" / "creditbench.json").read_text())
    assert set(bench["envs"]["searchqa"]["rewards"]) == {"outcome", "funrl", "siop", "igpo"}
    assert all("error" not in w for w in bench["envs"]["searchqa"]["rewards"].values())
    # per-stage CPU time next to wall time; siop and igpo shared the planted episodes' longest-prefix forwards
    assert set(job["times"]["cpu_s"]) >= {"load_agent", "generation: calculator", "ablation", "creditbench"}
    assert job["times"]["scorer_forwards"]["prefix_reused"] >= bench["envs"]["searchqa"]["episodes"]
    assert "| stage | wall s | CPU s |" in text and "longest-prefix forwards reused" in text
    # both credit tables show within-episode AUC and the label-free baselines beside the rewards
    assert "within-episode AUC" in text and "*label-free: −(turns remaining)*" in text
    assert "| *label-free: outcome broadcast* |" in text
    assert set(bench["envs"]["searchqa"]["baselines"]) == {"position", "remaining", "outcome"}


def test_eval_over_several_envs_loads_the_model_once(tiny_chat_policy, tmp_path, monkeypatch):
    from turngym.agents import loading
    from turngym.cli import main

    loads = []
    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: loads.append(a) or tiny_chat_policy)
    main(["eval", "--env", "Calculator-v0,Digits-v0", "--limit", "2", "--max-new-tokens", "8", "--max-turns", "2",
          "--out", str(tmp_path)])
    assert len(loads) == 1
    for sub in ("Calculator-v0", "Digits-v0"):
        assert json.loads((tmp_path / sub / "results.json").read_text())["episodes"] == 2


def test_main_job_searchqa_run_forces_the_first_search():
    """The instruct agent never searches unprompted (docs/results.md): the main job opens its first call
    and shows it one worked example."""
    import gymnasium

    import turngym  # noqa: F401
    from turngym.envs.search_qa import FIRST_SEARCH_PREFILL
    from turngym.evals.mainjob import default_runs

    run = next(r for r in default_runs(3) if r.env_id == "turngym/SearchQA-v0")
    assert run.env_kwargs["tool_format"] == "native" and run.env_kwargs["force_first_search"] is True
    assert run.env_kwargs["prompt"] == "one_shot"
    env = gymnasium.make(run.env_id, **run.env_kwargs)
    env.reset(options={"index": 0})
    assert env.unwrapped.reply_prefill() == FIRST_SEARCH_PREFILL["native"]


def test_eval_rewards_scores_the_run_with_reward_options_and_refuses_an_unknown_one(tiny_chat_policy, tmp_path,
                                                                                     monkeypatch):
    """Issue #37 item 9: `eval --rewards` names rewards with options; the run's episodes are scored into
    OUT/ablation (the ablation `turngym ablate` writes); an unknown option is one line before the model loads."""
    from turngym.agents import loading
    from turngym.cli import main

    loads = []
    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: loads.append(a) or tiny_chat_policy)
    base = ["eval", "--env", "Calculator-v0", "--limit", "2", "--k", "2", "--max-new-tokens", "8", "--max-turns", "2"]
    with pytest.raises(SystemExit) as exc:
        main(base + ["--rewards", "funrl", "--reward-arg", "funrl.no_such_option=1", "--out", str(tmp_path / "bad")])
    msg = str(exc.value.code)  # SystemExit's message: Python prints it as the one stderr line, exit status 1
    assert not loads and msg.startswith("error: ") and "\n" not in msg
    assert "no_such_option" in msg and "require_think" in msg
    assert not (tmp_path / "bad" / "episodes.jsonl").exists()

    main(base + ["--rewards", "outcome,funrl[require_think=true]", "--out", str(tmp_path / "ok")])
    assert len(loads) == 1
    summary = json.loads((tmp_path / "ok" / "ablation" / "ablation.json").read_text())
    assert set(summary["rewards"]) == {"outcome", "funrl[require_think=true]"}
