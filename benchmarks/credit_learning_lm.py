"""Learning curves of a real causal LM under TurnGRPOTrainer, with J computed exactly from the oracle.

``benchmarks/credit_learning.py`` trains tabular softmax policies; this trains a transformers causal LM (the
repo's tiny random-init Llama, built locally: no hub) with ``TurnGRPOTrainer`` on the exact-oracle text envs
(``turngym/DelayedEffect-v0``, ``turngym/Recovery-v0``, ``turngym/VariableHorizon-v0`` with and without process
rewards), the env's per-turn rewards (``env``) and each estimator as the trainer applies it.

The LM's policy. Each turn's reply is one legal action name followed by EOS: the trainer's single-turn generator
is replaced by a sampler that scores every legal reply under the LM (log p of its tokens and the EOS, given the
whole conversation so far) and draws one with those probabilities normalised over the legal replies. Mass on
any other text is thus conditioned away: the env never sees an illegal reply (it would end the episode with
reward 0), so the normalised policy is exactly the policy whose episodes are trained on. ``legal mass`` (the
raw probability of the legal replies, visit-weighted) is reported so one sees how much was conditioned away.

Exact J. The prompt at a turn is the whole conversation, so the LM's policy depends on the history, not only
on the MDP node (DelayedEffect's distractor turns reach one node by several histories). The MDP is therefore
unrolled into its tree of histories (one node per distinct prompt, with the prompt's token ids as the
trainer's runner builds them); the LM's log-probabilities of the legal replies at every history are the
logits of a tabular softmax on that tree, and ``turngym.oracles.mdp.solve`` gives J exactly: no rollouts.
The sampler looks every prompt it is asked to continue up in that tree (an unknown prompt is an error), so
the J computed and the policy trained on are the same function of the weights.

The action names are added to the tokenizer as whole tokens (new embedding rows drawn at random, with a
fixed seed): with the tiny tokenizer's byte-level pieces CONTINUE is 8 tokens and STOP 4, and a random LM's
near-uniform next-token distribution over 512 tokens would put a normalised probability of about 512^-4 on
the longer name: a deterministic start policy that never explores.

Every seed starts from the same weights (as the tabular script starts every seed from the same logits); the
seed drives the sampling. Summaries (final J ± 95% t interval, steps to 90% of J* − J_start, stuck seeds) are
``benchmarks/credit_learning.py``'s own helpers.

Usage: python benchmarks/credit_learning_lm.py [--steps 40] [--seeds 10] [--workers 2] [--out docs]
       python benchmarks/credit_learning_lm.py --quick --out /tmp/lmq     (1 setting, 2 arms, 2 seeds, 4 steps)
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from turngym.oracles.mdp import Node, Outcome, TabularMDP, solve

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("grpo", "turn", "turn_loo", "rloo", "igpo", "gigpo")
DENSE_PROCESS_REWARDS = (0.4, -0.3, 0.6, -0.2)  # exact_oracle.settings()'s variable_horizon_dense
CSV_EVERY = 1


@dataclass(frozen=True)
class OracleSetting:
    """A registered text env (and its keyword arguments) whose MDP the oracle solves."""

    name: str
    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)


SETTINGS = (OracleSetting("delayed_effect", "turngym/DelayedEffect-v0"),
            OracleSetting("recovery", "turngym/Recovery-v0"),
            OracleSetting("variable_horizon", "turngym/VariableHorizon-v0"),
            OracleSetting("variable_horizon_dense", "turngym/VariableHorizon-v0",
                          {"continue_rewards": DENSE_PROCESS_REWARDS}))


class NoOracleError(ValueError):
    """The env has no exact oracle (no TabularMDP), so J cannot be computed exactly."""


def tabular_helpers() -> Any:
    """benchmarks/credit_learning.py as a module (benchmarks/ is no package): its summary helpers are reused."""
    spec = importlib.util.spec_from_file_location("credit_learning", ROOT / "benchmarks" / "credit_learning.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ the env and its oracle


def make_env(setting: OracleSetting) -> Any:
    import gymnasium as gym

    import turngym  # noqa: F401  (registers the envs)

    return gym.make(setting.env_id, **setting.kwargs)


def oracle_env(setting: OracleSetting) -> Any:
    """The unwrapped env, refused unless it carries a TabularMDP (the only thing exact J can be computed on)."""
    try:
        env = make_env(setting).unwrapped
    except Exception as exc:  # an unknown id or bad kwargs: still one line
        raise NoOracleError(f"cannot make env {setting.env_id!r}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(getattr(env, "mdp", None), TabularMDP):
        oracles = ", ".join(sorted({s.env_id for s in SETTINGS}))
        raise NoOracleError(f"env {setting.env_id!r} has no exact oracle (no TabularMDP), so its J cannot be computed "
                            f"exactly; exact J needs one of {oracles}")
    return env


@dataclass(frozen=True)
class HistoryTree:
    """The MDP unrolled into histories: ``mdp`` has one node per distinct prompt (same actions and outcomes as
    the MDP node it is at), ``contexts`` its prompt token ids, ``replies`` per action the reply's ids (action
    token(s) + EOS); ``index`` maps a prompt to its node."""

    mdp: TabularMDP
    contexts: tuple[tuple[int, ...], ...]
    replies: tuple[tuple[tuple[int, ...], ...], ...]
    state: tuple[int, ...]  # the MDP node of each history
    index: dict[tuple[int, ...], int]


def add_action_tokens(model: Any, tok: Any, mdp: TabularMDP, seed: int = 0) -> None:
    """Every action name one token (new rows drawn at random with ``seed``): why, see the module docstring."""
    import torch

    names = sorted({a for n in mdp.nodes for a in n.actions})
    tok.add_tokens([a for a in names if len(tok.encode(a, add_special_tokens=False)) != 1])
    old = model.get_input_embeddings().weight.shape[0]
    if len(tok) == old:
        return
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        gen = torch.Generator().manual_seed(seed)
        std = float(emb[:old].std())
        emb[old:] = torch.randn(emb.shape[0] - old, emb.shape[1], generator=gen) * std


def history_tree(env: Any, tok: Any) -> HistoryTree:
    """Walk every history of the env's MDP, building each prompt's ids as the rollout runner does
    (chat-template prompt, then per turn: the reply's ids and the observation's ids)."""
    from turngym.agents.tokenization import ConversationTokenizer

    mdp: TabularMDP = env.mdp
    conv = ConversationTokenizer(tok)
    eos = tok.eos_token_id
    first = tuple(conv.prompt_ids(env.make_prompt(env.get_item(0))))
    reply = {a: tuple(tok.encode(a, add_special_tokens=False)) + (eos,) for n in mdp.nodes for a in n.actions}
    contexts, states, kids = [first], [mdp.start], []
    i = 0
    while i < len(contexts):  # breadth first: children get later indices, one turn on
        node = mdp.nodes[states[i]]
        row = []
        for a, outs in zip(node.actions, node.outcomes, strict=True):
            nxt = []
            for o in outs:
                if o.next is None:
                    nxt.append(None)
                    continue
                obs = conv.observation_ids(env._describe(o.next), env.observation_role, reply[a])
                contexts.append(contexts[i] + reply[a] + tuple(obs))
                states.append(o.next)
                nxt.append(len(contexts) - 1)
            row.append(nxt)
        kids.append(row)
        i += 1
    nodes = []
    for h, (s, row) in enumerate(zip(states, kids, strict=True)):
        node = mdp.nodes[s]
        outcomes = tuple(tuple(Outcome(o.prob, o.reward, k) for o, k in zip(outs, nxt, strict=True))
                         for outs, nxt in zip(node.outcomes, row, strict=True))
        nodes.append(Node(f"{node.name}#{h}", node.t, node.actions, outcomes))
    tree = TabularMDP(f"{mdp.name} histories", tuple(nodes))
    replies = tuple(tuple(reply[a] for a in mdp.nodes[s].actions) for s in states)
    return HistoryTree(tree, tuple(contexts), replies, tuple(states), {c: h for h, c in enumerate(contexts)})


def reply_logps(model: Any, tree: HistoryTree, histories: Sequence[int]) -> list[np.ndarray]:
    """log p_LM(reply | prompt) of every legal reply at each of ``histories``: one padded forward pass."""
    import torch

    seqs, spans = [], []
    for h in histories:
        for r in tree.replies[h]:
            seqs.append(tree.contexts[h] + r)
            spans.append((len(tree.contexts[h]), len(r)))
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits.float()
    model.train(was_training)
    logp = torch.log_softmax(logits, dim=-1).cpu()
    totals = [float(sum(logp[row, p - 1 + k, seqs[row][p + k]] for k in range(n)))
              for row, (p, n) in enumerate(spans)]
    out, pos = [], 0
    for h in histories:
        n = len(tree.replies[h])
        out.append(np.asarray(totals[pos:pos + n]))
        pos += n
    return out


@dataclass(frozen=True)
class ExactJ:
    """J of the LM's legal-normalised policy, the visit-weighted raw probability of the legal replies, and
    π(a | history) at every history (the sampler reuses it while the weights are unchanged)."""

    j: float
    legal_mass: float
    probs: tuple[np.ndarray, ...] = field(repr=False, default=())


def exact_j(model: Any, tree: HistoryTree) -> ExactJ:
    """Dynamic programme on the history tree with the LM's reply log-probs as softmax logits (the softmax is the
    normalisation over the legal replies)."""
    logps = reply_logps(model, tree, range(len(tree.mdp.nodes)))
    exact = solve(tree.mdp, np.concatenate(logps))
    mass = np.array([float(np.exp(lp).sum()) for lp in logps])
    probs = tuple(exact.probs[h, :len(lp)] for h, lp in enumerate(logps))
    return ExactJ(float(exact.v[tree.mdp.start]), float(exact.visit @ mass / exact.visit.sum()), probs)


def legal_probs(model: Any, tree: HistoryTree, histories: Sequence[int]) -> list[np.ndarray]:
    """π(a | history): the LM's reply probabilities normalised over the legal replies."""
    out = []
    for lp in reply_logps(model, tree, histories):
        e = np.exp(lp - lp.max())
        out.append(e / e.sum())
    return out


