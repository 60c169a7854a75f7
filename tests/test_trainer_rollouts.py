"""Training rollouts saved by a real TurnGRPOTrainer run (tiny model, CPU) round-trip through view, ablate, report."""

import json
import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from turngym.credit.ablate import run_ablation  # noqa: E402
from turngym.episode.reader import read_episodes  # noqa: E402
from turngym.training.rollouts import RolloutSaver  # noqa: E402
from turngym.training.scores import read_scores  # noqa: E402
from turngym.views.report import compare_runs  # noqa: E402
from turngym.views.viewer import build_payload, write_viewer  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three optimizer steps of the turn estimator on Calculator, both items in every batch; rollouts saved every
    2 steps (steps 0 and 2)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.agents.tiny import tiny_model_dir
    from turngym.envs.calculator import CalculatorEnv
    from turngym.rewards import get_reward
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    out = tmp_path_factory.mktemp("train")
    d = str(tiny_model_dir(chat=True))
    torch.manual_seed(0)
    model, tok = AutoModelForCausalLM.from_pretrained(d), AutoTokenizer.from_pretrained(d)
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
                      max_steps=3, logging_steps=1, report_to="none", use_cpu=True, learning_rate=1e-3,
                      save_strategy="no", seed=0, temperature=1.0)
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=2),
                         reward=get_reward("outcome"), args=args, train_dataset=task_dataset(range(2)),
                         estimator="turn", save_rollouts_every=2, base_model="tiny test model")
    captured = []
    original = tr._score_shared

    def spy(everyone, group_size, voters=None):  # what the trainer computed, to compare with what it saved
        rewards, advs = original(everyone, group_size, voters)
        captured.append((tr.state.global_step, [e.id for e in everyone], rewards, advs))
        return rewards, advs

    tr._score_shared = spy
    tr.train()
    tr.save_model()
    return out / "rollouts", captured


def test_saved_rollouts_hold_step_rewards_and_advantages_the_trainer_used(trained):
    folder, captured = trained
    eps = read_episodes(folder / "episodes.jsonl").episodes
    steps = sorted({e.meta["train"]["step"] for e in eps})
    assert steps == [0, 2]  # every 2 steps, from the first
    assert [s for s, *_ in captured] == [0, 1, 2]
    for step, ids, rewards, advs in captured:
        saved = [e for e in eps if e.meta["train"]["step"] == step]
        if step not in steps:
            assert not saved
            continue
        assert [e.id for e in saved] == ids
        for e, r, a in zip(saved, rewards, advs, strict=True):
            assert e.meta["train"]["turn_rewards"] == pytest.approx(r)
            assert e.meta["train"]["advantages"] == pytest.approx(a)
            assert e.meta["train"]["reward"] == "outcome" and e.meta["train"]["estimator"] == "turn"
            assert len(e.turns) == len(r) and e.prompt_ids is not None
    groups = {e.group for e in eps}
    [run] = {e.meta["run"]["id"] for e in eps}  # one training run: its id prefixes every group and episode id
    assert all(g.startswith(f"{run}|") for g in groups) and all(e.id.startswith(f"{run}|") for e in eps)
    assert len(groups) == 4 and {g.split("|")[1].split("-")[0] for g in groups} == {"step0", "step2"}  # per query per step
    assert {e.meta["task_key"].split("@")[0] for e in eps} == {"0", "1"}  # the same two items at both steps (@slot)
    scores = read_scores(folder / "scores.jsonl")
    assert {s.episode_id for s in scores} == {e.id for e in eps}


def test_rollouts_round_trip_through_view_ablate_and_report(trained, tmp_path):
    folder, _ = trained
    html = write_viewer(folder / "episodes.jsonl", tmp_path / "view.html", scores_path=folder / "scores.jsonl")
    assert html.stat().st_size > 0
    eps = read_episodes(folder / "episodes.jsonl").episodes
    payload = build_payload(eps, read_scores(folder / "scores.jsonl"), "rollouts")
    assert payload["rewards"] == ["outcome"] and payload["estimators"] == ["turn"]
    assert [row["step"] for row in payload["eps"]] == [e.meta["train"]["step"] for e in eps]
    first = payload["eps"][0]
    assert payload["queries"][first["qk"]] == f"{eps[0].env_id}|{eps[0].meta['task_key'].split('@')[0]}"
    assert len(payload["queries"]) == 2  # one item followed across steps whatever its batch slot

    summary = run_ablation(folder / "episodes.jsonl", ["outcome", "ttrl"], tmp_path / "abl")
    assert set(summary["rewards"]) == {"outcome", "ttrl"} and not summary["errors"]

    steps = sorted(folder.glob("step-*"))
    assert [p.name for p in steps] == ["step-000000", "step-000002"]
    r0 = json.loads((steps[0] / "results.json").read_text())
    assert r0["episodes"] == 8 and r0["subset"]["train_step"] == 0 and "accuracy" in r0["metrics"]
    report = compare_runs(steps, tmp_path / "steps.md").read_text()
    assert "| step-000000 |" in report and "| step-000002 |" in report


def test_saver_refuses_bad_settings_and_mismatched_rows(tmp_path):
    with pytest.raises(ValueError, match="rollouts.every"):
        RolloutSaver(tmp_path, -1, "outcome", "turn")
    saver = RolloutSaver(tmp_path, 3, "outcome", "turn")
    assert saver.due(0) and not RolloutSaver(tmp_path, 0, "outcome", "turn").due(0)
    saver.last_step = 0
    assert not saver.due(2) and saver.due(3) and saver.due(4)  # a generation serving several steps may skip 3
    from turngym.episode import Episode, Turn

    ep = Episode(id="e", env_id="x", turns=[Turn(index=0, action="a")])
    with pytest.raises(ValueError, match="1 turns, 2 rewards"):
        saver.save(0, [ep], [[1.0, 0.0]], [[0.0]], k=1)
    assert not (tmp_path / "episodes.jsonl").exists()  # nothing half-written


def test_model_card_names_what_was_trained(trained):
    folder, _ = trained
    card = (folder.parent / "README.md").read_text()
    assert "[None]" not in card and "huggingface.co/None" not in card
    assert "Trained from **tiny test model**" in card and "`turngym/Calculator-v0`" in card
    assert "| reward | `outcome` |" in card and "`turn` (gamma 1.0)" in card and "| optimizer steps | 3 of 3 |" in card
    assert "every 2 steps" in card
