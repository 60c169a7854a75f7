"""Recipes in configs/, the shipped subsets, and the train/evaluation overlap refusal."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
import yaml

import turngym  # noqa: F401 - env registration
from turngym.corpora.datasets import BUNDLED, load_dataset
from turngym.corpora.subsets import (
    SEARCHQA_EVAL_DATASETS,
    SEARCHQA_TRAIN_OFFLINE,
    EvalOverlapError,
    SubsetSpec,
    eval_keys,
    eval_subset_name,
    question_key,
    subset_items,
    write_searchqa_subsets,
)
from turngym.training.config import TrainConfig, select_training_indices

ROOT = Path(__file__).parents[1]
RECIPES = sorted((ROOT / "configs").glob("*.yaml"))


def needs_hub(cfg: TrainConfig) -> bool:
    ds = cfg.env.get("kwargs", {}).get("dataset")
    return isinstance(ds, str) and "/" in ds and not ds.startswith("subset:") and not Path(ds).exists() and ds not in BUNDLED


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_loads_and_passes_the_overlap_check(path, lucene_index):
    import dataclasses

    from trl import GRPOConfig

    from turngym.corpora.service import RetrievalServer

    cfg = TrainConfig.load(path)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert not set(cfg.trl) - fields, f"not GRPOConfig arguments: {sorted(set(cfg.trl) - fields)}"
    if needs_hub(cfg) and not os.environ.get("TURNGYM_TEST_HUB"):
        pytest.skip(f"{path.name} trains on a Hugging Face hub dataset; set TURNGYM_TEST_HUB=1 where the hub is reachable")
    kwargs = dict(cfg.env.get("kwargs", {}))
    server = None
    if str(kwargs.get("retriever", "")).startswith("http"):  # the recipe says to serve an index first: one is served
        server = RetrievalServer(lucene_index([{"id": "p", "title": "Paris", "text": "Paris is in France."}]), port=0,
                                 threads=1)
        server.start()
        kwargs["retriever"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        env = gymnasium.make(cfg.env["id"], **kwargs)
        try:
            indices = select_training_indices(cfg, env)
        finally:
            env.close()
    finally:
        if server is not None:
            server.shutdown()
    assert indices
    if cfg.data.get("eval_overlap", "refuse") != "refuse":
        assert "eval_overlap" in path.read_text()  # an override is written in the recipe, never implied


def test_siop_recipes_reproduce_the_launcher_settings():
    """dl-m9/SIOP ``train_siop.sh`` lines 66-107: batch 128, mini-batch 32, response 2,048 after a 1,024-token
    prompt, KL 0.005 (low_var_kl), n = 4, 5 assistant turns, Hermes tool calls, tool output cut at 2,048
    characters keeping the right end, λ 0.5, η 1.0, 3 references, γ 1."""
    for name in ("train_searchqa_siop.yaml", "train_searchqa_siop_offline.yaml"):
        cfg = TrainConfig.load(ROOT / "configs" / name)
        assert cfg.reward == {**cfg.reward, "name": "siop", "lam": 0.5, "eta": 1.0, "n_ref": 3}
        assert cfg.estimator["gamma"] == 1.0 and cfg.trl["num_generations"] == 4
        assert cfg.env["kwargs"]["topk"] == 3 and cfg.trl["learning_rate"] == 1e-6 and cfg.trl["beta"] == 0.005
        kw, trl = cfg.env["kwargs"], cfg.trl
        assert (kw["tool_format"], kw["max_turns"], kw["tool_response_chars"], kw["tool_response_truncate_side"]) == (
            "native", 5, 2048, "right")
        assert trl["max_completion_length"] == 2048 and cfg.max_episode_tokens == 1024 + 2048
        assert trl["lr_scheduler_type"] == "constant" and trl["num_train_epochs"] == 1 and "max_steps" not in trl
        per_step = 8 * trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"]  # 8 GPUs
        per_generation = 8 * trl["per_device_train_batch_size"] * trl["steps_per_generation"]
        assert (per_step, per_generation) == (32 * 4, 128 * 4)  # ppo_mini_batch_size=32, train_batch_size=128
        assert cfg.peft is None  # full fine-tuning
        assert cfg.env["kwargs"]["dataset"] not in ("nq", "hotpotqa")  # never an evaluation file
    offline = TrainConfig.load(ROOT / "configs" / "train_searchqa_siop_offline.yaml")
    assert offline.env["kwargs"]["dataset"] == f"subset:{SEARCHQA_TRAIN_OFFLINE}"


def test_the_recommended_siop_recipe_differs_from_the_official_only_in_its_two_named_choices():
    official = TrainConfig.load(ROOT / "configs" / "train_searchqa_siop.yaml")
    rec = TrainConfig.load(ROOT / "configs" / "train_searchqa_siop_recommended.yaml")
    assert rec.reward == {**official.reward, "prefix": "after_observation"}
    assert (official.estimator["name"], rec.estimator["name"]) == ("turn", "turn_loo")
    assert rec.env == official.env and rec.max_episode_tokens == official.max_episode_tokens
    assert {k: v for k, v in rec.trl.items() if k != "output_dir"} == {k: v for k, v in official.trl.items() if k != "output_dir"}


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_a_recipe_uses_an_unbiased_estimator_unless_its_first_line_says_it_reproduces_official_code(path):
    """Issue #37 item 5: a biased (or unmeasured) estimator appears only in a recipe that reproduces official code."""
    from turngym.rewards.base import reward_class
    from turngym.training.advantages import get_estimator

    cfg = TrainConfig.load(path)
    name = cfg.estimator.get("name") or reward_class(cfg.reward["name"]).estimator
    if get_estimator(name).unbiased is not True:
        assert path.read_text().startswith("# Reproduces "), f"{path.name}: {name} is not declared unbiased"