def return_range(mdp: TabularMDP) -> tuple[float, float]:
    """The lowest and highest return of any episode (what J must lie between)."""
    lo, hi = np.zeros(len(mdp.nodes)), np.zeros(len(mdp.nodes))
    for i in range(len(mdp.nodes) - 1, -1, -1):
        vals = [[o.reward + ((lo, hi)[side][o.next] if o.next is not None else 0.0) for o in outs]
                for outs in mdp.nodes[i].outcomes for side in (0, 1)]
        lo[i] = min(min(v) for v in vals[0::2])
        hi[i] = max(max(v) for v in vals[1::2])
    return float(lo[mdp.start]), float(hi[mdp.start])


# ------------------------------------------------------------------ training


def lm_trainer_class() -> type:
    """TurnGRPOTrainer whose single-turn generator draws one legal reply from the legal-normalised LM policy."""
    from turngym.training.trainer import TurnGRPOTrainer

    class OracleLMTrainer(TurnGRPOTrainer):
        tree: HistoryTree
        rng: np.random.Generator
        exact: tuple[int, ExactJ] | None = None  # (global step, the exact pass made with that step's weights)

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            keys = [tuple(p) for p in prompt_ids]
            if missing := [k for k in keys if k not in self.tree.index]:
                raise RuntimeError(f"a prompt of {len(missing[0])} tokens is not in the oracle's history tree: the "
                                   "runner built it differently from history_tree()")
            hs = [self.tree.index[k] for k in keys]
            if self.exact is not None and self.exact[0] == self.state.global_step:  # same weights: same numbers
                probs = [self.exact[1].probs[h] for h in hs]
            else:
                probs = legal_probs(self.model, self.tree, hs)
            picks = [int(self.rng.choice(len(p), p=p)) for p in probs]
            return [list(self.tree.replies[h][a]) for h, a in zip(hs, picks, strict=True)], None

    return OracleLMTrainer


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 40
    group: int = 8
    lr: float = 0.005
    model_seed: int = 0  # the tiny model's init and the action-token rows: one start for every seed


