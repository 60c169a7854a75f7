"""Monte-Carlo credit oracle (``turngym creditbench --oracle mc``): per-turn values of recorded episodes
from branched continuations (:mod:`turngym.agents.branching`), and the credit of every reward wrapper ×
estimator and of the label-free baselines against them.

Branches are written to ``branches.jsonl`` as they finish, so a run that stops resumes where it was;
the values (``values.jsonl``) are computed from that file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from turngym.agents.branching import TurnValue, branch_tasks, turn_values
from turngym.agents.runner import RolloutRunner
from turngym.episode import Episode, read_episodes


def run_mc_oracle(episodes: Sequence[Episode], policy: Any, env_factory: Callable[[], Any], out_dir: str | Path,
                  rollouts: int = 8, sampling: Any = None, concurrency: int = 8, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, list[TurnValue]]:
    """Branch every episode after each of its prefixes ``rollouts`` times (resumable), then compute the values;
    writes ``branches.jsonl`` and ``values.jsonl`` under ``out_dir``."""
    from turngym.agents.policy import SamplingParams

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rollouts < 2:
        raise ValueError("the Monte-Carlo oracle needs at least 2 rollouts per prefix (for a standard error)")
    runner = RolloutRunner(policy, env_factory, sampling or SamplingParams(temperature=1.0), k=rollouts,
                           concurrency=concurrency, seed=seed, run_tag="mc")
    runner.run(branch_tasks(episodes, rollouts), out / "branches.jsonl", progress=progress)
    branches = read_episodes(out / "branches.jsonl").episodes
    values = turn_values(episodes, branches)
    with (out / "values.jsonl").open("w", encoding="utf-8") as fh:
        for ep in episodes:
            for tv in values[ep.id]:
                fh.write(json.dumps(tv.to_dict()) + "\n")
    return values


def oracle_labels(values: dict[str, list[TurnValue]], episodes: Sequence[Episode]) -> list[list[int | None]]:
    """Per episode, per turn: 1 where the oracle's Â is clearly positive, 0 clearly negative, None unclear."""
    return [[None if (s := tv.sign) is None else int(s > 0) for tv in values[ep.id]] for ep in episodes]


# ------------------------------------------------------------------ credit against the oracle

LABEL_FREE = ("relative position", "−turns remaining", "outcome broadcast")


def label_free(episodes: Sequence[Episode]) -> dict[str, list[list[float]]]:
    """Baselines that use no labels: a credit table must show a wrapper beats them."""
    from turngym.rewards.base import impute_missing, outcome_score

    outcome = impute_missing([outcome_score(e) for e in episodes])
    return {
        "relative position": [[t / max(1, len(e.turns) - 1) for t in range(len(e.turns))] for e in episodes],
        "−turns remaining": [[-(len(e.turns) - 1 - t) for t in range(len(e.turns))] for e in episodes],
        "outcome broadcast": [[o] * len(e.turns) for e, o in zip(episodes, outcome, strict=True)],
    }


def credit_against_oracle(episodes: Sequence[Episode], values: dict[str, list[TurnValue]], wrappers: dict[str, Any],
                          estimators: Sequence[str] = (), n_boot: int = 1000) -> list[dict[str, Any]]:
    """One row per wrapper × estimator (its declared one, then ``estimators``) and per label-free baseline:
    AUC and Spearman of the credit against the oracle's clear signs (|Â| > 2 se, groups resampled whole),
    and the agreement of signs."""
    from turngym.episode import group_episodes
    from turngym.evals.credit import credit_score, group_advantages, labelled_pairs, spearman

    groups = group_episodes(episodes)
    ordered = [e for g in groups for e in g]
    labels = oracle_labels(values, ordered)
    sizes = [len(g) for g in groups]

    def by_group(rows: list[list[float]]) -> list[list[tuple[float, int]]]:
        out, start = [], 0
        for n in sizes:
            out.append(labelled_pairs(rows[start:start + n], labels[start:start + n]))
            start += n
        return out

    oracle_adv = [[tv.advantage if tv.trusted else None for tv in values[e.id]] for e in ordered]

    def row(name: str, estimator: str, credit: list[list[float]]) -> dict[str, Any]:
        pairs = by_group(credit)
        flat = [p for g in pairs for p in g]
        agree = sum((c > 0) == bool(y) for c, y in flat if c != 0) / max(1, sum(c != 0 for c, _ in flat))
        both = [(c, a) for cr, ar in zip(credit, oracle_adv, strict=True) for c, a in zip(cr, ar, strict=True)
                if a is not None]
        return {"credit": name, "estimator": estimator, **credit_score(pairs, n_boot).to_dict(),
                "sign_agreement": agree if flat else None,
                "spearman_vs_advantage": spearman([c for c, _ in both], [a for _, a in both])}

    table = []
    for name, wrapper in wrappers.items():
        per_group = [wrapper.score_group(list(g)).rewards for g in groups]
        for est in dict.fromkeys([wrapper.estimator, *estimators]):
            credit = [a for r in per_group for a in group_advantages(est, r)]
            table.append(row(name, est, credit))
    for name, credit in label_free(ordered).items():
        table.append(row(name, "label-free", credit))
    return table


