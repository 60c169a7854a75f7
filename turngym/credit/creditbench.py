"""``turngym creditbench``: rewards scored on episodes whose per-turn value is planted.

Scripted policies play groups of episodes through the real envs; each tool turn is useful
(label 1) or useless (label 0) by construction, and the final answer depends on the
useful turns, so the truth is causal, not a correlate:

- **SearchQA-v0** (HotpotQA, default BM25 index, Search-R1 tags): a label-1 search issues
  the item's own question, which retrieves a passage holding a gold answer on the index in
  use; a label-0 search issues another item's question, which retrieves none. Both are
  checked on the index while the items are chosen. The answer is gold when a label-1 search
  happened, else one of two plausible wrong answers (other items' golds); with probability
  ``noise`` the answer flips, so groups hold several answer clusters.
- **MathCode-v0** (GSM8K items whose reference solution has exactly two calculator steps):
  label-1 cells compute the solution's intermediates in order; label-0 cells compute
  something irrelevant or fail (NameError). The boxed answer is the last intermediate
  computed (gold after both steps, the first intermediate after one, a wrong guess after
  none), with the same noise.
- **BFCL-v0** (multi_turn_base, prompting format): per user turn, the ground-truth calls
  (label 1) or the same calls with one argument value changed, which bfcl-eval's checker
  rejects (label 0); then a plain reply ends the user turn (unlabelled).

Two designs (``BenchConfig.designs``): ``random`` (above: each tool turn useful with
probability ``p_useful``, so useless turns sit mostly in failing episodes and an episode-level
reward earns pooled credit from that correlation alone) and ``contrast`` (SearchQA and MathCode:
every episode holds useful and useless tool turns, the same numbers of each, in both orders:
SearchQA one useful and one useless search, useful first in even episodes and last in odd ones;
MathCode the two solution steps with one useless cell, first in even episodes and last in odd
ones; the answer is gold up to ``noise``; with an even ``k`` the orders balance). On ``contrast``
every episode-level credit scores AUC 0.5 exactly, pooled and within episodes, and so do the
position baselines within episodes: what is left is turn-level credit.

The planted label is written to ``Turn.truth["planted"]`` (source ``planted``); rewards score
episodes through :func:`turngym.truth.reward_view`, which holds no truth. ``BenchConfig.truth``
scores against another key the episodes carry (e.g. SearchQA's ``retrieval_hit``).

Every reward scores every group; its rewards become advantages through the estimator it is
paired with in training (:mod:`turngym.credit.accuracy`) and through each of ``estimators``, and
credit accuracy is measured on those advantages (pooled AUC label 1 vs 0, within-episode AUC,
Spearman ρ, group-bootstrap intervals; :mod:`turngym.credit.table` adds the label-free
baselines), on the raw turn rewards where they vary, and one turn later (does the credit land on
the turn after the useful one?). Raw rewards are scored only where they vary on the labelled turns
(an episode-level reward sits on the final turn, which is never labelled). Also reported: mean
within-group variance of episode reward totals.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from turngym.credit.accuracy import (
    credit_score,
    episode_pairs,
    group_advantages,
    varies,
)
from turngym.credit.table import (
    LEGEND,
    baseline_scores,
    best_baseline,
    estimator_scores,
    estimators_for,
    mark_against,
    table,
)
from turngym.episode import Episode, EpisodeWriter, reward_view, turn_labels
from turngym.truth import TruthMap, TruthValue

TRUTH_KEY = "planted"
ENVS = ("searchqa", "mathcode", "bfcl")
DESIGNS = ("random", "contrast")
CONTRAST_ENVS = ("searchqa", "mathcode")
# the subsets the planted groups are built on (fixed: the scripted plays are written for them), recorded in
# each summary's config
SUBSETS = {"searchqa_dataset": "hotpotqa", "search_turns": 2, "mathcode_dataset": "gsm8k",
           "bfcl_category": "multi_turn_base", "bfcl_max_user_turns": 4}


@dataclass
class BenchConfig:
    envs: tuple[str, ...] = ENVS
    groups: int = 8  # per env
    k: int = 4  # episodes per group
    seed: int = 0
    p_useful: float = 0.5  # chance a tool turn is useful
    noise: float = 0.15  # chance the final answer ignores the evidence
    retriever: Any = None  # None: the default index
    designs: tuple[str, ...] = ("random",)
    truth: str = TRUTH_KEY  # the truth key scored (the planted label, or an env's own, e.g. retrieval_hit)
    truth_map: str | None = None  # value -> label, e.g. "+1:1,-1:0,0:skip"; None: values must be binary
    estimators: tuple[str, ...] = ()  # scored besides each reward's declared estimator

    def __post_init__(self) -> None:
        bad = [d for d in self.designs if d not in DESIGNS]
        if bad or not self.designs:
            raise ValueError(f"unknown creditbench design(s) {bad or '(none)'}; choose from {list(DESIGNS)}")
        if self.truth_map is not None:
            TruthMap.parse(self.truth_map)  # refused here, before anything is built
        unknown = [e for e in self.envs if e not in ENVS]
        if unknown:
            raise ValueError(f"unknown creditbench env(s) {unknown}; choose from {list(ENVS)}")
        if self.groups < 2 or self.k < 2:
            raise ValueError("creditbench needs groups >= 2 and k >= 2 (advantages are relative within a group)")
        if not 0 <= self.noise < 0.5 or not 0 < self.p_useful < 1:
            raise ValueError("noise must be in [0, 0.5) and p_useful in (0, 1)")


def planted_labels(ep: Episode) -> list[int | None]:
    return turn_labels(ep, TRUTH_KEY)


def _play(env: Any, options: dict[str, Any], seed: int, actions: Sequence[tuple[str, int | None]]) -> Episode:
    """Step the real env through scripted actions, recording each turn's planted label."""
    env.reset(seed=seed, options=options)
    for text, label in actions:
        _, _, terminated, truncated, _ = env.step(text)
        if label is not None:
            env.unwrapped.episode.turns[-1].truth[TRUTH_KEY] = TruthValue(int(label), "planted")
        if terminated or truncated:
            break
    ep = copy.deepcopy(env.unwrapped.episode)
    ep.meta.update({"model": "scripted (creditbench)", "planted": True})
    return ep


