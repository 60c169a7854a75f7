"""The reward × estimator comparison on a real env: SearchQA-v0 (HotpotQA, real BM25), the LM choosing its searches.

``benchmarks/credit_learning_lm.py`` trains the tiny random-init LM on the exact-oracle MDPs; this trains it with
``TurnGRPOTrainer`` on the real ``turngym/SearchQA-v0`` (HotpotQA, the default Lucene BM25 index, Search-R1 tags),
with the rewards ``outcome``, SIOP at its official cut (``before_observation``), SIOP ``after_observation``
and IGPO, each with its declared estimator and an unbiased one (``turn_loo``).

The design (creditbench's planted SearchQA items, ``turngym.credit.creditbench.searchqa_items``): one HotpotQA item
whose own question, searched, retrieves a passage holding a gold answer, and another item's question (the
distractor), searched, retrieves none; both checked on the index, on the observation text as the env cuts it. At
each of at most three turns the LM picks one of three legal replies:

- ``<search> {the item's question} </search>`` (useful: the tool result holds the answer);
- ``<search> {a distractor question} </search>`` (useless);
- ``<answer> {a} </answer>``, where ``a`` is a scripted reader's answer: the gold answer when an earlier tool result
  holds it, else a plausible wrong answer (another item's gold). The tool outcomes are the real env's.

A third search is cut by the turn limit (no answer: failure). Success (the env's EM) therefore needs a useful search
before the answer, and the best policy is "search usefully, then answer" (2 turns); episodes run 1 to 3 turns, so the
estimators whose bias shows with varying lengths (``turn``) meet it. Whether a search was useful is known only from
what follows it: the per-turn credit the process rewards (SIOP, IGPO) are meant to supply.

Exact success rate. The env is deterministic given the replies (BM25 is), so every history is played once through
the real env before training (7 decision points, 21 replies); each reply is one added token (the env's stop
strings end it before an EOS) as in ``credit_learning_lm.py`` (a random LM would otherwise give a 40-token search
a normalised probability of ~0), the sampler draws from the LM's probabilities normalised over the legal replies,
and the success rate J of the LM's policy is computed exactly on that tree after every optimizer step (no rollouts
enter it). J* = 1.

Scoring model. SIOP scores support with a frozen copy of the start policy (its official setup: a frozen copy of the
initial policy), IGPO with the live policy (``scorer: policy``, its official setup); both are the tiny model, with
the added reply tokens (same tokenizer, so ``tokens: ids`` applies).

Usage: python benchmarks/credit_learning_real.py [--steps 30] [--seeds 4] [--workers 2] [--out docs]
       python benchmarks/credit_learning_real.py --quick --out DIR   (2 arms, 1 seed, 3 steps)
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STEM = "credit_learning_real"


@dataclass(frozen=True)
class Arm:
    """A reward (registry name and options) and the estimator it trains with."""

    reward: str
    options: tuple[tuple[str, Any], ...]
    estimator: str
    declared: bool  # the reward's declared (official) pairing, else the unbiased alternative

    @property
    def name(self) -> str:
        return f"{self.label}+{self.estimator}"

    @property
    def label(self) -> str:
        return {"siop": "siop_official"}.get(self.reward, self.reward) if not self.options else "siop_after_obs"


ARMS = (Arm("outcome", (), "grpo", True), Arm("outcome", (), "turn_loo", False),
        Arm("siop", (), "turn", True), Arm("siop", (), "turn_loo", False),
        Arm("siop", (("prefix", "after_observation"),), "turn", True),
        Arm("siop", (("prefix", "after_observation"),), "turn_loo", False),
        Arm("igpo", (), "igpo", True), Arm("igpo", (), "turn_loo", False))
ARM_NAMES = tuple(a.name for a in ARMS)
REPLY_NAMES = ("useful", "useless", "answer")


def load_module(name: str) -> Any:
    """benchmarks/<name>.py as a module (benchmarks/ is no package), loaded once per process."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def lm_module() -> Any:
    return load_module("credit_learning_lm")