def test_every_reward_recommends_an_unbiased_estimator():
    """A reward's declared estimator is unbiased; where its official code pairs it with another, that one is
    declared too (official_estimator), and a biased official pairing has a recipe that reproduces it."""
    from turngym.rewards.base import REWARDS, reward_class
    from turngym.training.advantages import get_estimator

    recipes = {p.name: p.read_text() for p in RECIPES}
    for name in REWARDS:
        cls = reward_class(name)
        assert get_estimator(cls.estimator).unbiased is True, (name, cls.estimator)
        if cls.official_estimator is not None:
            get_estimator(cls.official_estimator)  # registered
    siop = reward_class("siop")
    assert (siop.estimator, siop.official_estimator) == ("turn_loo", "turn")
    assert any(text.startswith("# Reproduces the official SIOP launcher") and "name: turn," in text for text in recipes.values())


# ------------------------------------------------------------------ subsets


def test_eval_subsets_are_igpos_items_regenerated_byte_for_byte(tmp_path):
    written = write_searchqa_subsets(tmp_path)
    for path in written:
        shipped = ROOT / "turngym" / "data" / "subsets" / path.name
        assert path.read_bytes() == shipped.read_bytes(), f"{path.name} differs from a fresh draw"
    source = load_dataset("igpo-test")
    for ds in SEARCHQA_EVAL_DATASETS:
        data = load_dataset(f"subset:{eval_subset_name(ds)}")
        assert len(data) == (125 if ds == "bamboogle" else 512)
        assert {source[it["source_index"]]["benchmark"] for it in data.items} == {ds}
        assert data.manifest.item_ids == [it["id"] for it in data.items]
    # where turngym bundles the whole split, IGPO's items are found in it by question
    dev = {question_key(it) for it in load_dataset("hotpotqa").items}
    assert all(question_key(it) in dev for it in load_dataset(f"subset:{eval_subset_name('hotpotqa')}").items)


def test_offline_training_split_is_disjoint_from_every_eval_subset():
    evals = [SubsetSpec.read(eval_subset_name(ds)) for ds in SEARCHQA_EVAL_DATASETS]
    train = load_dataset(f"subset:{SEARCHQA_TRAIN_OFFLINE}")
    keys = eval_keys(evals)
    assert not any(question_key(it) in keys for it in train.items)
    sources = load_dataset("nq").items + load_dataset("hotpotqa").items
    kept = [it for it in sources if question_key(it) not in keys]
    assert len(train) == len(kept) and len(kept) < len(sources)
    assert [it["id"] for it in train.items] == [it["id"] for it in kept]
    assert train.manifest.dataset == SEARCHQA_TRAIN_OFFLINE and train.manifest.count == len(train)
    first = train[0]
    assert first["dataset"] == SEARCHQA_TRAIN_OFFLINE and first["index"] == 0 and first["source_dataset"] == "nq"


def test_subset_loading_checks_its_source_and_ids(tmp_path, monkeypatch):
    data = load_dataset(f"subset:{eval_subset_name('bamboogle')}")
    assert len(data) == 125 and data.manifest.source.startswith("bundled:subsets/")
    spec = SubsetSpec.read(eval_subset_name("bamboogle"))
    spec.items[3][2] = "not-the-id"
    with pytest.raises(ValueError, match="expected 'not-the-id'"):
        subset_items(spec)
    spec = SubsetSpec.read(eval_subset_name("bamboogle"))
    spec.sources["bamboogle"] = "0" * 64
    with pytest.raises(ValueError, match="different bamboogle file"):
        subset_items(spec)
    with pytest.raises(ValueError, match="unknown subset"):
        load_dataset("subset:nope")


# ------------------------------------------------------------------ overlap refusal


def _searchqa_cfg(**data):
    return TrainConfig(env={"id": "turngym/SearchQA-v0", "kwargs": {"dataset": "nq"}}, trl={}, data=data)