def _rng(cfg: BenchConfig, env: str, *parts: Any) -> np.random.Generator:
    from turngym.agents.runner import derive_seed

    return np.random.default_rng(derive_seed(cfg.seed, "creditbench", env, *parts))


def _labels(rng: np.random.Generator, n: int, p: float) -> list[int]:
    return [int(x) for x in rng.random(n) < p]


# ------------------------------------------------------------------ SearchQA


_YES_NO = {"yes", "no"}


@dataclass
class SearchItem:
    index: int
    useful_query: str
    distractors: list[str]
    wrong_answers: list[str]


def searchqa_items(env: Any, cfg: BenchConfig) -> list[SearchItem]:
    """The first items (file order) whose own question retrieves a gold passage and for which two
    other items' questions retrieve none: the planted labels are true on the index in use."""
    from turngym.envs.search_qa import contains_answer
    from turngym.grading.qa import normalize_answer

    base = env.unwrapped
    n = base.num_items()
    chosen: list[SearchItem] = []
    for i in range(n):
        item = base.get_item(i)
        golds = [str(a) for a in item.get("answers", [])]
        if not golds or any(normalize_answer(g) in _YES_NO for g in golds):
            continue
        if not any(contains_answer(h.contents, golds) for h in base.retriever.search(item["question"], base.topk)):
            continue
        rng = _rng(cfg, "searchqa-item", i)
        others = [int(j) for j in rng.permutation(n) if j != i]
        distractors, wrong = [], []
        for j in others:
            other = base.get_item(j)
            if len(distractors) < 2 and not any(contains_answer(h.contents, golds)
                                                for h in base.retriever.search(other["question"], base.topk)):
                distractors.append(other["question"])
            cand = [str(a) for a in other.get("answers", [])][:1]
            if len(wrong) < 2 and cand and normalize_answer(cand[0]) not in _YES_NO | {normalize_answer(g) for g in golds}:
                wrong.append(cand[0])
            if len(distractors) == 2 and len(wrong) == 2:
                break
        if len(distractors) == 2 and len(wrong) == 2:
            chosen.append(SearchItem(i, item["question"], distractors, wrong))
        if len(chosen) == cfg.groups:
            break
    return chosen


