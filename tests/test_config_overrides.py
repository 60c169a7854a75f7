"""`turngym train` command-line overrides of the YAML config: parsing and errors only (no training run)."""

import subprocess
import sys
from pathlib import Path

import pytest

from turngym import cli
from turngym.training import config as train_config
from turngym.training.config import TrainConfig
from turngym.training.overrides import OverrideError, apply_overrides, parse_overrides

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "train_calculator.yaml"


def _cfg(*tokens: str) -> TrainConfig:
    cfg = TrainConfig.load(CONFIG)
    apply_overrides(cfg, parse_overrides(tokens))
    return cfg


def test_dotted_overrides_reach_every_section_with_json_values():
    base = TrainConfig.load(CONFIG)
    cfg = _cfg("trl.learning_rate=1e-6", "reward.name=siop", "reward.scorer=policy", "env.kwargs.max_turns=5",
               "estimator.gamma=0.9", "peft.r=8", "max_episode_tokens=512", 'stop=["</answer>"]', "trl.run_name=a=b")
    assert cfg.trl["learning_rate"] == 1e-6 and isinstance(cfg.trl["learning_rate"], float)
    assert cfg.reward == {"name": "siop", "scorer": "policy"}
    assert cfg.env == {"id": base.env["id"], "kwargs": {**base.env.get("kwargs", {}), "max_turns": 5}}
    assert cfg.estimator["gamma"] == 0.9 and cfg.peft == {"r": 8}
    assert cfg.max_episode_tokens == 512 and cfg.stop == ["</answer>"]
    assert cfg.trl["run_name"] == "a=b"  # only the first '=' splits; a non-JSON value stays a string
    untouched = {k: v for k, v in base.trl.items() if k not in ("learning_rate", "run_name")}
    assert {k: v for k, v in cfg.trl.items() if k not in ("learning_rate", "run_name")} == untouched  # nothing else moved


def test_trl_flags_are_parsed_by_trls_parser_and_win_over_dotted_ones():
    cfg = _cfg("trl.max_steps=3", "--max_steps", "7", "--lr_scheduler_type=cosine", "--bf16", "false",
               "--max_grad_norm", "-1", "--no_shuffle_dataset", "--report_to", "none")
    assert cfg.trl["max_steps"] == 7 and isinstance(cfg.trl["max_steps"], int)  # typed by GRPOConfig's field
    assert cfg.trl["lr_scheduler_type"] == "cosine" and cfg.trl["bf16"] is False
    assert cfg.trl["max_grad_norm"] == -1.0 and cfg.trl["shuffle_dataset"] is False


@pytest.mark.parametrize("tokens, message", [
    (["rewrd.name=siop"], "unknown key 'rewrd'"),
    (["trl.learning_rat=1e-6"], "did you mean learning_rate"),
    (["--learning_rat", "1e-6"], "did you mean --learning_rate"),
    (["--max_steps", "many"], "invalid int value"),
    (["--lr_scheduler_type", "zigzag"], "invalid choice"),
    (["learning_rate"], "must be section.key=value"),
    (["env=3"], "env must be a mapping"),
    (["env.id.x=1"], "env.id is not a mapping"),
])
def test_unknown_or_malformed_overrides_are_one_clear_error(tokens, message):
    with pytest.raises(OverrideError, match=message):
        _cfg(*tokens)


def test_cli_hands_overrides_to_the_trainer_build(monkeypatch):
    seen = []

    def fake_build(cfg, progress=None):  # a fake of build_trainer: this test is about parsing, not training
        seen.append(cfg)
        raise ValueError("stop before training")

    monkeypatch.setattr(train_config, "build_trainer", fake_build)
    with pytest.raises(SystemExit, match="stop before training"):
        cli.main(["train", "--config", str(CONFIG), "reward.name=ttrl", "--learning_rate", "2e-6",
                  "--allow-eval-overlap", "estimator.name=grpo"])
    [cfg] = seen
    assert cfg.reward["name"] == "ttrl" and cfg.estimator["name"] == "grpo"
    assert cfg.trl["learning_rate"] == 2e-6 and cfg.data["eval_overlap"] == "allow"


def test_cli_refuses_unknown_overrides_before_building_anything(monkeypatch):
    monkeypatch.setattr(train_config, "build_trainer", lambda cfg: pytest.fail("built despite a bad override"))
    with pytest.raises(SystemExit, match="unknown key 'rewards'"):
        cli.main(["train", "--config", str(CONFIG), "rewards.name=siop"])
    with pytest.raises(SystemExit):  # other commands take no extra arguments
        cli.main(["report", "a", "--nope"])


def test_train_help_documents_both_override_forms():
    out = subprocess.run([sys.executable, "-m", "turngym", "train", "--help"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert "SECTION.KEY=VALUE" in out and "trl.learning_rate=1e-6" in out and "--learning_rate 1e-6" in out