@dataclass
class Curve:
    """One (setting, arm, seed) run: exact J and legal mass before training and after every optimizer step."""

    setting: str
    arm: str
    seed: int
    j: list[float]
    legal_mass: list[float]
    wall_s: float
    cpu_s: float


def load_lm(setting: OracleSetting, cfg: TrainConfig) -> tuple[Any, Any, Any, HistoryTree]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir

    env = oracle_env(setting)
    d = str(tiny_model_dir(chat=True, seed=cfg.model_seed))
    torch.manual_seed(cfg.model_seed)
    model, tok = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), AutoTokenizer.from_pretrained(d)
    add_action_tokens(model, tok, env.mdp, cfg.model_seed)
    return env, model, tok, history_tree(env, tok)


def train_exact(model, tok, tree, *, env_factory, reward, dataset, estimator: str, seed: int, steps: int,
                group: int, lr: float, max_episode_tokens: int) -> tuple[Any, list[float], list[float]]:
    """Train ``model`` under TurnGRPOTrainer for ``steps`` optimizer steps, the LM's exact J (and its legal mass)
    on ``tree`` before training and after every step; returns the trainer, the J curve and the mass curve.
    The loop the oracle settings and the real-env arm (credit_learning_real.py) both run."""
    import tempfile

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    first = exact_j(model, tree)
    js, mass = [first.j], [first.legal_mass]
    holder: dict[str, Any] = {}

    class ExactJCallback(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            e = exact_j(model, tree)
            js.append(e.j)
            mass.append(e.legal_mass)
            holder["trainer"].exact = (state.global_step, e)

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="lmcurve-"), per_device_train_batch_size=group,
                      num_generations=group, max_completion_length=8, max_steps=steps, logging_steps=1,
                      report_to="none", use_cpu=True, learning_rate=lr, save_strategy="no", seed=seed,
                      temperature=1.0, beta=0.0, disable_tqdm=True, lr_scheduler_type="constant",
                      gradient_checkpointing=False)
    tr = lm_trainer_class()(model=model, processing_class=tok, env_factory=env_factory, reward=reward, args=args,
                            train_dataset=dataset, estimator=estimator, max_episode_tokens=max_episode_tokens,
                            stop=(), callbacks=[ExactJCallback()])
    tr.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    tr.tree, tr.rng, tr.exact = tree, np.random.default_rng(seed), (0, first)
    holder["trainer"] = tr
    tr.train()
    return tr, js, mass