def _contrast_searches(k: int) -> list[int]:
    """One useful and one useless search, useful first in even episodes, last in odd ones."""
    return [1, 0] if k % 2 == 0 else [0, 1]


def build_searchqa(cfg: BenchConfig, design: str = "random") -> list[list[Episode]]:
    import gymnasium

    contrast = design == "contrast"
    tag = "searchqa" + ("-contrast" if contrast else "")
    env = gymnasium.make("turngym/SearchQA-v0", dataset=SUBSETS["searchqa_dataset"], retriever=cfg.retriever,
                         max_turns=(2 if contrast else SUBSETS["search_turns"]) + 1)
    groups = []
    for item in searchqa_items(env, cfg):
        golds = [str(a) for a in env.unwrapped.get_item(item.index)["answers"]]
        group = []
        for k in range(cfg.k):
            rng = _rng(cfg, tag, item.index, k)
            labels = _contrast_searches(k) if contrast else _labels(rng, SUBSETS["search_turns"], cfg.p_useful)
            actions = []
            for t, lab in enumerate(labels):
                query = item.useful_query if lab else item.distractors[t % len(item.distractors)]
                actions.append((f"<think>I need more information to answer this.</think>\n<search> {query} </search>", lab))
            informed = any(labels)
            gold = informed != (rng.random() < cfg.noise)
            answer = golds[0] if gold else item.wrong_answers[int(rng.integers(0, len(item.wrong_answers)))]
            actions.append((f"<think>I can answer now.</think>\n<answer> {answer} </answer>", None))
            group.append(_play(env, {"index": item.index, "episode_id": f"creditbench|{tag}|{item.index}#{k}",
                                     "group": f"creditbench|{tag}|{item.index}"}, k, actions))
        groups.append(group)
    env.close()
    return groups


# ------------------------------------------------------------------ MathCode

_STEP = re.compile(r"<<([^=<>]+)=([^<>]+)>>")


def gsm8k_steps(solution: str) -> list[tuple[str, float]]:
    """The calculator annotations ``<<expr=value>>`` of a GSM8K reference solution, checked by evaluation."""
    import ast

    steps = []
    for expr, value in _STEP.findall(solution):
        try:
            tree = ast.parse(expr.strip(), mode="eval")
            if not all(isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop))
                       for n in ast.walk(tree)):
                return []
            got = eval(compile(tree, "<gsm8k>", "eval"), {"__builtins__": {}})  # arithmetic only, checked above
            if abs(float(got) - float(value)) > 1e-6:
                return []
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            return []
        steps.append((expr.strip(), float(value)))
    return steps


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _contrast_cells(k: int) -> list[int]:
    """The two solution steps and one useless cell, first in even episodes and last in odd ones (an even
    ``k`` balances the orders, so position scores exactly 0.5 within episodes)."""
    return [0, 1, 1] if k % 2 == 0 else [1, 1, 0]


