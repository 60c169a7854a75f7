"""``turngym ablate``: score the same saved groups with several rewards and compare credit.

Reported per reward: per-turn credit maps (heatmap), rank correlation with every other
reward over all turn rewards, within-group variance of episode totals, agreement of
episode totals with the gold outcome, and **credit accuracy**: the Spearman correlation
between the reward's per-turn rewards and the per-turn truth in ``Turn.truth`` (declared by
the env: SearchQA ``retrieval_hit``, MathCode ``feeds_answer``, Calculator ``tool_ok``, BFCL
``bfcl_turn_valid``; or written by an importer, e.g. human labels), over the turns that have
one, and on advantages the credit table of :mod:`turngym.credit.table` (pooled and
within-episode AUC, ρ, label-free baselines) under the declared estimator and each of
``estimators``. ``truth`` names the key (default: the one key each episode carries) and
``truth_map`` maps non-binary values to labels. Rewards score the episodes through
:func:`turngym.episode.reward_view`: they never see the truth.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from turngym.credit.accuracy import turn_truth
from turngym.credit.table import (
    LEGEND,
    baseline_scores,
    best_baseline,
    estimator_scores,
    estimators_for,
    mark_against,
    table,
)
from turngym.episode import Episode, EpisodeGroup, group_episodes, reward_view
from turngym.episode.reader import load_episodes
from turngym.rewards.base import GroupReward, get_reward, outcome_score, parse_label, reward_class
from turngym.truth import TruthMap


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    rho = spearmanr(a, b).statistic
    return None if rho is None or not np.isfinite(rho) else float(rho)


def ablate(episodes: Sequence[Episode], rewards: dict[str, GroupReward], out_dir: str | Path | None = None,
           reliability: dict[str, Any] | None = None, truth: str | None = None, truth_map: str | None = None,
           estimators: Sequence[str] = (), progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``rewards``: name → reward. Groups are the episodes' ``group`` ids. ``reliability``:
    a judge-reliability result (``turngym.rewards.scribe.diagnostics.reliability``) to report too.
    ``truth`` / ``truth_map``: the truth key scored and its value map (:func:`turngym.episode.turn_labels`);
    ``estimators``: scored besides each reward's declared one. ``progress``: told each reward × group
    as it is scored (a model-scored reward takes seconds per group on a CPU)."""
    mapping = TruthMap.parse(truth_map) if truth_map else None
    labels_of = {ep.id: turn_truth(ep, truth, mapping) for ep in episodes}  # bad truth is refused before scoring
    groups = group_episodes(episodes)
    ordered = [ep for g in groups for ep in g]
    needy = {n: w for n, w in rewards.items() if w.requires_gold}
    kept = [g for g in groups if all(_has_gold(e) for e in g)]
    kept_ids = {g.key for g in kept}
    if not needy or len(kept) == len(groups):  # every reward is scored on every group
        needy, kept = {}, list(groups)
    per_turn, errors = _score(groups, {n: w for n, w in rewards.items() if n not in needy}, progress)
    summary = _summary(groups, per_turn, rewards, errors, labels_of, estimators)
    summary["truth"] = {"key": truth or "(the one key each episode carries)", "map": truth_map}
    if needy:  # e.g. igpo where some envs carry no gold answer: scored (or failing) once, on the gold groups only
        scope = {"envs": sorted({g[0].env_id for g in kept}), "groups": len(kept),
                 "left_out_envs": sorted({g[0].env_id for g in groups if g.key not in kept_ids}),
                 "left_out_groups": len(groups) - len(kept)}
        sub_rows, sub_errors = (_score(kept, needy, progress) if kept
                                else ({}, dict.fromkeys(needy, "no group carries a gold answer")))
        for name, m in _summary(kept, sub_rows, needy, sub_errors, labels_of, estimators,
                                summary["baselines"])["rewards"].items():
            summary["rewards"][name] = {**m, "scope": scope}
        summary["errors"].update(sub_errors)
        summary["gold_only"] = scope
        kept_eps = [e for g in kept for e in g]
        for name, rows in sub_rows.items():  # left-out episodes' turns are NaN: blank in the heatmap and viewer
            by_id = {ep.id: row for ep, row in zip(kept_eps, rows, strict=True)}
            per_turn[name] = [by_id.get(ep.id, [math.nan] * len(ep.turns)) for ep in ordered]
    flat = {n: [x for r in rows for x in r] for n, rows in per_turn.items()}
    names = list(per_turn)
    for a in names:
        summary["correlation"][a] = {b: _finite_spearman(flat[a], flat[b]) for b in names}
    if reliability is not None:
        summary["reliability"] = reliability
    if out_dir is not None:
        from turngym.views.report import credit_heatmap

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_rows = {n: [[x if math.isfinite(x) else None for x in r] for r in rows] for n, rows in per_turn.items()}
        (out / "ablation.json").write_text(json.dumps({**summary, "per_turn_rewards": json_rows}, indent=1))
        if per_turn:
            credit_heatmap(per_turn, out / "credit_maps.png")
        # per-turn rewards and group advantages by episode id (format: turngym.training.scores), and the viewer
        from turngym.training.scores import records_for, write_scores
        from turngym.views.viewer import render_viewer

        records = records_for(ordered, per_turn)
        write_scores(out / "scores.jsonl", records)
        render_viewer(ordered, out / "view.html", records, source="ablation")
        (out / "ablation.md").write_text(_markdown(summary) + "\nBrowse each episode turn by turn with every reward's "
                                         "per-turn rewards and advantages: [view.html](view.html) "
                                         "(rewards by episode id in `scores.jsonl`).\n")
    return summary


