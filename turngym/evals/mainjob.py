"""The main job in one process: every model loaded once, then evals, the reward ablation and creditbench.

``bash scripts/main.sh`` runs ``turngym main-job``. One process (not a warm worker) because
every stage is in-process Python that takes a loaded model object: ``run_eval(policy=...)``,
rewards that take a scorer object, SCRIBE that takes a policy as judge. Loading once
saves a model load per stage and keeps peak memory at one copy of each model.

Stages and what they share:
1. load the agent (the instruct model); after generation the same weights, cast to fp32 in
   place, score support for SIOP/IGPO (the policy scoring its own token ids, as SIOP does;
   a different ``--scorer`` is loaded once instead);
2. ``eval`` of the agent on every env (Calculator, MathCode/GSM8K, SearchQA/HotpotQA in the
   native tool format, one worked example, the first search call forced; BFCL simple_python), K samples per item
   at temperature > 0 so groups vary;
3. ``ablate`` every reward on all of those episodes, credit accuracy from the envs'
   per-turn truth, on the paired estimators' advantages;
4. ``creditbench`` (planted per-turn truth) with the same rewards and scorer;
5. one report linking everything, with the wall time split into model load, generation and scoring.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turngym.run.pipeline import RunProgress

INSTRUCT_MODEL = "qwen2.5-coder-0.5b-instruct"


@dataclass
class EnvRun:
    name: str
    env_id: str
    env_kwargs: dict[str, Any]
    limit: int
    max_new_tokens: int


def default_runs(limit: int = 3) -> list[EnvRun]:
    return [
        EnvRun("calculator", "turngym/Calculator-v0", {"max_turns": 3}, limit, 48),
        EnvRun("mathcode-gsm8k", "turngym/MathCode-v0", {"dataset": "gsm8k", "max_turns": 3}, limit, 160),
        # the instruct agent never searches unprompted in the native format (docs/results.md, "Instruct agent
        # behaviour and format choice"): its first call is opened for it, and a worked example shows it the format
        EnvRun("searchqa-hotpotqa", "turngym/SearchQA-v0", {"dataset": "hotpotqa", "max_turns": 3, "tool_format": "native",
                                                            "prompt": "one_shot", "force_first_search": True}, limit, 64),
        EnvRun("bfcl-simple_python", "turngym/BFCL-v0", {"dataset": "simple_python", "tool_format": "prompting"}, limit, 64),
    ]


@dataclass
class MainJobConfig:
    out: Path
    model: str = INSTRUCT_MODEL
    scorer: str = INSTRUCT_MODEL  # fp32 copy of the agent: scores support for siop / igpo on its own token ids
    scorer_dtype: str = "float32"  # the agent scoring its own ids: cast to this dtype ("bfloat16": no cast)
    # siop and igpo share one scorer that keeps each episode's longest-prefix forward (τ_T, the same for both),
    # this many tokens in all (about 28 kB a token for the fp32 instruct model); 0 keeps none
    prefix_cache_tokens: int = 40_000
    k: int = 4
    limit: int = 3
    temperature: float = 0.7
    concurrency: int = 16
    rewards: tuple[str, ...] = ("outcome", "ttrl", "empo", "funrl", "siop", "igpo")
    scribe: bool = False  # SCRIBE judged by the agent model: many LLM calls, off by default on CPU
    bench_groups: int = 4
    bench_k: int = 4
    # BFCL multi-turn planted groups have long prompts: SIOP/IGPO scoring them takes over 10 minutes on 2 CPU
    # cores, so the main job leaves them to `turngym creditbench --envs bfcl`
    bench_envs: tuple[str, ...] = ("searchqa", "mathcode")
    seed: int = 0
    setup_s: float | None = None  # measured by the caller (scripts/main.sh)
    runs: list[EnvRun] = field(default_factory=list)
    ray: str | None = None  # the evals' envs on a Ray actor pool ("auto" or an address; turngym.run.backends.ray_pool)
    env_workers: int = 2
    envs_per_worker: int | None = None
    ray_restarts: int | None = None
    step_budget_s: float | None = None

    def ray_fields(self) -> dict[str, Any]:
        """The run spec's Ray pool fields (``turngym.run.pipeline.RAY_POOL_FIELDS``), named as here."""
        from turngym.run.pipeline import RAY_POOL_FIELDS

        return {name: getattr(self, name) for name in RAY_POOL_FIELDS}