# ------------------------------------------------------------------ the env, the item and the history tree


@dataclass(frozen=True)
class EnvConfig:
    dataset: str = "hotpotqa"
    topk: int = 1
    tool_response_chars: int = 300  # the first 300 characters of the passage (short episodes for the tiny LM)
    max_turns: int = 3
    item: int = 0  # which planted item (file order among those that qualify)

    def kwargs(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "topk": self.topk, "tool_response_chars": self.tool_response_chars,
                "tool_response_truncate_side": "left", "max_turns": self.max_turns}


def make_env(ecfg: EnvConfig) -> Any:
    import gymnasium

    import turngym  # noqa: F401  (registers the envs)

    return gymnasium.make("turngym/SearchQA-v0", **ecfg.kwargs())


@dataclass(frozen=True)
class Item:
    index: int
    question: str
    gold: str
    distractor: str
    wrong: str

    def reply_text(self, name: str, informed: bool = False) -> str:
        if name == "useful":
            return f"<search> {self.question} </search>"
        if name == "useless":
            return f"<search> {self.distractor} </search>"
        return f"<answer> {self.gold if informed else self.wrong} </answer>"

    def texts(self) -> list[str]:
        return [self.reply_text("useful"), self.reply_text("useless"), self.reply_text("answer", True),
                self.reply_text("answer", False)]


def planted_item(ecfg: EnvConfig) -> Item:
    """The ``ecfg.item``-th creditbench SearchQA item whose useful search's observation (as the env cuts it) holds a
    gold answer and whose distractor's does not."""
    from turngym.credit.creditbench import BenchConfig, searchqa_items
    from turngym.envs.search_qa import contains_answer

    env = make_env(ecfg)
    found = []
    for it in searchqa_items(env, BenchConfig(groups=ecfg.item + 8)):
        golds = [str(a) for a in env.unwrapped.get_item(it.index)["answers"]]
        obs = []
        for q in (it.useful_query, it.distractors[0]):
            env.reset(options={"index": it.index})
            env.step(f"<search> {q} </search>")
            obs.append(env.unwrapped.episode.turns[-1].observation or "")
        if contains_answer(obs[0], golds) and not contains_answer(obs[1], golds):
            found.append(Item(it.index, it.useful_query, golds[0], it.distractors[0], it.wrong_answers[0]))
        if len(found) > ecfg.item:
            break
    env.close()
    if len(found) <= ecfg.item:
        raise RuntimeError(f"only {len(found)} planted SearchQA items qualify under {ecfg}")
    return found[ecfg.item]


def add_reply_tokens(model: Any, tok: Any, item: Item, seed: int = 0) -> None:
    """Each legal reply one token (new embedding rows at random, fixed seed), as credit_learning_lm.py's action names."""
    import torch

    tok.add_tokens(item.texts())
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        gen = torch.Generator().manual_seed(seed)
        std = float(emb[:old].std())
        emb[old:] = torch.randn(emb.shape[0] - old, emb.shape[1], generator=gen) * std
    for t in item.texts():
        if len(tok.encode(t, add_special_tokens=False)) != 1:
            raise RuntimeError(f"reply {t[:40]!r} is not one token after add_tokens")


