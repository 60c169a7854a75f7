"""Monte-Carlo credit oracle (``turngym creditbench --oracle mc``): per-turn values of recorded episodes
from branched continuations (:mod:`turngym.agents.branching`), and the credit of every reward ×
estimator and of the label-free baselines against them.

Branches are written to ``branches.jsonl`` as they finish, so a run that stops resumes where it was;
the values (``values.jsonl``) are computed from that file.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from turngym.agents.branching import TurnValue, branch_tasks, turn_values
from turngym.agents.policy import Policy, SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.base import restore
from turngym.episode import Episode
from turngym.episode.reader import read_episodes


def run_mc_oracle(episodes: Sequence[Episode], policy: Policy, env_factory: Callable[[], Any], out_dir: str | Path,
                  rollouts: int = 8, sampling: Any = None, concurrency: int = 8, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, list[TurnValue]]:
    """Branch every episode after each of its prefixes ``rollouts`` times (resumable), then compute the values;
    writes ``branches.jsonl`` and ``values.jsonl`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rollouts < 2:
        raise ValueError("the Monte-Carlo oracle needs at least 2 rollouts per prefix (for a standard error)")
    runner = RolloutRunner(policy, env_factory, sampling or SamplingParams(temperature=1.0), k=rollouts,
                           concurrency=concurrency, seed=seed, run_tag="mc",
                           batching="continuous" if policy.supports_stream else "static")
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


def credit_against_oracle(episodes: Sequence[Episode], values: dict[str, list[TurnValue]], rewards: dict[str, Any],
                          estimators: Sequence[str] = (), n_boot: int = 1000) -> dict[str, Any]:
    """The credit table (:mod:`turngym.credit.table`) with the oracle's clear signs as labels (|Â| > 2 se):
    every reward under its declared estimator and ``estimators``, the label-free baselines, and per row the
    Spearman ρ of the credit against Â itself and the share of clear turns whose sign the credit gets right."""
    from turngym.credit.accuracy import group_advantages, spearman
    from turngym.credit.table import baseline_scores, best_baseline, estimator_scores, estimators_for, mark_against
    from turngym.episode import group_episodes, reward_view

    groups = [list(g) for g in group_episodes(episodes)]
    labels = [oracle_labels(values, g) for g in groups]
    oracle_adv = [[tv.advantage if tv.trusted else None for tv in values[e.id]] for g in groups for e in g]
    baselines = baseline_scores(groups, labels, n_boot)
    best = best_baseline(baselines)

    def against_advantage(credit: list[list[float]]) -> dict[str, float | None]:
        both = [(c, a) for cr, ar in zip(credit, oracle_adv, strict=True) for c, a in zip(cr, ar, strict=True)
                if a is not None]
        clear = [(c, y) for cr, lr in zip(credit, [x for lab in labels for x in lab], strict=True)
                 for c, y in zip(cr, lr, strict=True) if y is not None and c != 0]
        return {"spearman_vs_advantage": spearman([c for c, _ in both], [a for _, a in both]),
                "sign_agreement": sum((c > 0) == bool(y) for c, y in clear) / len(clear) if clear else None}

    from turngym.credit.table import baseline_values

    for name, score in baselines.items():  # the label-free credits against Â too (their sign means nothing)
        score["spearman_vs_advantage"] = against_advantage(
            [baseline_values(e)[name] for g in groups for e in g])["spearman_vs_advantage"]
    rows = []
    for name, reward in rewards.items():
        scores = [reward.score_group(reward_view(g)).rewards for g in groups]  # rewards never see truth
        for est, score in estimator_scores(scores, labels, estimators_for(reward, estimators), n_boot).items():
            extra = {} if "error" in score else against_advantage(
                [a for r in scores for a in group_advantages(est, r)])
            rows.append({"reward": name, "estimator": est, **mark_against(score, best), **extra})
    return {"rows": rows, "baselines": baselines, "best_baseline": best}


def markdown(result: dict[str, Any], values: dict[str, list[TurnValue]], rollouts: int) -> str:
    from turngym.credit.table import LEGEND, table

    turns = [tv for rows in values.values() for tv in rows]
    clear = [tv for tv in turns if tv.sign is not None]

    def cell(x: float | None) -> str:
        return "–" if x is None else f"{x:.3f}"

    rows = [(r["reward"], r["estimator"], r) for r in result["rows"]]
    extra = {(r["reward"], r["estimator"]): [cell(r.get("spearman_vs_advantage")), cell(r.get("sign_agreement"))]
             for r in result["rows"]}
    extra.update({("baseline", name): [cell(s.get("spearman_vs_advantage")), "–"]
                  for name, s in result["baselines"].items()})
    lines = [f"# Credit against the Monte-Carlo oracle ({rollouts} continuations per prefix)", "",
             f"{len(turns)} turns; {sum(tv.trusted for tv in turns)} replayed identically; {len(clear)} with a clear "
             f"sign (|Â| > 2 se: {sum(tv.sign == 1 for tv in clear)} positive, {sum(tv.sign == -1 for tv in clear)} "
             "negative), the labels of the AUCs below. ρ vs Â: Spearman of the credit against the oracle's "
             "advantage on every trusted turn; sign agreement: share of clear turns whose credit has the oracle's "
             "sign.", "", *table(rows, result["baselines"], ["ρ vs Â", "sign agreement"], extra), "", LEGEND]
    return "\n".join(lines) + "\n"


def _branches_done(out: Path) -> int:
    path = out / "branches.jsonl"
    return len(read_episodes(path).episodes) if path.is_file() else 0


def restore_cost(episodes: Sequence[Episode], env_factory: Callable[[], Any]) -> dict[str, float]:
    """What a branch pays before it samples: the median time to restore an episode after its first half of
    turns (what an average prefix replays) against replaying the whole episode, over ``episodes``."""
    env = env_factory()
    half, whole = [], []
    try:
        for ep in episodes:
            for turns, into in ((len(ep.turns) // 2, half), (len(ep.turns), whole)):
                t0 = time.perf_counter()
                restore(env, ep, turns)
                into.append(time.perf_counter() - t0)
    finally:
        env.close()
    return {"restore_half_s": statistics.median(half), "replay_whole_s": statistics.median(whole)}


def cost_markdown(cost: dict[str, Any], n_episodes: int) -> str:
    rate = cost.get("continuations_per_s")
    return ("\n## Cost\n\n"
            f"{cost['continuations']} continuations in {cost['seconds']:.0f} s"
            + (f" ({rate:.2f} continuations/s, {cost['seconds'] / n_episodes:.0f} s per episode)" if rate else "")
            + f"; restoring a recorded episode after half its turns: median {cost['restore_half_s'] * 1e3:.1f} ms, "
            f"replaying it whole: {cost['replay_whole_s'] * 1e3:.1f} ms (continuations then sample from the restored "
            "state, reusing the recorded token ids).\n")


MC_SETTINGS = "mc_settings.json"


def recorded_settings(episodes_file: str | Path) -> tuple[dict[str, Any], Path | None]:
    """The settings the episodes were recorded with: ``<file>.run.json`` (``turngym rollout``), else the
    ``run.json`` beside them (``turngym eval``); ``({}, None)`` when there is neither."""
    from turngym.run.lock import upgrade_settings
    from turngym.run.outputs import RUN_SETTINGS, rollout_settings_path

    path = Path(episodes_file)
    for candidate in (rollout_settings_path(path), path.with_name(RUN_SETTINGS)):
        if candidate.is_file():
            try:
                return upgrade_settings(json.loads(candidate.read_text())), candidate
            except ValueError as exc:
                raise ValueError(f"{candidate} (the episodes' run settings) is not valid JSON: {exc}") from None
    return {}, None


def run_mc_creditbench(episodes_file: str | Path, out_dir: str | Path, model: str | None = None,
                       rewards: Sequence[str] = ("outcome",),
                       estimators: Sequence[str] = (), env_kwargs: dict[str, Any] | None = None, rollouts: int = 8,
                       base_url: str | None = None, temperature: float | None = None, max_new_tokens: int | None = None,
                       concurrency: int = 8, seed: int = 0, scorer: str | None = None,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """``turngym creditbench --oracle mc``: the oracle on recorded episodes (one env), then every
    reward × estimator and the label-free baselines against it. The model, env options and sampling (temperature,
    tokens per turn) default to the episodes' run settings (:func:`recorded_settings`), so the env renders the prompts
    it recorded and the continuations value the policy that recorded them; without settings, temperature 1 and 256
    tokens, and the model must be given. A resumed ``out_dir`` must have the same settings (``mc_settings.json``)."""
    import gymnasium

    import turngym  # noqa: F401 - registers the envs
    from turngym.agents.loading import load_policy
    from turngym.credit.ablate import make_rewards
    from turngym.run.lock import check_settings, store_settings

    report = read_episodes(episodes_file)
    episodes = report.episodes
    if not episodes:
        raise ValueError(f"{episodes_file} holds no episodes")
    env_ids = {e.env_id for e in episodes}
    if len(env_ids) != 1:
        raise ValueError(f"the oracle runs one env at a time; {episodes_file} holds {sorted(env_ids)}")
    env_id = env_ids.pop()
    kwargs = dict(env_kwargs or {})
    recorded, source = recorded_settings(episodes_file)
    if not kwargs:
        kwargs = dict(recorded.get("env_kwargs") or {})
    recorded_sampling = recorded.get("sampling") or {}
    temperature = float(recorded_sampling.get("temperature", 1.0)) if temperature is None else temperature
    max_new_tokens = int(recorded_sampling.get("max_new_tokens", 256)) if max_new_tokens is None else max_new_tokens
    model = model or recorded.get("model")
    if not model:
        raise ValueError(f"no model recorded beside {episodes_file}: pass --model (the policy that continues)")
    if temperature <= 0:
        raise ValueError(f"temperature {temperature} ({'from ' + str(source) if source else 'given'}) samples greedily: "
                         "every continuation of a prefix would be the same, so the oracle would have no standard "
                         "error; pass --temperature > 0 (the recording policy's, if it sampled)")
    settings = {"episodes": str(episodes_file), "env": env_id, "env_kwargs": kwargs, "model": model,
                "base_url": base_url, "rollouts": rollouts,
                "sampling": {"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out / MC_SETTINGS, settings, [out / "branches.jsonl"])
    store_settings(out / MC_SETTINGS, settings, [out / "branches.jsonl"])
    policy = load_policy(model, base_url=base_url)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    make_env = lambda: gymnasium.make(env_id, **kwargs)  # noqa: E731
    before = _branches_done(out)
    start = time.perf_counter()
    values = run_mc_oracle(episodes, policy, make_env, out_dir, rollouts, sampling, concurrency, seed, progress)
    cost = {"seconds": time.perf_counter() - start, "continuations": _branches_done(out) - before,
            **restore_cost(episodes, make_env)}
    cost["continuations_per_s"] = cost["continuations"] / cost["seconds"] if cost["seconds"] > 0 else None
    built = make_rewards(list(rewards), scorer=scorer)
    result = credit_against_oracle(episodes, values, built, estimators)
    summary = {"env": env_id, "env_kwargs": kwargs, "model": model, "rollouts": rollouts, "episodes": len(episodes),
               "sampling": settings["sampling"], "settings_from": str(source) if source else None,
               "cost": cost, **result}
    (out / "mc_oracle.json").write_text(json.dumps(summary, indent=1))
    (out / "mc_oracle.md").write_text(markdown(result, values, rollouts) + cost_markdown(cost, len(episodes)))
    return summary