@dataclass(frozen=True)
class MainJobOutcome:
    """Where the report is, and every part that failed (``ablation/<reward>``, ``creditbench/<env>/<reward>``): the
    command exits non-zero when there is one, after everything else is written."""

    report: Path
    failures: dict[str, str]


def run_main_job(cfg: MainJobConfig, policy: Any = None,
                 progress: Callable[[str], RunProgress] | None = None) -> MainJobOutcome:
    """``policy``: an already loaded agent (then ``cfg.model`` only names it); ``progress(name)``: how each
    env's eval reports its turns and episodes (turngym.run.pipeline.RunProgress)."""
    from turngym.agents.loading import load_policy, model_identity
    from turngym.credit.ablate import ablate, make_rewards
    from turngym.credit.creditbench import BenchConfig, run_creditbench
    from turngym.episode.reader import read_episodes
    from turngym.evals.harness import EvalSpec, run_eval
    from turngym.rewards.base import reward_class
    from turngym.rewards.support import HFSupportScorer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = cfg.runs or default_runs(cfg.limit)
    times: dict[str, Any] = {"setup_s": cfg.setup_s, "cpu_s": {}}  # cpu_s: this process's CPU time per stage
    t0, c0 = time.perf_counter(), time.process_time()
    if cfg.ray is not None:  # a bad address or a missing [ray] extra is one message before the model loads
        from turngym.run.pipeline import RunSpec, join_ray, validate

        probe = RunSpec(env_id="turngym/Calculator-v0", **cfg.ray_fields())
        validate(probe)
        join_ray(probe)
    if policy is None:
        print(f"[main-job] loading agent {cfg.model!r}", flush=True)
        policy = load_policy(cfg.model)
    times["load_agent_s"] = round(time.perf_counter() - t0, 1)
    times["cpu_s"]["load_agent"] = round(time.process_time() - c0, 1)
    results: dict[str, Any] = {}
    episodes = []
    times["generation_s"] = {}
    for r in runs:
        t0, c0 = time.perf_counter(), time.process_time()
        spec = EvalSpec(env_id=r.env_id, env_kwargs=r.env_kwargs, model=cfg.model, k=cfg.k, limit=r.limit,
                        concurrency=cfg.concurrency, max_new_tokens=r.max_new_tokens, temperature=cfg.temperature,
                        seed=cfg.seed, **cfg.ray_fields())
        results[r.name] = run_eval(spec, out / r.name, policy=policy, progress=progress(r.name) if progress else None)
        times["generation_s"][r.name] = round(time.perf_counter() - t0, 1)
        times["cpu_s"][f"generation: {r.name}"] = round(time.process_time() - c0, 1)
        # a resumed run may hold episodes an older turngym wrote: their env's declaration fills what they lack
        episodes += read_episodes(out / r.name / "episodes.jsonl").episodes
        print(f"[main-job] {r.name}: " + ", ".join(f"{k} {v['value']:.3f}" for k, v in results[r.name]["metrics"].items()
                                                   if isinstance(v, dict) and "value" in v), flush=True)
    names = list(cfg.rewards) + (["scribe"] if cfg.scribe else [])
    t0, c0 = time.perf_counter(), time.process_time()
    scorer = None
    support = [n for n in names if reward_class(n).needs_scorer]  # siop, igpo: one scorer shared by all
    if support:
        if cfg.scorer == cfg.model:  # the agent itself, cast in place: one copy of the weights in memory
            import torch

            scorer = HFSupportScorer(policy.model.to(getattr(torch, cfg.scorer_dtype)), policy.tokenizer,
                                     prefix_cache_tokens=cfg.prefix_cache_tokens)
        else:
            scorer = HFSupportScorer.load(cfg.scorer, dtype=cfg.scorer_dtype, prefix_cache_tokens=cfg.prefix_cache_tokens)
    times["load_scorer_s"] = round(time.perf_counter() - t0, 1)
    times["cpu_s"]["load_scorer"] = round(time.process_time() - c0, 1)
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"[main-job] reward ablation: {len(episodes)} episodes, rewards {', '.join(names)}", flush=True)
    rewards = make_rewards(names, scorer=scorer, scribe_llm=policy if cfg.scribe else None, scribe_episodes=episodes)
    ablation = ablate(episodes, rewards, out / "ablation")
    times["ablation_s"] = round(time.perf_counter() - t0, 1)
    times["cpu_s"]["ablation"] = round(time.process_time() - c0, 1)
    if scorer is not None:
        scorer.clear_prefixes()  # the planted episodes share no prefix with the real ones
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"[main-job] creditbench: envs {', '.join(cfg.bench_envs)}, {cfg.bench_groups} groups x {cfg.bench_k}", flush=True)
    bench_cfg = BenchConfig(envs=cfg.bench_envs, groups=cfg.bench_groups, k=cfg.bench_k, seed=cfg.seed)
    # scripted episodes are text: the rewards that score support re-tokenise them
    bench_rewards = {**rewards, **make_rewards(support, scorer=scorer, tokens="text")}
    bench = run_creditbench(bench_cfg, bench_rewards, out / "creditbench")
    times["creditbench_s"] = round(time.perf_counter() - t0, 1)
    times["cpu_s"]["creditbench"] = round(time.process_time() - c0, 1)
    if scorer is not None:
        times["scorer_forwards"] = dict(scorer.stats)
    gen_total = sum(times["generation_s"].values())
    times["generation_total_s"] = round(gen_total, 1)
    times["scoring_total_s"] = round(times["ablation_s"] + times["creditbench_s"], 1)
    times["total_in_process_s"] = round(times["load_agent_s"] + times["load_scorer_s"] + gen_total
                                        + times["scoring_total_s"], 1)
    identity = {"agent": model_identity(cfg.model), "scorer": model_identity(cfg.scorer) if scorer else None}
    (out / "main_job.json").write_text(json.dumps({"models": identity, "times": times, "config": {
        "k": cfg.k, "limit": cfg.limit, "temperature": cfg.temperature, "rewards": names,
        "scorer_dtype": cfg.scorer_dtype, "prefix_cache_tokens": cfg.prefix_cache_tokens,
        "bench_groups": cfg.bench_groups, "bench_k": cfg.bench_k, "seed": cfg.seed}}, indent=1, default=str))
    from turngym.credit.creditbench import failures as bench_failures

    failures = {**{f"ablation/{n}": e for n, e in ablation["errors"].items()},
                **{f"creditbench/{n}": e for n, e in bench_failures(bench).items()}}
    path = out / "report.md"
    path.write_text(_report(cfg, runs, results, ablation, bench, times, identity, failures))
    return MainJobOutcome(path, failures)


