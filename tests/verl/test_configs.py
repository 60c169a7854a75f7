"""configs/verl/ composes with verl's own ppo_trainer.yaml (as ``main_ppo --config-path configs/verl`` composes it),
carries the official SIOP launcher's settings, and names only estimators and loops turngym registers."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "verl"


def compose(name: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return hydra_compose(name, overrides=["actor_rollout_ref.model.path=some/model"])


def test_the_official_settings_and_the_recommended_variant():
    from turngym.integrations.verl import check_estimator

    official, recommended = compose("siop_searchqa"), compose("siop_searchqa_recommended")
    # dl-m9/SIOP train_siop.sh: batch, group, KL, turns, lengths, gamma, SIOP's lambda / eta / references
    assert (official.data.train_batch_size, official.actor_rollout_ref.rollout.n) == (128, 4)
    assert (official.data.max_prompt_length, official.data.max_response_length) == (1024, 2048)
    actor = official.actor_rollout_ref.actor
    assert (actor.ppo_mini_batch_size, actor.kl_loss_coef, actor.kl_loss_type) == (32, 0.005, "low_var_kl")
    assert actor.use_kl_loss is True
    assert actor.optim.lr == 1e-6  # train_siop.sh sets none: verl's default
    assert official.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5
    assert official.algorithm.gamma == 1.0 and official.algorithm.adv_estimator == "turngym_turn"
    kw = official.turngym.reward_kwargs
    assert (official.turngym.reward, kw.lam, kw.eta, kw.n_ref) == ("siop", 0.5, 1.0, 3)
    assert (kw.scorer.model, kw.scorer.method) == ("some/model", "naive")
    assert official.turngym.env_kwargs.topk == 3 and official.turngym.env_kwargs.tool_format == "native"
    assert recommended.turngym.reward == "siop[prefix=after_observation]"
    assert recommended.algorithm.adv_estimator == "turngym_turn_loo"
    assert recommended.data.train_batch_size == 128  # everything else is the official file's
    for cfg in (official, recommended):
        check_estimator(cfg.algorithm.adv_estimator)
        agent = cfg.actor_rollout_ref.rollout.agent
        assert agent.default_agent_loop == "turngym" and cfg.trainer.use_v1 is False
        assert agent.agent_loop_manager_class == "turngym.integrations.verl.rewards.TurngymAgentLoopManager"


def test_the_agent_loop_entry_names_the_registered_loop():
    from omegaconf import OmegaConf

    import turngym.integrations.verl as tv

    (entry,) = OmegaConf.load(CONFIGS / "agent_loops.yaml")
    assert entry.name == "turngym" and entry._target_ == f"{tv.TurngymAgentLoop.__module__}.TurngymAgentLoop"


def test_data_rows_are_what_verls_dataset_reads(tmp_path):
    from turngym.integrations.verl.data import main

    out = tmp_path / "calc.parquet"
    main(["--env", "Calculator-v0", "--items", "3:5", "--out", str(out)])
    import datasets

    rows = datasets.Dataset.from_parquet(str(out)).to_list()
    assert [r["extra_info"]["index"] for r in rows] == [3, 4] and rows[0]["agent_name"] == "turngym"
    assert rows[0]["prompt"][-1]["content"].startswith("What is")
    with pytest.raises(ValueError, match="unknown env"):
        main(["--env", "Nope-v0", "--out", str(tmp_path / "x.parquet")])