def history_tree(ecfg: EnvConfig, item: Item, tok: Any) -> tuple[Any, list[tuple[str, ...]]]:
    """Every history played through the real env (depth first), prompts built as the rollout runner builds them.
    Returns credit_learning_lm's ``HistoryTree`` (rewards: the env's EM at the end of an episode) and, per
    history, the names of the replies taken to reach it."""
    from turngym.agents.hf import cut_generation
    from turngym.agents.tokenization import ConversationTokenizer
    from turngym.oracles.mdp import Node, Outcome, TabularMDP
    from turngym.rewards.base import outcome_score

    lm = lm_module()
    env = make_env(ecfg)
    conv = ConversationTokenizer(tok)
    eos = tok.eos_token_id
    env.reset(options={"index": item.index})
    first = tuple(conv.prompt_ids(env.unwrapped.episode.prompt, tools=env.unwrapped.episode.tools))
    contexts, paths, rows, replies = [first], [()], [], []
    i = 0
    while i < len(contexts):  # breadth first: children get later indices
        path = paths[i]
        informed = "useful" in path
        texts = [item.reply_text(n, informed) for n in REPLY_NAMES]
        # the reply's ids as the trainer keeps them: the env's stop strings (</search>, </answer>) end a reply
        # before its EOS, so a reply is its one token
        ids = [tuple(cut_generation(tok, tok.encode(t, add_special_tokens=False) + [eos], 8,
                                    tuple(env.unwrapped.stop), {eos})[0]) for t in texts]
        replies.append(tuple(ids))
        row = []
        for name, text, rid in zip(REPLY_NAMES, texts, ids, strict=True):
            env.reset(options={"index": item.index})
            for prev in path:  # replay the history (deterministic); its replies are searches (an answer ends it)
                env.step(item.reply_text(prev))
            _, _, terminated, truncated, _ = env.step(text)
            if terminated or truncated:
                score = outcome_score(env.unwrapped.episode)  # the env's EM; a cut episode has none: 0
                row.append(Outcome(1.0, score if np.isfinite(score) else 0.0, None))
                continue
            obs = env.unwrapped.episode.turns[-1].observation or ""
            contexts.append(contexts[i] + rid + tuple(conv.observation_ids(obs, env.unwrapped.observation_role, rid)))
            paths.append(path + (name,))
            row.append(Outcome(1.0, 0.0, len(contexts) - 1))
        rows.append(row)
        i += 1
    env.close()
    nodes = tuple(Node(f"{'/'.join(p) or 'start'}#{h}", len(p), REPLY_NAMES, tuple((o,) for o in row))
                  for h, (p, row) in enumerate(zip(paths, rows, strict=True)))
    mdp = TabularMDP(f"SearchQA item {item.index} histories", nodes)
    tree = lm.HistoryTree(mdp, tuple(contexts), tuple(replies), tuple(range(len(contexts))),
                          {c: h for h, c in enumerate(contexts)})
    return tree, paths


# ------------------------------------------------------------------ rewards and training


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 30
    group: int = 8
    lr: float = 0.005
    model_seed: int = 0
    env: EnvConfig = field(default_factory=EnvConfig)
    scorer: str = "tiny"  # SIOP's and IGPO's support scorer: "tiny" (official setups) or "reader" (pretrained)
    support: str | None = None  # with scorer="reader": the precomputed support table (precompute_reader_support)

    @property
    def stem(self) -> str:
        return STEM if self.scorer == "tiny" else f"{STEM}_{self.scorer}"


def load_lm(cfg: TrainConfig) -> tuple[Any, Any, Item, Any, list[tuple[str, ...]]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir

    item = planted_item(cfg.env)
    d = str(tiny_model_dir(chat=True, seed=cfg.model_seed))
    torch.manual_seed(cfg.model_seed)
    model, tok = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), AutoTokenizer.from_pretrained(d)
    add_reply_tokens(model, tok, item, cfg.model_seed)
    tree, paths = history_tree(cfg.env, item, tok)
    return model, tok, item, tree, paths