def _report(cfg: MainJobConfig, runs: list[EnvRun], results: dict[str, Any], ablation: dict[str, Any],
            bench: dict[str, Any], times: dict[str, Any], identity: dict[str, Any], failures: dict[str, str]) -> str:
    agent = identity["agent"]
    lines = ["# turngym main job", "",
             f"Agent: **{agent['name']}**" + (f" (sha256 `{agent['sha256']}`)" if agent.get("sha256") else "")
             + (f"; support scorer for siop/igpo: {identity['scorer']['name']}" if identity.get("scorer") else "")
             + f". K={cfg.k} samples per item at temperature {cfg.temperature}, first {cfg.limit} items of each subset.", "",
             *([f"**{len(failures)} part(s) failed**: " + "; ".join(f"{k}: {v}" for k, v in failures.items()), ""]
               if failures else []),
             "## Evals", "", "| env | subset | metrics | tool calls / episode | report |", "| --- | --- | --- | --- | --- |"]
    for r in runs:
        res = results[r.name]
        metrics = ", ".join(f"{k} {v['value']:.3f}" for k, v in res["metrics"].items() if isinstance(v, dict) and "value" in v)
        calls = res["behaviour"].get("tool_calls_per_episode", {}).get("value")
        subset = res["subset"].get("dataset", "") if isinstance(res.get("subset"), dict) else ""
        forced = (f", prompt {r.env_kwargs['prompt']}" if "prompt" in r.env_kwargs else "") + \
            (", first search forced" if r.env_kwargs.get("force_first_search") else "")
        lines.append(f"| {r.env_id} {r.env_kwargs.get('tool_format', '')}{forced} | {subset} | {metrics} | "
                     f"{'–' if calls is None else f'{calls:.2f}'} | [report]({r.name}/report.md) |")
    from turngym.credit.table import LEGEND, table

    lines += ["", "## Reward ablation on these episodes", "",
              (f"{ablation['groups']} groups, {ablation['episodes']} episodes, {ablation['turns_with_ground_truth']} turns with "
              "per-turn truth the envs declare. Credit accuracy on the paired estimator's advantages (AUC, 0.5 = none), "
              "beside the label-free baselines:"), "", LEGEND, ""]

    def f(x):
        return "–" if x is None else f"{x:.3f}"

    rows, extra = [], {}
    for n, m in ablation["rewards"].items():
        a = m["credit_accuracy_advantage"]
        rows.append((n, a["estimator"], a))
        extra[(n, a["estimator"])] = [f"{a.get('n_groups')}{'*' if 'scope' in m else ''}"]
    lines += table(rows, ablation.get("baselines", {}), ["groups"], extra)
    if ablation.get("gold_only"):
        g = ablation["gold_only"]
        lines += ["", (f"\\* needs a gold answer: scored on the {g['groups']} groups of {', '.join(g['envs'])}; "
                       f"{g['left_out_groups']} groups of {', '.join(g['left_out_envs'])} carry none.")]
    lines += ["", "Full table: [ablation/ablation.md](ablation/ablation.md).", "",
              "## Credit benchmark (planted per-turn truth)", "",
              "Pooled AUC / within-episode AUC on the paired estimator's advantages († not above the best label-free "
              "baseline):", "", "| reward | " + " | ".join(bench["envs"]) + " |",
              "| --- |" + " --- |" * len(bench["envs"])]

    def pair(sc: dict[str, Any]) -> str:
        beats = sc.get("beats_label_free") or {}
        return " / ".join(f(sc.get(k)) + (" †" if beats.get(k) is False else "") for k in ("auc", "within_auc"))

    for n in next(iter(bench["envs"].values()))["rewards"] if bench["envs"] else []:
        cells = []
        for e in bench["envs"].values():
            w = e["rewards"].get(n, {})
            cells.append("failed" if "error" in w else pair(w.get("advantage", {})))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    for b, label in (("position", "label-free: relative position"), ("remaining", "label-free: −(turns remaining)"),
                     ("outcome", "label-free: outcome broadcast")):
        lines.append(f"| *{label}* | " + " | ".join(pair(e.get("baselines", {}).get(b, {})) for e in bench["envs"].values())
                     + " |")
    cpu = times.get("cpu_s", {})
    c = lambda key: cpu.get(key, "–")  # noqa: E731
    lines += ["", ("AUC on advantages; intervals, raw-reward and next-turn columns: "
              "[creditbench/creditbench.md](creditbench/creditbench.md)."), "", "## Wall time", "",
              ("Wall seconds, and this process's CPU seconds (all its threads; the sandbox's interpreter processes "
               "not counted): on a shared machine the wall time grows with the load, the CPU time much less."), "",
              "| stage | wall s | CPU s |", "| --- | --- | --- |"]
    if times.get("setup_s") is not None:
        lines.append("| set-up (scripts/setup.sh and the model extra; one-time model conversion excluded when cached) "
                     f"| {times['setup_s']} | – |")
    lines += [f"| load agent model | {times['load_agent_s']} | {c('load_agent')} |",
              f"| support scorer ready (the agent cast to {cfg.scorer_dtype}, or a separate load) "
              f"| {times['load_scorer_s']} | {c('load_scorer')} |"]
    lines += [f"| generation: {k} (includes env steps and result writing) | {v} | {c('generation: ' + k)} |"
              for k, v in times["generation_s"].items()]
    lines += [f"| scoring: reward ablation | {times['ablation_s']} | {c('ablation')} |",
              f"| scoring: creditbench (build + score) | {times['creditbench_s']} | {c('creditbench')} |",
              f"| total in process | {times['total_in_process_s']} | {round(sum(cpu.values()), 1) if cpu else '–'} |", ""]
    if times.get("scorer_forwards"):
        f = times["scorer_forwards"]
        lines += [f"Support scorer: {f['forwards']} forwards over {f['tokens']} tokens; {f['prefix_reused']} longest-prefix "
                  "forwards reused (siop and igpo score the same episodes).", ""]
    return "\n".join(lines)
