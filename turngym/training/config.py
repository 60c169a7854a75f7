"""``turngym train --config run.yaml``: one YAML file names the env, data, reward, estimator, model
and TRL arguments; everything under ``trl:`` goes to ``GRPOConfig`` unchanged, so every TRL
option (loss type, KL, vLLM, logging, checkpointing, ...) is available as TRL documents it.

Example (``configs/train_calculator.yaml``)::

    env: {id: turngym/Calculator-v0, kwargs: {max_turns: 3}}
    data: {indices: [0, 256]}           # [start, stop) of the env's dataset, file order
    # data.eval_sets: datasets whose items training must not use (default: the env family's
    # evaluation sets, see turngym.corpora.subsets.DEFAULT_EVAL_SETS); data.eval_overlap:
    # refuse (default) | drop | allow, decided by normalised question hash.
    reward: {name: outcome}              # any turngym.rewards name, with its config
    # siop / igpo take scorer: policy (the live policy), a local model ('default', a directory,
    # {model, dtype, method}) or an OpenAI-compatible server ({base_url, model, tokenizer})
    estimator: {name: turn, gamma: 1.0}  # no name: the reward's own (outcome: grpo, siop: turn, ...);
    # eps: grpo 1e-4 (TRL), turn / igpo_siop / igpo_separate 1e-6 (igpo: no std); docs/estimators.md says which are unbiased
    model: {name_or_path: default}       # 'default', a directory, a .gguf file, or a hub id
    peft: {r: 16, lora_alpha: 32, target_modules: all-linear}   # optional LoRA
    trl: {output_dir: runs/calc, num_generations: 4, per_device_train_batch_size: 4, max_steps: 100}
    rollouts: {every: 10}                # save the scored batch every 10 steps to <output_dir>/rollouts
    # (dir: elsewhere; every: 0 saves none); turngym view / ablate / report read them (docs/training.md)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from turngym.progress import is_main_process

KNOWN_KEYS = {"env", "data", "reward", "estimator", "model", "peft", "trl", "stop", "max_episode_tokens", "rollouts", "ray"}
ROLLOUT_KEYS = {"every", "dir"}
# the rollouts' envs on a Ray actor pool (docs/scale.md)
RAY_KEYS = {"address", "workers", "envs_per_worker", "restarts", "step_budget_s"}
DEFAULT_ROLLOUTS_EVERY = 10


@dataclass
class TrainConfig:
    env: dict[str, Any]
    trl: dict[str, Any]
    model: dict[str, Any] = field(default_factory=lambda: {"name_or_path": "default"})
    data: dict[str, Any] = field(default_factory=dict)
    reward: dict[str, Any] = field(default_factory=lambda: {"name": "outcome"})
    estimator: dict[str, Any] = field(default_factory=dict)  # no name: the reward's declared estimator
    peft: dict[str, Any] | None = None
    stop: list[str] | None = None
    max_episode_tokens: int | None = None
    rollouts: dict[str, Any] = field(default_factory=lambda: {"every": DEFAULT_ROLLOUTS_EVERY})
    ray: dict[str, Any] | None = None  # {address: auto, workers: 2, envs_per_worker: 8}: envs on a Ray pool

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
            raise ValueError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: the config must be a mapping")
        unknown = set(raw) - KNOWN_KEYS
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(KNOWN_KEYS)}")
        for key in ("env", "trl"):
            if not isinstance(raw.get(key), dict):
                raise ValueError(f"{path}: '{key}' must be a mapping")
        rollouts = raw.get("rollouts", {})
        if not isinstance(rollouts, dict) or set(rollouts) - ROLLOUT_KEYS:
            raise ValueError(f"{path}: 'rollouts' must be a mapping with keys {sorted(ROLLOUT_KEYS)}, got {rollouts!r}")
        if "id" not in raw["env"]:
            raise ValueError(f"{path}: env.id is required (e.g. turngym/MathCode-v0)")
        if raw.get("ray") is not None:
            raw["ray"] = ray_section(raw["ray"], f"{path}: ")
        return cls(**raw)


def ray_section(ray: Any, where: str = "") -> dict[str, Any]:
    """The ``ray:`` section checked, before anything loads: ``auto`` or an address alone stands for
    ``{address: ...}``; an unknown key, a count below 1 or an address that is neither ``auto``, ``HOST:PORT`` nor
    ``ray://HOST:PORT`` is one line (:class:`ValueError`). Checked again after the command line's overrides."""
    if isinstance(ray, str):
        ray = {"address": ray}
    if not isinstance(ray, dict):
        raise ValueError(f"{where}'ray' must be a mapping with keys {sorted(RAY_KEYS)} (or an address), got {ray!r}")
    for key in sorted(set(ray) - RAY_KEYS, key=str):
        raise ValueError(f"{where}unknown key ray.{key}; allowed: {sorted(RAY_KEYS)}")
    for key in ("workers", "envs_per_worker"):
        value = ray.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}ray.{key} must be a whole number >= 1, got {value!r}")
    restarts = ray.get("restarts", 0)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ValueError(f"{where}ray.restarts must be a whole number >= 0, got {restarts!r}")
    budget = ray.get("step_budget_s", 1.0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"{where}ray.step_budget_s must be a number of seconds > 0, got {budget!r}")
    address = ray.get("address", "auto")
    if not isinstance(address, str) or not address:
        raise ValueError(f"{where}ray.address must be 'auto', HOST:PORT or ray://HOST:PORT, got {address!r}")
    if address != "auto":
        from turngym.run.backends.ray_address import split_address
        from turngym.run.backends.ray_faults import RayPoolError

        try:
            split_address(address)
        except RayPoolError:
            raise ValueError(f"{where}ray.address must be 'auto', HOST:PORT or ray://HOST:PORT, got {address!r}") from None
    return dict(ray)