def make_reward(arm: Arm, model: Any, tok: Any, cfg: TrainConfig | None = None) -> Any:
    """The arm's reward; SIOP scores with a frozen copy of ``model`` (the start policy), IGPO with the live policy
    (the trainer binds it; outside a trainer, with ``model`` itself). With ``cfg.scorer == "reader"`` both score
    with the frozen pretrained reader instead, re-tokenising the episodes' text (``tokens: text``), from the table
    :func:`precompute_reader_support` wrote."""
    from turngym.rewards import get_reward
    from turngym.rewards.support import HFSupportScorer

    if arm.reward == "outcome":
        return get_reward("outcome")
    if cfg is not None and cfg.scorer == "reader":
        clr = load_module("credit_learning_reader")
        table = clr.CachedSupportScorer(clr.reader_tokenizer(), json.loads(Path(cfg.support).read_text()))
        reward = get_reward(arm.reward, tokens="text", **dict(arm.options))
        reward.bind_scorer(table)
        return reward
    if arm.reward == "siop":
        frozen = copy.deepcopy(model).eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        reward = get_reward("siop", scorer="frozen-start-policy", **dict(arm.options))
        reward.bind_scorer(HFSupportScorer(frozen, tok))
        return reward
    reward = get_reward("igpo", scorer="policy", **dict(arm.options))
    reward.bind_scorer(HFSupportScorer(model, tok))
    return reward


def arm_advantages(arm: Arm, reward: Any, episodes: Sequence[Any]) -> tuple[list[list[float]], list[list[float]]]:
    """One group's per-turn rewards and advantages under ``arm``, as the trainer computes them."""
    from turngym.episode import EpisodeGroup, reward_view
    from turngym.training.advantages import get_estimator

    scores = reward.score_group(reward_view(EpisodeGroup.of(tuple(episodes))))
    return scores.rewards, get_estimator(arm.estimator)(scores.rewards, gamma=1.0)


@dataclass
class Curve:
    arm: str
    seed: int
    j: list[float]
    legal_mass: list[float]
    wall_s: float
    cpu_s: float
    steps: int
    turns_per_episode: list[float] = field(default_factory=list)
    adv_abs_max: list[float] = field(default_factory=list)


def precompute_reader_support(cfg: TrainConfig, path: Path) -> dict[str, float]:
    """The pretrained reader's support for every leaf episode of the item's tree: every scoring point (both cuts,
    re-tokenised with the reader's tokenizer) against both answers the scripted reader writes (the gold one and the
    wrong one: SIOP's cluster references and IGPO's gold). The tree is finite and the env deterministic, so this is
    every point training can ask for; written to ``path`` as ``{point key: {reference: mean log-prob}}``."""
    import dataclasses as dc

    rt = load_module("reader_tree")
    from turngym.rewards.support import HFSupportScorer, PseudoAnswer, continuation, end_of_turn_text, scoring_points

    t = time.perf_counter()
    reader = rt.Reader.load()
    tok = reader.tok
    load_s = time.perf_counter() - t
    _, _, item, _, paths = load_lm(cfg)
    env = make_env(cfg.env)
    refs = [item.gold.strip(), item.wrong.strip()]
    conts = [continuation(tok, PseudoAnswer.make("official"), r, end_of_turn_text(tok)) for r in refs]
    episodes = []
    for hist in paths:
        for name in REPLY_NAMES:
            env.reset(options={"index": item.index})
            for prev in hist:
                env.step(item.reply_text(prev))
            _, _, terminated, truncated, _ = env.step(item.reply_text(name, "useful" in hist))
            if terminated or truncated:
                episodes.append(dc.replace(env.unwrapped.episode))
    env.close()
    t = time.perf_counter()
    scorer = HFSupportScorer(reader.model, tok, method="tree")
    table: dict[str, dict[str, float]] = {}
    with scorer.sharing_prompt():
        for ep in episodes:  # one call per episode: its points are nested prefixes (both cuts together)
            points = {rt.ids_key(p): p for mode in ("before_observation", "after_observation")
                      for p in scoring_points(ep, tok, mode, tokens="text")}
            need = sorted((p for k, p in points.items() if k not in table), key=len)
            if need:
                rows = scorer.mean_logprobs(need, conts)
                table.update({rt.ids_key(p): {r: float(x) for r, x in zip(refs, row, strict=True)}
                              for p, row in zip(need, rows, strict=True)})
    path.write_text(json.dumps(table))
    return {"load_s": load_s, "score_s": time.perf_counter() - t, "points": len(table), "references": len(refs),
            "episodes": len(episodes)}