def train_curve(setting: OracleSetting, arm: str, seed: int, cfg: TrainConfig) -> Curve:
    """Train one seed for ``cfg.steps`` optimizer steps; exact J after each."""
    from turngym.rewards import get_reward
    from turngym.training.trainer import task_dataset

    wall, cpu = time.perf_counter(), time.process_time()
    _, model, tok, tree = load_lm(setting, cfg)
    _, js, mass = train_exact(model, tok, tree, env_factory=lambda: make_env(setting), reward=get_reward("env"),
                              dataset=task_dataset([0] * cfg.group), estimator=arm, seed=seed, steps=cfg.steps,
                              group=cfg.group, lr=cfg.lr, max_episode_tokens=1024)
    return Curve(setting.name, arm, seed, js, mass, time.perf_counter() - wall, time.process_time() - cpu)


def _worker_init() -> None:
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)


def _job(job: tuple[OracleSetting, str, int, TrainConfig]) -> Curve:
    return train_curve(*job)


def run_jobs(job: Callable[[Any], Any], jobs: Sequence[Any], workers: int, sink: Path | None,
             line: Callable[[Any, float], str]) -> list:
    """``job`` over ``jobs`` on ``workers`` spawned single-threaded processes; each result (a dataclass) appended
    to ``sink`` (JSON lines) as it finishes and announced by ``line(result, seconds since the start)``."""
    import multiprocessing as mp

    start = time.perf_counter()
    out = []
    with mp.get_context("spawn").Pool(workers, initializer=_worker_init) as pool:
        for c in pool.imap_unordered(job, jobs):
            out.append(c)
            if sink is not None:
                with sink.open("a") as fh:
                    fh.write(json.dumps(asdict(c)) + "\n")
            print(line(c, time.perf_counter() - start), flush=True)
    return out