def markdown(table: list[dict[str, Any]], values: dict[str, list[TurnValue]], rollouts: int) -> str:
    turns = [tv for rows in values.values() for tv in rows]
    clear = [tv for tv in turns if tv.sign is not None]
    lines = [f"# Credit against the Monte-Carlo oracle ({rollouts} continuations per prefix)", "",
             f"{len(turns)} turns; {sum(tv.trusted for tv in turns)} replayed identically; {len(clear)} with a clear "
             f"sign (|Â| > 2 se: {sum(tv.sign == 1 for tv in clear)} positive, {sum(tv.sign == -1 for tv in clear)} "
             "negative). AUC: P(credit of a turn the oracle calls good > credit of one it calls bad); 95% "
             "intervals resample groups whole.", "",
             "| credit | estimator | AUC [95%] | Spearman ρ vs Â | sign agreement | clear turns |", "|---|---|---|---|---|---|"]
    best_free = max((r["auc"] for r in table if r["estimator"] == "label-free" and r["auc"] is not None), default=None)
    for r in table:
        ci = f" [{r['auc_ci95'][0]:.2f}, {r['auc_ci95'][1]:.2f}]" if r["auc_ci95"] else ""
        auc = "–" if r["auc"] is None else f"{r['auc']:.3f}{ci}"
        flag = "" if r["estimator"] == "label-free" or best_free is None or r["auc"] is None or r["auc"] > best_free \
            else " (not above the label-free baselines)"
        rho = "–" if r["spearman_vs_advantage"] is None else f"{r['spearman_vs_advantage']:.3f}"
        sa = "–" if r["sign_agreement"] is None else f"{r['sign_agreement']:.3f}"
        lines.append(f"| {r['credit']} | {r['estimator']} | {auc}{flag} | {rho} | {sa} | {r['n_turns']} |")
    return "\n".join(lines) + "\n"


def run_mc_creditbench(episodes_file: str | Path, out_dir: str | Path, model: str, rewards: Sequence[str] = ("outcome",),
                       estimators: Sequence[str] = (), env_kwargs: dict[str, Any] | None = None, rollouts: int = 8,
                       base_url: str | None = None, temperature: float = 1.0, max_new_tokens: int = 256,
                       concurrency: int = 8, seed: int = 0, scorer: str | None = None,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """``turngym creditbench --oracle mc``: the oracle on recorded episodes (one env), then every reward
    wrapper × estimator and the label-free baselines against it. Env options default to the ``run.json``
    beside the episodes (what ``turngym eval`` wrote), so the env renders the prompts it recorded."""
    import gymnasium

    import turngym  # noqa: F401 - registers the envs
    from turngym.agents.loading import load_policy
    from turngym.agents.policy import SamplingParams
    from turngym.evals.ablate import make_wrappers

    report = read_episodes(episodes_file)
    episodes = report.episodes
    if not episodes:
        raise ValueError(f"{episodes_file} holds no episodes")
    env_ids = {e.env_id for e in episodes}
    if len(env_ids) != 1:
        raise ValueError(f"the oracle runs one env at a time; {episodes_file} holds {sorted(env_ids)}")
    env_id = env_ids.pop()
    kwargs = dict(env_kwargs or {})
    settings = Path(episodes_file).with_name("run.json")
    if not kwargs and settings.is_file():
        kwargs = dict(json.loads(settings.read_text()).get("env_kwargs") or {})
    policy = load_policy(model, base_url=base_url)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    values = run_mc_oracle(episodes, policy, lambda: gymnasium.make(env_id, **kwargs), out_dir, rollouts, sampling,
                           concurrency, seed, progress)
    wrappers = make_wrappers(list(rewards), scorer=scorer)
    table = credit_against_oracle(episodes, values, wrappers, estimators)
    out = Path(out_dir)
    summary = {"env": env_id, "env_kwargs": kwargs, "model": model, "rollouts": rollouts, "episodes": len(episodes),
               "table": table}
    (out / "mc_oracle.json").write_text(json.dumps(summary, indent=1))
    (out / "mc_oracle.md").write_text(markdown(table, values, rollouts))
    return summary