def train_curve(arm: Arm, seed: int, cfg: TrainConfig) -> Curve:
    from turngym.training.trainer import task_dataset

    lm = lm_module()
    wall, cpu = time.perf_counter(), time.process_time()
    model, tok, item, tree, _ = load_lm(cfg)
    tr, js, mass = lm.train_exact(model, tok, tree, env_factory=lambda: make_env(cfg.env),
                                  reward=make_reward(arm, model, tok, cfg), dataset=task_dataset([item.index] * cfg.group),
                                  estimator=arm.estimator, seed=seed, steps=cfg.steps, group=cfg.group, lr=cfg.lr,
                                  max_episode_tokens=4096)
    logs = [h for h in tr.state.log_history if "turngym/turns_per_episode" in h]
    return Curve(arm.name, seed, js, mass, time.perf_counter() - wall, time.process_time() - cpu, cfg.steps,
                 [float(h["turngym/turns_per_episode"]) for h in logs],
                 [float(h.get("turngym/turn_advantage_abs_max", 0.0)) for h in logs])


def _job(job: tuple[Arm, int, TrainConfig]) -> Curve:
    return train_curve(*job)


def run_all(arms: Sequence[Arm], seeds: Sequence[int], cfg: TrainConfig, workers: int,
            sink: Path | None = None) -> list[Curve]:
    """Seed-major over ``workers`` single-threaded processes; each curve appended to ``sink`` as it ends."""
    # spawned workers unpickle this module's and credit_learning_lm's functions by name: both importable there too
    # (the children inherit sys.path), also when this file was loaded by path (tests)
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    jobs = [(a, s, cfg) for s in seeds for a in arms]
    return lm_module().run_jobs(_job, jobs, workers, sink, lambda c, t: (
        f"[{t:6.0f} s] {c.arm:>24} seed {c.seed:>2}: success {c.j[0]:.3f} -> {c.j[-1]:.3f} "
        f"({c.wall_s:.0f} s wall, {c.cpu_s:.0f} s CPU)"))


# ------------------------------------------------------------------ summaries


def summarise(curves: Sequence[Curve], arms: Sequence[str], j_start: float) -> dict:
    cl = lm_module().tabular_helpers()
    out: dict = {"j_star": 1.0, "j_start": j_start, "arms": {}}
    for arm in arms:
        mine = sorted((c for c in curves if c.arm == arm), key=lambda c: c.seed)
        if not mine:
            continue
        a = cl.summarise(np.array([c.j for c in mine]), 1.0, [c.seed for c in mine])
        a["wall_s_per_step"] = float(np.mean([c.wall_s / c.steps for c in mine]))
        a["cpu_s_per_step"] = float(np.mean([c.cpu_s / c.steps for c in mine]))
        a["turns_final"] = float(np.mean([np.mean(c.turns_per_episode[-5:]) for c in mine if c.turns_per_episode]))
        out["arms"][arm] = a
    return out


def power(res: dict, a: str, b: str, n: int) -> str | None:
    """Seeds per arm a two-sided t test (α 0.05, power 0.8) needs to separate arms a and b at the observed
    difference of final success and pooled seed sd."""
    cl = lm_module().tabular_helpers()
    if a not in res["arms"] or b not in res["arms"] or n < 2:
        return None
    fa, fb = res["arms"][a], res["arms"][b]
    t = cl.t_quantile(n)
    sd = float(np.sqrt(((fa["final_half"] * np.sqrt(n) / t) ** 2 + (fb["final_half"] * np.sqrt(n) / t) ** 2) / 2))
    diff = abs(fa["final"] - fb["final"])
    if diff == 0 or sd == 0:
        return f"{a} vs {b}: difference {diff:.3f}, seed sd {sd:.3f} (nothing to size)"
    need = int(np.ceil(2 * ((1.96 + 0.8416) * sd / diff) ** 2))
    return (f"{a} vs {b}: {fa['final']:.3f} − {fb['final']:.3f} = {fa['final'] - fb['final']:+.3f} (seed sd {sd:.3f}) "
            f"→ about {need} seeds per arm")