def run_all(settings: Sequence[OracleSetting], arms: Sequence[str], seeds: Sequence[int], cfg: TrainConfig,
            workers: int, sink: Path | None = None) -> list[Curve]:
    """Every (setting, arm, seed), over ``workers`` single-threaded processes; seed-major, so a run cut short
    still has whole seeds; each curve is appended to ``sink`` (JSON lines) as it finishes."""
    jobs = [(s, a, seed, cfg) for seed in seeds for s in settings for a in arms]
    return run_jobs(_job, jobs, workers, sink, lambda c, t: (
        f"[{t:6.0f} s] {c.setting:>22} {c.arm:>8} seed {c.seed:>2}: J {c.j[0]:.3f} -> {c.j[-1]:.3f} "
        f"(legal mass {c.legal_mass[-1]:.3f}; {c.wall_s:.1f} s wall)"))


# ------------------------------------------------------------------ summaries and outputs


@dataclass(frozen=True)
class SettingInfo:
    j_star: float
    j_start: float
    return_range: tuple[float, float]


def setting_info(setting: OracleSetting, cfg: TrainConfig) -> SettingInfo:
    cl = tabular_helpers()
    env, model, _, tree = load_lm(setting, cfg)
    return SettingInfo(cl.optimal_value(env.mdp), exact_j(model, tree).j, return_range(env.mdp))


def summarise_all(curves: Sequence[Curve], infos: dict[str, SettingInfo], cfg: TrainConfig) -> dict:
    cl = tabular_helpers()
    res: dict = {"steps": cfg.steps, "group": cfg.group, "lr": cfg.lr, "model_seed": cfg.model_seed, "settings": {}}
    for name, info in infos.items():
        row = {"j_star": info.j_star, "j_start": info.j_start, "return_range": list(info.return_range), "arms": {}}
        for arm in sorted({c.arm for c in curves if c.setting == name}, key=ARMS.index):
            mine = sorted((c for c in curves if c.setting == name and c.arm == arm), key=lambda c: c.seed)
            js = np.array([c.j for c in mine])
            a = cl.summarise(js, info.j_star, [c.seed for c in mine])
            a["legal_mass_final"] = float(np.mean([c.legal_mass[-1] for c in mine]))
            a["wall_s_per_step"] = float(np.mean([c.wall_s for c in mine]) / cfg.steps)
            a["cpu_s_per_step"] = float(np.mean([c.cpu_s for c in mine]) / cfg.steps)
            row["arms"][arm] = a
        res["settings"][name] = row
    return res


def power_line(name: str, row: dict, arms: Sequence[str], seeds: int, worst: str | None = None) -> str | None:
    """Seeds per arm a two-sided t test (α 0.05, power 0.8) needs to separate the best arm's final J from the
    worst's (or from ``worst``'s), at the observed spread and difference."""
    finals = {a: row["arms"][a] for a in arms if a in row["arms"]}
    if len(finals) < 2 or seeds < 2 or (worst is not None and worst not in finals):
        return None
    best = max((a for a in finals if a != worst), key=lambda a: finals[a]["final"])
    worst = worst or min(finals, key=lambda a: finals[a]["final"])
    diff = finals[best]["final"] - finals[worst]["final"]
    t = tabular_helpers().t_quantile(seeds)
    sd = [finals[a]["final_half"] * np.sqrt(seeds) / t for a in (best, worst)]
    pooled = float(np.sqrt((sd[0] ** 2 + sd[1] ** 2) / 2))
    if diff <= 0 or pooled == 0:
        return f"{name}: {best} − {worst} = {diff:.4f} (no difference to detect)"
    need = int(np.ceil(2 * ((1.96 + 0.8416) * pooled / diff) ** 2))
    return (f"{name}: {best} − {worst} = {diff:.3f} (seed sd {pooled:.3f}) → about {need} seeds per arm for 80% power "
            f"(have {seeds})")