def _has_gold(ep: Episode) -> bool:
    return any(str(a).strip() for a in ep.task.get("answers", []) or [])


def _score(groups: Sequence[EpisodeGroup], rewards: dict[str, GroupReward],
           progress: Callable[[str], None] | None = None) -> tuple[dict[str, list[list[float]]], dict[str, str]]:
    """Per-turn rewards of each reward over the groups in order; a reward that raises is reported, not fatal."""
    per_turn: dict[str, list[list[float]]] = {}
    errors: dict[str, str] = {}
    for name, reward in rewards.items():
        rows: list[list[float]] = []
        try:
            for i, g in enumerate(groups):
                if progress is not None:
                    progress(f"{name}: group {i + 1}/{len(groups)}")
                rows += reward.score_group(reward_view(g)).rewards
        except Exception as exc:  # noqa: BLE001 - one failing reward must not sink the others
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        per_turn[name] = rows
    return per_turn, errors


def _summary(groups: Sequence[EpisodeGroup], per_turn: dict[str, list[list[float]]], rewards: dict[str, GroupReward],
             errors: dict[str, str], labels_of: dict[str, list[int | None]], estimators: Sequence[str] = (),
             baselines: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Credit accuracy (raw and on advantages, beside the label-free baselines), agreement with the gold
    outcome and variance per reward. ``baselines``: given when scoring a subset (gold-only rewards), so
    every row is marked against the baselines of the whole set."""
    ordered = [ep for g in groups for ep in g]
    truths = [labels_of[e.id] for e in ordered]
    gold = [outcome_score(e) for e in ordered]
    by_group = [[labels_of[e.id] for e in g] for g in groups]
    if baselines is None:
        baselines = baseline_scores(groups, by_group)
    best = best_baseline(baselines)
    summary: dict[str, Any] = {"groups": len(groups), "episodes": len(ordered),
                               "turns_with_ground_truth": sum(x is not None for t in truths for x in t),
                               "baselines": baselines, "best_label_free": best,
                               "rewards": {}, "correlation": {}, "errors": dict(errors)}
    for name, rows in per_turn.items():
        totals = [sum(r) for r in rows]
        pairs = [(x, t) for r, tr in zip(rows, truths, strict=True) for x, t in zip(r, tr, strict=True) if t is not None]
        variances, start = [], 0
        for g in groups:
            tot = totals[start:start + len(g)]
            start += len(g)
            if len(tot) > 1:
                variances.append(float(np.var(tot, ddof=1)))
        flat = [x for r in rows for x in r]
        by_est = _advantage_credit(estimators_for(rewards[name], estimators), rows, by_group, groups, best)
        summary["rewards"][name] = {
            "credit_accuracy": spearman([p[0] for p in pairs], [p[1] for p in pairs]),
            "credit_accuracy_advantage": {"estimator": rewards[name].estimator, **by_est[rewards[name].estimator]},
            "by_estimator": by_est,
            "agreement_with_gold_outcome": spearman(totals, gold),
            "within_group_variance": float(np.mean(variances)) if variances else None,
            "mean_turn_reward": float(np.mean(flat)) if flat else None,
            **rewards[name].costs(),
        }
    return summary


def _finite_spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman over the turns both rewards scored (a gold-only reward leaves NaN on the others)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if math.isfinite(x) and math.isfinite(y)]
    return spearman([p[0] for p in pairs], [p[1] for p in pairs])


def _advantage_credit(names: Sequence[str], rows: list[list[float]], labels: list[list[list[int | None]]],
                      groups: Sequence[EpisodeGroup], best: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Credit accuracy on each estimator's per-turn advantages (groups kept whole for the bootstrap), marked
    against the best label-free baseline."""
    per_group, start = [], 0
    for g in groups:
        per_group.append(rows[start:start + len(g)])
        start += len(g)
    return {e: mark_against(s, best) for e, s in estimator_scores(per_group, labels, names).items()}


def _markdown(s: dict[str, Any]) -> str:
    f = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
    lines = ["# Reward ablation", "", f"{s['groups']} groups, {s['episodes']} episodes, "
             f"{s['turns_with_ground_truth']} turns with per-turn ground truth.", "",
             "| reward | credit accuracy (ρ vs per-turn truth) | agreement with gold outcome (ρ) "
             "| within-group variance | mean turn reward |",
             "| --- | --- | --- | --- | --- |"]
    for n, m in s["rewards"].items():
        lines.append(f"| {n} | {f(m['credit_accuracy'])} | {f(m['agreement_with_gold_outcome'])} | "
                     f"{f(m['within_group_variance'])} | {f(m['mean_turn_reward'])} |")
    truth = s.get("truth") or {}
    lines += ["", (f"Credit accuracy on advantages, truth `{truth.get('key', '–')}`"
                   + (f" mapped by `{truth['map']}`" if truth.get("map") else "")
                   + ": every reward under its declared estimator (and each one asked for), then the label-free "
                   "baselines on the same turns."), "", LEGEND, ""]
    rows, extra = [], {}
    for n, m in s["rewards"].items():
        for est, sc in m.get("by_estimator", {}).items():
            declared = est == m["credit_accuracy_advantage"]["estimator"]
            label = est + (" (declared)" if declared and len(m["by_estimator"]) > 1 else "")
            rows.append((n, label, sc))
            extra[(n, label)] = [f"{sc.get('n_groups', '–')} / {sc.get('n_turns', '–')} ({sc.get('n_positive', '–')})"
                                 + ("*" if "scope" in m else "")]
    lines += table(rows, s.get("baselines", {}), ["groups / labelled turns (useful)"], extra)
    if s.get("gold_only"):
        g = s["gold_only"]
        lines += ["", (f"\\* scored only on the {g['groups']} groups whose episodes carry a gold answer "
                       f"({', '.join(g['envs'])}); left out: {g['left_out_groups']} groups of {', '.join(g['left_out_envs'])} "
                       "(no gold answer for the reward to score); blank there in the heatmap and viewer, "
                       "and its rank correlations use the turns it scored.")]
    names = list(s["correlation"])
    if names:
        lines += ["", "Rank correlation between rewards' per-turn rewards:", "", "| | " + " | ".join(names) + " |",
                  "|---" * (len(names) + 1) + "|"]
        lines += [f"| {a} | " + " | ".join(f(s["correlation"][a][b]) for b in names) + " |" for a in names]
    for n, m in s["rewards"].items():
        if "llm" in m:
            c = m["llm"]
            lines.append(f"\n{n}: {c['calls']} LLM calls ({c['cache_hit_rate']:.0%} from cache, {c['failed']} without "
                         f"valid JSON); skill library version {m['library']['version']} with "
                         f"{m['library']['prototypes']} prototypes.")
    for n, e in s["errors"].items():
        lines.append(f"\n**{n} failed**: {e}")
    if s.get("reliability"):
        lines += reliability_table(s["reliability"])
    lines += ["", "![credit maps](credit_maps.png)", ""]
    return "\n".join(lines)


def reliability_table(r: dict[str, Any]) -> list[str]:
    """SCRIBE's judge-reliability table: the rubric judge and the PRM on the same routed steps."""
    f = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
    lines = ["", f"Judge reliability ({r['judge']}; {r['routed_steps']} routed steps of {r['episodes']} episodes; "
             f"cross-instance pairs: same prototype and step texts with cosine >= {r['neighbour_threshold']}):", "",
             "| judge | repeats | exact agreement | pairwise agreement | mean score range | cross-instance pairs | "
             "cross-instance agreement | mean abs difference | repeat replies without valid JSON |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, j in r["judges"].items():
        rep = j["repeat"] or {}
        c = j["cross_instance"]
        llm = rep.get("llm") or {}
        lines.append(f"| {name} | {rep.get('repeats', '–')} | {f(rep.get('exact_agreement'))} | "
                     f"{f(rep.get('pairwise_agreement'))} | {f(rep.get('mean_score_range'))} | {c['scored_pairs']}"
                     + (f" ({c['identical_prompt_pairs']} with identical prompts)" if "identical_prompt_pairs" in c else "")
                     + " | "
                     f"{f(c['exact_agreement'])} | {f(c['mean_abs_difference'])} | "
                     f"{llm.get('failed', '–')} of {llm.get('calls', '–')} |")
    return lines


def make_rewards(names: Sequence[str], scorer: Any = None, tokens: str = "ids", scribe_llm: Any = None,
                  scribe_episodes: Sequence[Episode] = (), scribe_library: Any = None,
                  scribe_base_url: str | None = None) -> dict[str, GroupReward]:
    """Rewards by name, configured by what each declares (:class:`~turngym.rewards.base.GroupReward`).
    ``scorer`` (a model spec or a loaded scorer) is made once and shared by every reward that
    ``needs_scorer`` (siop, igpo), which read episodes by ``tokens``: ``"ids"`` (the policy's own ids) or
    ``"text"`` (re-tokenised: scripted creditbench episodes carry no ids). ``scribe_llm`` judges for every
    reward that ``needs_judge`` (scribe, prm), loaded once and shared; one that ``learns_library`` is given
    ``scribe_library``, or without one fits its library on ``scribe_episodes``."""
    shared_scorer, shared_judge = None, None
    out: dict[str, GroupReward] = {}
    for name in names:
        cls = reward_class(name)
        cfg: dict[str, Any] = {}
        if cls.needs_scorer:
            if scorer is None:
                raise ValueError(f"{name} needs --scorer (a model that scores support, e.g. 'default' or a directory)")
            if shared_scorer is None:
                from turngym.rewards.support import make_scorer

                shared_scorer = make_scorer(scorer)
            cfg.update(scorer=shared_scorer, tokens=tokens)
        if cls.needs_judge:
            judge = shared_judge if shared_judge is not None else scribe_llm
            if judge is None:
                raise ValueError(f"{name} needs a judge model (--scribe-llm)")
            cfg.update(llm=judge, llm_base_url=scribe_base_url)
        if cls.learns_library:
            cfg.update(library=scribe_library)
        out[name] = reward = get_reward(name, **cfg)
        if cls.needs_judge and shared_judge is None:
            shared_judge = reward.llm  # the loaded judge, shared by the next reward that needs one
        if cls.learns_library and scribe_library is None:  # no library given: build one from these episodes
            reward.fit(list(scribe_episodes))
    return out


def run_ablation(episodes_file: str | Path, names: Sequence[str], out_dir: str | Path,
                 scorer: str | None = None, scribe_llm: str = "default", scribe_library: str | None = None,
                 scribe_base_url: str | None = None, reliability_repeats: int = 0, truth: str | None = None,
                 truth_map: str | None = None, estimators: Sequence[str] = (),
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``reliability_repeats`` >= 2 (with ``scribe`` among ``names``) adds the judge-reliability table
    of ``scribe`` and ``prm`` (same judge model, same steps). ``truth``, ``truth_map``, ``estimators``: as
    :func:`ablate` (checked before any model loads)."""
    report = load_episodes(episodes_file)
    mapping = TruthMap.parse(truth_map) if truth_map else None
    for ep in report.episodes:  # bad truth is refused before any model loads
        turn_truth(ep, truth, mapping)
    if truth is not None and not any(truth in t.truth for ep in report.episodes for t in ep.turns):
        keys = sorted({k for ep in report.episodes for t in ep.turns for k in t.truth})
        raise ValueError(f"no turn carries truth {truth!r}; the episodes carry {keys or 'no truth'}")
    scribes = [name for name in names if parse_label(name)[0] == "scribe"]  # scribe, or scribe[options]
    if reliability_repeats and len(scribes) != 1:  # said before any library is built
        raise ValueError("the reliability table needs one 'scribe' among the rewards"
                         + (f", not {len(scribes)}: {', '.join(scribes)}" if scribes else ""))
    scorer_spec, tokens = _scorer_spec(scorer)
    rewards = make_rewards(names, scorer=scorer_spec, tokens=tokens, scribe_llm=scribe_llm,
                           scribe_episodes=report.episodes, scribe_library=scribe_library,
                           scribe_base_url=scribe_base_url)
    rel = None
    if reliability_repeats:
        from turngym.rewards.scribe.diagnostics import reliability

        rel = reliability(report.episodes, rewards[scribes[0]], repeats=reliability_repeats)
    return ablate(report.episodes, rewards, out_dir, reliability=rel, truth=truth, truth_map=truth_map,
                  estimators=estimators, progress=progress)


def _scorer_spec(scorer: str | None) -> tuple[Any, str]:
    """``--scorer``: a local model ('default', a directory, a hub id), or a JSON mapping: a local
    model ``{"model", "dtype", "method"}`` or an OpenAI-compatible server ``{"base_url", "model",
    "tokenizer"}``; ``"tokens": "text"`` in the mapping re-tokenises episodes for a scorer of
    another model family."""
    if scorer is None or not scorer.strip().startswith("{"):
        return scorer, "ids"
    try:
        spec = json.loads(scorer)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--scorer looks like JSON but does not parse: {exc}") from None
    if not isinstance(spec, dict):
        raise ValueError("--scorer JSON must be a mapping")
    return spec, str(spec.pop("tokens", "ids"))