def table_lines(res: dict, seeds: Sequence[int], arms: Sequence[str], cfg: TrainConfig, item: Item) -> list[str]:
    cl = lm_module().tabular_helpers()
    n = len(seeds)
    lines = [f"SearchQA-v0 (HotpotQA item {item.index}, real BM25), tiny random-init LM under TurnGRPOTrainer, "
             f"{cfg.steps} optimizer steps, {n} seeds ({seeds[0]}–{seeds[-1]}), groups of {cfg.group}, Adam lr "
             f"{cfg.lr}. Success = the env's EM, exact over the LM's policy (start {res['j_start']:.3f}, best 1). Cell: "
             "final success (mean of the last 10 steps) ± 95% t interval [range over seeds] (steps until the mean "
             "curve closes 90% of the gap to 1; stuck seeds); turns per episode at the end.", "",
             "| reward | declared estimator | unbiased estimator (`turn_loo`) |", "|---|---|---|"]
    for label in dict.fromkeys(a.split("+")[0] for a in arms):
        cells = []
        for a in arms:
            if a.split("+")[0] == label and a in res["arms"]:
                s = res["arms"][a]
                cells.append(f"`{a.split('+')[1]}`: {cl.cell(s)}; {s['turns_final']:.2f} turns")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    costs = list(res["arms"].values())
    lines += ["", "Per optimizer step (one single-threaded process per run, incl. start-up, the history tree and the "
              f"exact pass after each step): wall {np.mean([a['wall_s_per_step'] for a in costs]):.2f} s, CPU "
              f"{np.mean([a['cpu_s_per_step'] for a in costs]):.2f} s (mean over runs); by arm: "
              + ", ".join(f"{k} {v['wall_s_per_step']:.2f}/{v['cpu_s_per_step']:.2f}" for k, v in res["arms"].items())
              + " (wall/CPU s)."]
    pairs = [(f"{r}+{d}", f"{r}+turn_loo") for r, d in (("outcome", "grpo"), ("siop_official", "turn"),
                                                        ("siop_after_obs", "turn"), ("igpo", "igpo"))]
    finals = {a: s["final"] for a, s in res["arms"].items()}
    if len(finals) >= 2:
        best, worst = max(finals, key=finals.get), min(finals, key=finals.get)
        pairs = [(best, worst)] + pairs
    power_lines = [p for a, b in pairs if (p := power(res, a, b, n))]
    if power_lines:
        lines += ["", "Power (two-sided t, α 0.05, 80%; seeds per arm to separate the pair at the observed difference "
                  f"and spread, have {n}): " + "; ".join(power_lines) + "."]
    return lines