def table_lines(res: dict, seeds: Sequence[int], arms: Sequence[str]) -> list[str]:
    cl = tabular_helpers()
    n = len(seeds)
    lines = [f"Tiny random-init LM (TurnGRPOTrainer), {res['steps']} optimizer steps, {n} seeds ({seeds[0]}–{seeds[-1]}), "
             f"groups of {res['group']}, Adam lr {res['lr']}. Cell format as the tabular table: final J (mean of the "
             "last 10 steps) ± 95% t interval [range over seeds] (steps to 90% of J* − J_start; stuck seeds).", "",
             "| setting | J start → J* | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
    for name, row in res["settings"].items():
        lines.append(f"| {name} | {row['j_start']:.3f} → {row['j_star']:.3f} | "
                     + " | ".join(cl.cell(row["arms"][a]) if a in row["arms"] else "" for a in arms) + " |")
    costs = [a for row in res["settings"].values() for a in row["arms"].values()]
    lines += ["", f"Per optimizer step (incl. the exact-J pass and trainer start-up, one process per run, one thread): "
              f"wall {np.mean([a['wall_s_per_step'] for a in costs]):.2f} s, "
              f"CPU {np.mean([a['cpu_s_per_step'] for a in costs]):.2f} s (mean over runs)."]
    mass = [a["legal_mass_final"] for a in costs]
    lines.append(f"Raw LM probability of the legal replies at the end (visit-weighted; conditioned away by the sampler): "
                 f"{min(mass):.2e} to {max(mass):.2e}.")
    stuck = [f"{name} {a}: " + ("all seeds" if len(s["stuck"]) == n else
                                "seeds " + ", ".join(f"{x['seed']} (J {x['final']:.2f})" for x in s["stuck"]))
             for name, row in res["settings"].items() for a, s in row["arms"].items() if s["stuck"]]
    if stuck:
        lines += ["", "Stuck seeds: " + "; ".join(stuck) + "."]
    power = [p for name, row in res["settings"].items() if (p := power_line(name, row, arms, n))]
    if power:
        lines += ["", "Power (seeds needed to separate the best arm's final J from the worst's): " + "; ".join(power) + "."]
    power = [p for name, row in res["settings"].items() if (p := power_line(name, row, arms, n, worst="turn"))]
    if power:
        lines += ["", "Power against `turn` (the best other arm's final J against turn's): " + "; ".join(power) + "."]
    return lines


def write_outputs(curves: Sequence[Curve], res: dict, seeds: Sequence[int], arms: Sequence[str], out: Path,
                  stem: str = "credit_learning_lm") -> None:
    res = {**res, "seeds": list(seeds), "arms": list(arms)}
    summary = {**res, "settings": {n: {**row, "arms": {a: {k: v for k, v in s.items() if k not in ("mean", "half")}
                                                        for a, s in row["arms"].items()}}
                                   for n, row in res["settings"].items()}}
    summary["curves"] = [{**asdict(c), "j": [round(x, 6) for x in c.j],
                          "legal_mass": [float(f"{x:.4g}") for x in c.legal_mass]} for c in curves]
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    with (out / f"{stem}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["setting", "estimator", "step", "mean_return", "ci95_half"])
        for name, row in res["settings"].items():
            for arm, a in row["arms"].items():
                for k, (m, h) in enumerate(zip(a["mean"], a["half"], strict=True)):
                    if k % CSV_EVERY == 0 or k == len(a["mean"]) - 1:
                        w.writerow([name, arm, k, f"{m:.4f}", f"{h:.4f}"])
    lines = table_lines(res, seeds, arms)
    write_table(out, stem, lines)
    print("\n".join(lines))
    plot(res, out / f"{stem}.png")


def write_table(out: Path, stem: str, lines: Sequence[str]) -> None:
    """Into ``credit_learning.md`` between its ``<!-- {stem} table -->`` markers where it has them (the docs page
    holds the tabular and the LM tables side by side), else into ``{stem}.md``."""
    begin, end = f"<!-- {stem} table: begin -->", f"<!-- {stem} table: end -->"
    page = out / "credit_learning.md"
    text = page.read_text() if page.exists() else ""
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        page.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + rest.partition(end)[2])
    else:
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["settings"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        row = res["settings"][name]
        for arm, a in row["arms"].items():
            m, h = np.asarray(a["mean"]), np.asarray(a["half"])
            x = np.arange(len(m))
            ax.plot(x, m, "--" if arm == "turn" else "-", label=arm, linewidth=1.3)
            ax.fill_between(x, m - h, m + h, alpha=0.15)
        ax.axhline(row["j_star"], color="black", linewidth=0.6)
        ax.set_title(f"{name} (LM)", fontsize=10)
        ax.set_xlabel("optimizer step")
    axes[0][0].set_ylabel("exact J of the LM's policy")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_settings(names: str, env: str | None) -> list[OracleSetting]:
    if env:
        return [OracleSetting(env.rsplit("/", 1)[-1], env)]
    known = {s.name: s for s in SETTINGS}
    if unknown := [n for n in names.split(",") if n not in known]:
        raise NoOracleError(f"unknown setting(s) {unknown}; the settings are {sorted(known)}")
    return [known[n] for n in names.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--settings", default=",".join(s.name for s in SETTINGS))
    ap.add_argument("--env", help="a registered env id instead of --settings (refused unless it has an exact oracle)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="variable_horizon_dense, grpo and turn, 2 seeds, 4 steps")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--name", default="credit_learning_lm", help="the outputs' file stem")
    ap.add_argument("--from-curves", help="summarise the whole seeds of a saved run (its curves JSONL, or its JSON) "
                    "instead of training")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.settings, args.arms = 4, 2, "variable_horizon_dense", "grpo,turn"
    cfg = TrainConfig(steps=args.steps, group=args.group, lr=args.lr)
    arms = args.arms.split(",")
    try:
        settings = parse_settings(args.settings, args.env)
        for s in settings:
            oracle_env(s)
    except NoOracleError as exc:
        raise SystemExit(f"credit_learning_lm: {exc}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    infos = {s.name: setting_info(s, cfg) for s in settings}
    if args.from_curves:
        curves, seeds = whole_seeds(load_curves(Path(args.from_curves)), settings, arms)
        print(f"{len(seeds)} whole seeds in {args.from_curves}: {seeds}", flush=True)
    else:
        sink = out / f"{args.name}_curves.jsonl"
        sink.write_text("")
        start = time.perf_counter()
        curves = run_all(settings, arms, seeds, cfg, args.workers, sink)
        print(f"total wall {time.perf_counter() - start:.0f} s", flush=True)
    write_outputs(curves, summarise_all(curves, infos, cfg), seeds, arms, out, args.name)


def load_curves(path: Path) -> list[Curve]:
    """From the run's curves sink (JSON lines) or from its summary JSON (which holds them too)."""
    if path.suffix == ".json":
        return [Curve(**c) for c in json.loads(path.read_text())["curves"]]
    return [Curve(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def whole_seeds(curves: Sequence[Curve], settings: Sequence[OracleSetting],
                arms: Sequence[str]) -> tuple[list[Curve], list[int]]:
    """The curves of the seeds finished for every (setting, arm): a run cut short is summarised on those."""
    want = {(s.name, a) for s in settings for a in arms}
    seeds = sorted(seed for seed in {c.seed for c in curves}
                   if want <= {(c.setting, c.arm) for c in curves if c.seed == seed})
    return [c for c in curves if c.seed in seeds and (c.setting, c.arm) in want], seeds

if __name__ == "__main__":
    sys.exit(main())