DATA_KEYS = {"indices", "eval_sets", "eval_overlap"}


def select_training_indices(cfg: TrainConfig, env: Any) -> list[int]:
    """``data.indices`` of the env's dataset, checked against the evaluation sets: an item whose
    normalised question is in one is refused (default), dropped, or allowed, as ``data.eval_overlap`` says."""
    from turngym.corpora.subsets import apply_overlap_policy, check_overlap, eval_set_items

    unknown = set(cfg.data) - DATA_KEYS
    if unknown:
        raise ValueError(f"unknown data keys {sorted(unknown)}; allowed: {sorted(DATA_KEYS)}")
    base = env.unwrapped
    n = base.num_items()
    start, stop = cfg.data.get("indices", [0, n])
    indices = list(range(int(start), min(int(stop), n)))
    if not indices:
        raise ValueError(f"data.indices selects no items (the dataset has {n})")
    eval_sets = eval_set_items(cfg.env["id"], cfg.data.get("eval_sets"), base)
    report = check_overlap([base.get_item(i) for i in indices], eval_sets)
    policy = cfg.data.get("eval_overlap", "refuse")
    keep = apply_overlap_policy(report, policy)
    if report.count and is_main_process():  # once under accelerate launch, not once per process
        action = "left out" if policy == "drop" else "kept (data.eval_overlap: allow)"
        print(f"turngym train: {report.count} of {report.train_count} training items share a question with "
              f"evaluation sets {report.per_eval_set}; {action}")
    return [indices[i] for i in keep]


def estimator_options(est: dict[str, Any]) -> dict[str, Any]:
    """Options of the estimator beyond name/gamma/eps (``egpo``: alpha, kappa)."""
    from turngym.training.advantages import get_estimator

    name = est.get("name")
    extra = {k: v for k, v in est.items() if k not in ("name", "gamma", "eps")}
    if name is None:  # the reward's declared estimator: the trainer checks the options once it knows it
        return extra
    get_estimator(name).check_options(extra)
    return extra


def check_names(cfg: TrainConfig) -> None:
    """The reward and the estimator the config names exist and take its options (ValueError, one line)."""
    from turngym.rewards.base import reward_class

    if not isinstance(cfg.reward.get("name"), str):
        raise ValueError("reward.name is required (e.g. outcome, siop)")
    reward_class(cfg.reward["name"])
    estimator_options(dict(cfg.estimator))


ACCELERATED = ("cuda", "xpu", "mps", "npu")  # torch backends TRL trains on in bf16


def device_arguments(trl: dict[str, Any], accelerator: str | None) -> dict[str, Any]:
    """``trl:`` with the device chosen: on a machine without an accelerator, CPU (``use_cpu``) in fp32
    (TRL turns bf16 on by default, which stops a CPU run), unless the config sets them itself."""
    if accelerator is not None:
        return dict(trl)
    chosen = {"use_cpu": True, "bf16": False}
    return {**{k: v for k, v in chosen.items() if k not in trl}, **trl}