def write_outputs(curves: Sequence[Curve], res: dict, seeds: Sequence[int], arms: Sequence[str], cfg: TrainConfig,
                  item: Item, out: Path, total_wall: float | None = None) -> list[str]:
    summary = {"steps": cfg.steps, "group": cfg.group, "lr": cfg.lr, "env": asdict(cfg.env), "item": asdict(item),
               "seeds": list(seeds), "arms": list(arms), "total_wall_s": total_wall,
               **{k: v for k, v in res.items() if k != "arms"},
               "summary": {a: {k: v for k, v in s.items() if k not in ("mean", "half")} for a, s in res["arms"].items()},
               "curves": [{**asdict(c), "j": [round(x, 6) for x in c.j],
                           "legal_mass": [float(f"{x:.4g}") for x in c.legal_mass]} for c in curves]}
    stem = cfg.stem
    summary["scorer"] = cfg.scorer
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    with (out / f"{stem}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arm", "step", "mean_success", "ci95_half"])
        for arm, a in res["arms"].items():
            for k, (m, h) in enumerate(zip(a["mean"], a["half"], strict=True)):
                w.writerow([arm, k, f"{m:.4f}", f"{h:.4f}"])
    lines = table_lines(res, seeds, arms, cfg, item)
    lm_module().write_table(out, stem, lines)
    plot(res, out / f"{stem}.png")
    return lines


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for arm, a in res["arms"].items():
        ax = axes[0] if not arm.endswith("+turn_loo") else axes[1]
        m, h = np.asarray(a["mean"]), np.asarray(a["half"])
        x = np.arange(len(m))
        ax.plot(x, m, label=arm, linewidth=1.3)
        ax.fill_between(x, m - h, m + h, alpha=0.15)
    axes[0].set_title("declared estimator", fontsize=10)
    axes[1].set_title("unbiased estimator (turn_loo)", fontsize=10)
    for ax in axes:
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("exact success rate (EM) of the LM's policy")
    fig.suptitle("SearchQA-v0 (real BM25), tiny LM: reward × estimator", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_curves(path: Path) -> list[Curve]:
    if path.suffix == ".json":
        return [Curve(**c) for c in json.loads(path.read_text())["curves"]]
    return [Curve(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--item", type=int, default=0, help="which planted SearchQA item")
    ap.add_argument("--arms", default=",".join(ARM_NAMES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="outcome+grpo and siop_official+turn, 1 seed, 3 steps")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--from-curves", help="summarise a saved run (its curves JSONL or JSON) instead of training")
    ap.add_argument("--scorer", choices=("tiny", "reader"), default="tiny",
                    help="SIOP's and IGPO's support scorer: the tiny LM (their official setups) or the frozen "
                         "pretrained reader (the embedded Qwen; its support over the tree precomputed once)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.arms = 3, 1, "outcome+grpo,siop_official+turn"
    names = args.arms.split(",")
    if unknown := [n for n in names if n not in ARM_NAMES]:
        raise SystemExit(f"credit_learning_real: unknown arm(s) {unknown}; the arms are {list(ARM_NAMES)}")
    arms = [a for a in ARMS if a.name in names]
    cfg = TrainConfig(steps=args.steps, group=args.group, lr=args.lr, env=EnvConfig(item=args.item), scorer=args.scorer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.scorer == "reader":
        support = out / f"{cfg.stem}_support.json"
        if not support.exists():
            cost = precompute_reader_support(cfg, support)
            print(f"reader support: {cost['points']} points x {cost['references']} references in "
                  f"{cost['score_s']:.0f} s (load {cost['load_s']:.0f} s)", flush=True)
        cfg = dataclasses.replace(cfg, support=str(support))
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    model, _, item, tree, _ = load_lm(cfg)
    j_start = lm_module().exact_j(model, tree).j
    total = None
    if args.from_curves:
        curves = load_curves(Path(args.from_curves))
        have = sorted({c.seed for c in curves if all(any(d.seed == c.seed and d.arm == a for d in curves) for a in names)})
        curves, seeds = [c for c in curves if c.seed in have and c.arm in names], have
    else:
        sink = out / f"{cfg.stem}_curves.jsonl"
        sink.write_text("")
        start = time.perf_counter()
        curves = run_all(arms, seeds, cfg, args.workers, sink)
        total = time.perf_counter() - start
        print(f"total wall {total:.0f} s", flush=True)
    res = summarise(curves, names, j_start)
    print("\n".join(write_outputs(curves, res, seeds, names, cfg, item, out, total)))


if __name__ == "__main__":
    sys.exit(main())