def build_mathcode(cfg: BenchConfig, design: str = "random") -> list[list[Episode]]:
    import gymnasium

    contrast = design == "contrast"
    tag = "mathcode" + ("-contrast" if contrast else "")

    env = gymnasium.make("turngym/MathCode-v0", dataset=SUBSETS["mathcode_dataset"], max_turns=5, prompt_style="chat",
                         grading_timeout_s=60.0)  # a loaded machine must not turn a verdict into a timeout
    base = env.unwrapped
    solutions = gsm8k_solutions() if SUBSETS["mathcode_dataset"] == "gsm8k" else {}
    groups = []
    for i in range(base.num_items()):
        if len(groups) == cfg.groups:
            break
        item = base.get_item(i)
        steps = gsm8k_steps(solutions.get(str(item.get("id")), ""))
        golds = [str(a) for a in item.get("answers", [])]
        if len(steps) != 2 or not golds or _number(steps[-1][1]) != golds[0].replace(",", ""):
            continue
        first, final = _number(steps[0][1]), _number(steps[1][1])
        guess = _number(steps[1][1] + 10)
        if first == final:
            continue
        group = []
        for k in range(cfg.k):
            rng = _rng(cfg, tag, i, k)
            labels = _contrast_cells(k) if contrast else _labels(rng, 3, cfg.p_useful)
            actions, done = [], 0
            for t, lab in enumerate(labels):
                if lab and done < 2:
                    expr = steps[done][0]
                    done += 1
                    code = f"step{done} = {expr}\nprint(step{done})"
                elif lab:  # both intermediates known: recompute the last one (still the needed value)
                    code = f"check = {steps[1][0]}\nprint(check)"
                elif (t + k) % 2:
                    code = f"words = {len(item['question'].split())}\nprint(words * 2)"
                else:
                    code = "print(total_cost / count)"  # fails: NameError
                actions.append((f"Let me compute the next quantity.\n```python\n{code}\n```", lab))
            answer = {0: guess, 1: first, 2: final}[done]
            if rng.random() < cfg.noise:
                answer = final if answer != final else guess
            actions.append((f"The answer is \\boxed{{{answer}}}.", None))
            group.append(_play(env, {"index": i, "episode_id": f"creditbench|{tag}|{i}#{k}",
                                     "group": f"creditbench|{tag}|{i}"}, k, actions))
        groups.append(group)
    env.close()
    return groups