def available_accelerator() -> str | None:
    """The first torch backend here with a device (``cuda``, ...), or None on a CPU-only machine."""
    import torch

    for name in ACCELERATED:
        backend = getattr(torch, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            return name
    return None


def build_trainer(cfg: TrainConfig, progress: Callable[[str], None] | None = None) -> Any:
    """The trainer ``cfg`` describes; ``progress`` hears each stage's name as it starts (the model load and the
    imports take seconds to minutes on a CPU)."""
    from turngym.extras import require

    say = progress or (lambda text: None)
    check_names(cfg)  # a misspelt reward or estimator: one line before TRL is imported and the model loads
    require("turngym train")
    if cfg.ray is not None:  # the section as the overrides left it; the cluster joined before anything loads
        cfg.ray = ray_section(cfg.ray)
        from turngym.run.backends.ray_pool import RayPoolError, connect

        say(f"joining the Ray cluster ({cfg.ray.get('address', 'auto')})…")
        try:
            connect(str(cfg.ray.get("address", "auto")))
        except RayPoolError as exc:
            raise ValueError(str(exc)) from None
    say("importing TRL and transformers…")
    import gymnasium
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    import turngym  # noqa: F401 - env registration
    from turngym.agents.loading import model_identity, resolve_model_dir
    from turngym.rewards import get_reward
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    env_id, env_kwargs = cfg.env["id"], dict(cfg.env.get("kwargs", {}))
    if env_id not in gymnasium.registry:
        raise ValueError(f"unknown env {env_id!r}")

    def env_factory():
        return gymnasium.make(env_id, **env_kwargs)

    say(f"loading {env_id} and its dataset; selecting the training items…")
    indices = select_training_indices(cfg, env_factory())
    try:
        args = GRPOConfig(**device_arguments(cfg.trl, available_accelerator()))
    except TypeError as exc:
        raise ValueError(f"bad trl arguments: {exc}") from None
    rollout_envs = None
    if cfg.ray is not None:
        from turngym.run.backends.ray_pool import RayEnvPool, RayPoolError

        say("starting the Ray env pool (its envs built before the model loads)…")
        try:
            rollout_envs = RayEnvPool(env_id, env_kwargs, workers=int(cfg.ray.get("workers", 2)),
                                      envs_per_worker=int(cfg.ray.get("envs_per_worker", 8)),
                                      restarts=cfg.ray.get("restarts"), step_budget_s=cfg.ray.get("step_budget_s"))
        except RayPoolError as exc:
            raise ValueError(str(exc)) from None
    location = resolve_model_dir(str(cfg.model.get("name_or_path", "default")))
    say(f"loading the model from {location}…")
    model_kwargs = {k: v for k, v in cfg.model.items() if k != "name_or_path"}
    model = AutoModelForCausalLM.from_pretrained(location, **model_kwargs)
    tok = AutoTokenizer.from_pretrained(location)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    peft_config = None
    if cfg.peft:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **cfg.peft)
    reward_cfg = dict(cfg.reward)
    say(f"building the reward {reward_cfg.get('name')!r}…")
    reward = get_reward(reward_cfg.pop("name"), **reward_cfg)
    est = dict(cfg.estimator)
    say(f"building the trainer ({len(indices)} training items)…")
    return TurnGRPOTrainer(model=model, processing_class=tok, env_factory=env_factory, rollout_envs=rollout_envs,
                           reward=reward, args=args,
                           train_dataset=task_dataset(indices), estimator=est.pop("name", None) or reward.estimator,
                           gamma=est.pop("gamma", 1.0), advantage_eps=est.pop("eps", None),
                           estimator_options=estimator_options(dict(cfg.estimator)),
                           max_episode_tokens=cfg.max_episode_tokens, stop=cfg.stop, peft_config=peft_config,
                           save_rollouts_every=cfg.rollouts.get("every", DEFAULT_ROLLOUTS_EVERY),
                           rollouts_dir=cfg.rollouts.get("dir"),
                           base_model=model_identity(str(cfg.model.get("name_or_path", "default")))["name"])