def _nq_overlap():
    keys = eval_keys(SubsetSpec.read(eval_subset_name(ds)) for ds in SEARCHQA_EVAL_DATASETS)
    return [i for i, it in enumerate(load_dataset("nq").items) if question_key(it) in keys]


def test_train_refuses_evaluation_overlap_unless_told():
    env = gymnasium.make("turngym/SearchQA-v0", dataset="nq")
    overlap = _nq_overlap()
    assert len(overlap) > 100  # IGPO evaluates on NQ questions that the NQ-open test file holds too
    with pytest.raises(EvalOverlapError, match=rf"{len(overlap)} of 3610 training items share .*searchqa-eval-nq: "):
        select_training_indices(_searchqa_cfg(), env)
    dropped = select_training_indices(_searchqa_cfg(eval_overlap="drop"), env)
    assert len(dropped) == 3610 - len(overlap) and not set(overlap) & set(dropped)
    assert len(select_training_indices(_searchqa_cfg(eval_overlap="allow"), env)) == 3610
    clean = next(i for i in range(3609) if i not in overlap and i + 1 not in overlap)
    assert select_training_indices(_searchqa_cfg(indices=[clean, clean + 2]), env) == [clean, clean + 1]
    with pytest.raises(ValueError, match="eval_overlap must be one of"):
        select_training_indices(_searchqa_cfg(eval_overlap="maybe"), env)
    with pytest.raises(ValueError, match="unknown data keys"):
        select_training_indices(_searchqa_cfg(evals=[]), env)


def test_overlap_is_found_across_files_by_normalised_question(tmp_path):
    """A question copied into another file, with another id, case and punctuation, still counts."""
    q = load_dataset("nq")[_nq_overlap()[0]]["question"]
    other = tmp_path / "mine.jsonl"
    other.write_text(json.dumps({"id": "x1", "question": "  " + q.upper().rstrip("?") + " !", "answers": ["a"]}) + "\n"
                     + json.dumps({"id": "x2", "question": "a question nobody evaluates", "answers": ["b"]}) + "\n")
    env = gymnasium.make("turngym/SearchQA-v0", dataset=str(other))
    cfg = TrainConfig(env={"id": "turngym/SearchQA-v0", "kwargs": {"dataset": str(other)}}, trl={})
    with pytest.raises(EvalOverlapError, match="1 of 2 training items"):
        select_training_indices(cfg, env)


def _train_yaml(tmp_path, eval_file, overlap=None):
    from turngym.agents.tiny import tiny_model_dir

    data = {"indices": [0, 4], "eval_sets": [str(eval_file)]}
    if overlap:
        data["eval_overlap"] = overlap
    cfg = {"env": {"id": "turngym/Digits-v0", "kwargs": {"max_turns": 1}}, "data": data,
           "reward": {"name": "outcome"}, "estimator": {"name": "egpo", "alpha": 0.4, "kappa": 2.0},
           "model": {"name_or_path": str(tiny_model_dir(chat=True))},
           "trl": {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 4, "num_generations": 4,
                   "max_completion_length": 8, "max_steps": 1, "logging_steps": 1, "report_to": "none",
                   "use_cpu": True, "save_strategy": "no"}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_command_refuses_overlap_and_the_flag_overrides_it(tmp_path):
    from turngym.envs.digits import DigitsEnv

    eval_file = tmp_path / "held_out.jsonl"
    eval_file.write_text(json.dumps({"id": "e", "question": DigitsEnv().get_item(2)["question"], "answers": []}) + "\n")
    cmd = [sys.executable, "-m", "turngym.cli", "train", "--config", str(_train_yaml(tmp_path, eval_file))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "1 of 4 training items share a normalised question" in proc.stderr
    assert "--allow-eval-overlap" in proc.stderr
    proc = subprocess.run(cmd + ["--allow-eval-overlap"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 of 4 training items share a question" in proc.stdout and "kept" in proc.stdout
    assert (tmp_path / "run" / "config.json").exists()


def test_the_offline_siop_recipe_trains_a_step_with_a_tiny_model(tmp_path):
    from turngym.agents.tiny import tiny_model_dir

    cfg = yaml.safe_load((ROOT / "configs" / "train_searchqa_siop_offline.yaml").read_text())
    tiny = str(tiny_model_dir(chat=True))
    cfg["env"]["kwargs"].update(retriever="default", max_turns=2)
    cfg["model"] = {"name_or_path": tiny}
    cfg["reward"]["scorer"] = tiny
    cfg["max_episode_tokens"] = 48
    cfg["trl"].update(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, gradient_accumulation_steps=1,
                      steps_per_generation=1, max_steps=1, max_completion_length=16, bf16=False, use_vllm=False,
                      gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no")
    cfg["trl"].pop("vllm_mode")
    cfg["trl"].pop("save_steps")
    path = tmp_path / "siop.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "turngym.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "run" / "config.json").exists()