def gsm8k_solutions() -> dict[str, str]:
    """Item id → GSM8K's reference solution (the ``answer`` field of the embedded test file)."""
    from importlib.resources import files

    out = {}
    for line in files("turngym").joinpath("data/math/gsm8k/test.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[f"gsm8k-test-{row['idx']}"] = str(row.get("answer", ""))
    return out


# ------------------------------------------------------------------ BFCL


def _mutated(calls: list[dict[str, dict[str, Any]]]) -> list[dict[str, dict[str, Any]]] | None:
    """The same calls with the first argument value of the first call that has one changed."""
    for n, c in enumerate(calls):
        name, args = next(iter(c.items()))
        if args:
            key = min(args)
            v = args[key]
            new = (not v) if isinstance(v, bool) else v + 7 if isinstance(v, (int, float)) else \
                v + "_x" if isinstance(v, str) else (v[:-1] if v else ["x"]) if isinstance(v, list) else "x"
            out = [dict(x) for x in calls]
            out[n] = {name: {**args, key: new}}
            return out
    return None


END_TURN = "I have finished this request."


def _bfcl_actions(per_turn: list, choice: list) -> list[tuple[str, int | None]]:
    from turngym.envs.bfcl.calls import render_prompting

    actions: list[tuple[str, int | None]] = []
    for _, (text_calls, lab) in zip(per_turn, choice, strict=True):
        if text_calls:
            actions.append((render_prompting(text_calls), lab))
        actions.append((END_TURN, None))
    return actions


def _rejected(env: Any, index: int, per_turn: list, u: int, bad: list) -> bool:
    """Does the checker reject user turn ``u`` played with ``bad`` after correct turns?"""
    choice = [(c, None) for c in per_turn]
    choice[u] = (bad, None)
    ep = _play(env, {"index": index}, 0, _bfcl_actions(per_turn[:u + 1], choice[:u + 1]))
    closing = [t for t in ep.turns if "bfcl_turn_valid" in t.metrics]
    return len(closing) > u and closing[u].metrics["bfcl_turn_valid"] is False


def build_bfcl(cfg: BenchConfig) -> list[list[Episode]]:
    import gymnasium

    from turngym.envs.bfcl.calls import calls_from_strings

    env = gymnasium.make("turngym/BFCL-v0", category=SUBSETS["bfcl_category"], tool_format="prompting")
    base = env.unwrapped
    groups = []
    for i in range(base.num_items()):
        if len(groups) == cfg.groups:
            break
        env.reset(seed=0, options={"index": i})
        truth = base.context.ground_truth or []
        if not 2 <= len(truth) <= SUBSETS["bfcl_max_user_turns"]:
            continue
        per_turn = [calls_from_strings(t, base.session.parameters) if t else [] for t in truth]
        wrong = [_mutated(c) if c else None for c in per_turn]
        for u, bad in enumerate(wrong):  # keep only mutations bfcl-eval's checker rejects after a correct history
            if bad is not None and not _rejected(env, i, per_turn, u, bad):
                wrong[u] = None
        if sum(w is not None for w in wrong) < 2:
            continue
        group = []
        for k in range(cfg.k):
            rng = _rng(cfg, "bfcl", i, k)
            choice = []
            for calls, bad in zip(per_turn, wrong, strict=True):
                lab = int(rng.random() < cfg.p_useful) if bad is not None else None
                choice.append((calls if lab != 0 else bad, lab))
            actions = _bfcl_actions(per_turn, choice)
            group.append(_play(env, {"index": i, "episode_id": f"creditbench|bfcl|{i}#{k}",
                                     "group": f"creditbench|bfcl|{i}"}, k, actions))
        groups.append(group)
    env.close()
    return groups


BUILDERS: dict[str, Callable[[BenchConfig], list[list[Episode]]]] = {
    "searchqa": build_searchqa, "mathcode": build_mathcode, "bfcl": build_bfcl}


def build(cfg: BenchConfig) -> dict[str, list[list[Episode]]]:
    """Groups per benchmark set: ``<env>`` for the random design, ``<env>-contrast`` for the contrast one
    (SearchQA and MathCode; BFCL has no contrast design and is built once, random)."""
    out: dict[str, list[list[Episode]]] = {}
    for design in cfg.designs:
        for name in cfg.envs:
            if design == "random":
                out[name] = BUILDERS[name](cfg)
            elif name in CONTRAST_ENVS:
                out[f"{name}-contrast"] = BUILDERS[name](cfg, design)
    return out


# ------------------------------------------------------------------ scoring


def labels_for(cfg: BenchConfig) -> Callable[[Episode], list[int | None]]:
    """Turn labels under the configured truth key and value map."""
    mapping = TruthMap.parse(cfg.truth_map) if cfg.truth_map else None
    return lambda ep: turn_labels(ep, cfg.truth, mapping)


def score_groups(groups: Sequence[Sequence[Episode]], rewards: dict[str, Any],
                 labels_of: Callable[[Episode], list[int | None]] = planted_labels,
                 n_boot: int = 1000, seed: int = 0,
                 rewards_out: dict[str, list[list[list[float]]]] | None = None,
                 estimators: Sequence[str] = (), baselines: dict[str, dict[str, Any]] | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Credit accuracy of every reward on ``groups`` against ``labels_of`` (one env's groups), under its
    declared estimator and each of ``estimators``, each marked against the best label-free baseline
    (``baselines``, computed here when not given). Rewards see the episodes through ``reward_view``
    (no truth). The per-turn rewards of each reward that scored go to ``rewards_out`` (by name, per group)."""
    labels = [[labels_of(e) for e in g] for g in groups]
    if baselines is None:
        baselines = baseline_scores(groups, labels, n_boot, seed)
    best = best_baseline(baselines)
    out: dict[str, Any] = {}
    for name, reward in rewards.items():
        start = time.perf_counter()
        try:
            scores = []  # per group, per episode, per turn
            for i, g in enumerate(groups):
                if progress is not None:
                    progress(f"{name}: group {i + 1}/{len(groups)}")
                scores.append(reward.score_group(reward_view(list(g))).rewards)
        except Exception as exc:  # noqa: BLE001 - one failing reward must not sink the others
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if rewards_out is not None:
            rewards_out[name] = scores
        by_est = {e: mark_against(sc, best) for e, sc in
                  estimator_scores(scores, labels, estimators_for(reward, estimators), n_boot, seed).items()}
        advantages = [group_advantages(reward.estimator, r) for r in scores]
        totals = [[sum(ep) for ep in r] for r in scores]
        variances = [float(np.var(t, ddof=1)) for t in totals if len(t) > 1]
        row: dict[str, Any] = {
            "estimator": reward.estimator,
            "advantage": by_est[reward.estimator],
            "by_estimator": by_est,
            "advantage_next_turn": credit_score([episode_pairs(a, lab, lag=1)
                                                 for a, lab in zip(advantages, labels, strict=True)],
                                                n_boot, seed).to_dict(),
            "group_reward_variance": float(np.mean(variances)) if variances else None,
            "score_s": round(time.perf_counter() - start, 2),
        }
        raw_pairs = [episode_pairs(r, lab) for r, lab in zip(scores, labels, strict=True)]
        if varies([[x for g in raw_pairs for ep in g for x, _ in ep]]):  # only where raw rewards vary on labelled turns
            row["raw"] = credit_score(raw_pairs, n_boot, seed).to_dict()
            row["raw_next_turn"] = credit_score([episode_pairs(r, lab, lag=1) for r, lab in zip(scores, labels, strict=True)],
                                                n_boot, seed).to_dict()
        out[name] = row
    return out


def failures(summary: dict[str, Any]) -> dict[str, str]:
    """``env/reward`` → error for every reward that failed on an env of a creditbench summary."""
    return {f"{env}/{name}": w["error"] for env, e in summary["envs"].items() for name, w in e["rewards"].items()
            if "error" in w}


def run_creditbench(cfg: BenchConfig, rewards: dict[str, Any], out_dir: str | Path | None = None,
                    n_boot: int = 1000, built: dict[str, list[list[Episode]]] | None = None,
                    build_s: float | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build (unless ``built`` is given, then ``build_s`` says how long that took) and score; ``progress``
    is told each env × reward × group as it is scored."""
    start = time.perf_counter()
    if built is None:
        built = build(cfg)
        build_s = time.perf_counter() - start
    summary: dict[str, Any] = {"config": {**{k: v for k, v in asdict(cfg).items() if k != "retriever"}, **SUBSETS},
                               "retriever": "default index" if cfg.retriever is None else str(cfg.retriever),
                               "build_s": None if build_s is None else round(build_s, 2), "envs": {}}
    from turngym.training.scores import records_for

    records = []  # per-turn rewards for the viewer
    labels_of = labels_for(cfg)
    for env_name, groups in built.items():
        labels = [[labels_of(e) for e in g] for g in groups]
        labs = [x for g in labels for e in g for x in e if x is not None]
        per_group: dict[str, list[list[list[float]]]] = {}
        baselines = baseline_scores(groups, labels, n_boot, cfg.seed)
        env_progress = None if progress is None else (lambda text, env=env_name: progress(f"{env} {text}"))
        summary["envs"][env_name] = {
            "groups": len(groups), "episodes": sum(len(g) for g in groups), "labelled_turns": len(labs),
            "useful_turns": int(sum(labs)),
            "items": [g[0].task.get("index") for g in groups],
            "outcome_rate": float(np.mean([_outcome(e) for g in groups for e in g])) if groups else None,
            "baselines": baselines, "best_label_free": best_baseline(baselines),
            "rewards": score_groups(groups, rewards, labels_of, n_boot=n_boot, seed=cfg.seed, rewards_out=per_group,
                                     progress=env_progress,
                                     estimators=cfg.estimators, baselines=baselines)}
        records += records_for([e for g in groups for e in g],
                               {name: [ep for grp in rs for ep in grp] for name, rs in per_group.items()})
    summary["wall_s"] = round(time.perf_counter() - start, 2)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "episodes.jsonl").unlink(missing_ok=True)  # planted episodes are rebuilt, never resumed
        with EpisodeWriter(out / "episodes.jsonl") as w:
            for groups in built.values():
                for g in groups:
                    for e in g:
                        w.write(e)
        (out / "creditbench.json").write_text(json.dumps(summary, indent=1))
        from turngym.views.viewer import render_viewer

        render_viewer([e for groups in built.values() for g in groups for e in g], out / "view.html", records,
                      source="episodes.jsonl")
        (out / "creditbench.md").write_text(markdown(summary) + "\nEvery planted episode turn by turn, with each "
                                            "reward's per-turn rewards and advantages: [view.html](view.html)\n")
    return summary


def _outcome(ep: Episode) -> float:
    from turngym.rewards.base import outcome_score

    return outcome_score(ep)


def _cell(score: dict[str, Any] | None, key: str = "auc") -> str:
    if not score or score.get(key) is None:
        return "–"
    ci = score.get(f"{key}_ci95")
    return f"{score[key]:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def markdown(s: dict[str, Any]) -> str:
    c = s["config"]
    designs = ", ".join(c.get("designs", ["random"]))
    truth = c.get("truth", TRUTH_KEY) + (f" mapped by {c['truth_map']}" if c.get("truth_map") else "")
    lines = ["# Credit-assignment benchmark (planted per-turn truth)", "",
             (f"{c['groups']} groups × {c['k']} episodes per env, seed {c['seed']}, design(s) {designs}, "
              f"P(useful turn) {c['p_useful']} (random design), answer noise {c['noise']}; truth `{truth}`; "
              f"SearchQA on {c['searchqa_dataset']} over the {s['retriever']}, MathCode on "
              f"{c['mathcode_dataset']}, BFCL on {c['bfcl_category']}. Credit accuracy = AUC of label-1 vs label-0 turns "
              "(0.5 = no signal), pooled (headline) and within episodes, and Spearman ρ, 95% group-bootstrap intervals, "
              "on the per-turn advantage of the reward's paired estimator (and of each estimator asked for); "
              "'next turn' scores the turn after the labelled one with the label. Label-free baselines are rows of "
              "the same table."), "", LEGEND, ""]
    for env_name, e in s["envs"].items():
        lines += [f"## {env_name}", "", (f"{e['groups']} groups, {e['episodes']} episodes, {e['labelled_turns']} labelled "
                  f"turns ({e['useful_turns']} useful); gold-outcome rate {e['outcome_rate']:.2f}; items {e['items']}."), ""]
        rows, extra = [], {}
        for name, w in e["rewards"].items():
            if "error" in w:
                rows.append((name, "–", w))
                continue
            for est, sc in w["by_estimator"].items():
                rows.append((name, est + (" (declared)" if est == w["estimator"] and len(w["by_estimator"]) > 1 else ""), sc))
                var = w["group_reward_variance"]
                extra[(name, rows[-1][1])] = (
                    [_cell(w["advantage_next_turn"]), _cell(w.get("raw")), _cell(w.get("raw_next_turn")),
                     "–" if var is None else f"{var:.3f}"] if est == w["estimator"] else ["–", "–", "–", "–"])
        lines += table(rows, e.get("baselines", {}), ["AUC next turn (advantage, declared)", "AUC (raw reward)",
                                                      "AUC next turn (raw)", "group reward variance"], extra, digits=2)
        lines.append("")
    return "\n".join(lines)
