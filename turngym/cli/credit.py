"""``turngym creditbench`` (planted, exact or Monte-Carlo oracle) and ``turngym main-job``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from turngym.cli._common import (
    add_ray_args,
    add_reward_args,
    attempt,
    fail,
    failed,
    log_trackers,
    ray_fields,
    reward_labels,
)
from turngym.views.trackers import add_tracker_arguments


def cmd_exact_creditbench(args: argparse.Namespace) -> int:
    """``--oracle exact``: estimators' expected gradients against the exact policy gradient (turngym.oracles)."""
    from turngym.credit.exact_oracle import ESTIMATORS, run_exact
    from turngym.credit.external_advantages import register_external
    from turngym.credit.table import parse_estimators

    def run() -> dict[str, Any]:
        external = [register_external(spec, args.external_form) for spec in args.external]  # refused before any work
        ours = parse_estimators(args.estimators) or (EXTERNAL_BESIDE if external else ESTIMATORS)
        return run_exact(batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",") if b.strip()), batches=args.seeds,
                         group_size=args.group_size, seed=args.seed, estimators=(*ours, *external), out_dir=args.out)

    summary = attempt(run, ValueError)
    for r in summary["rows"]:
        cos = "–" if r["cosine"] is None else f"{r['cosine']:.4f}"
        print(f"{r['setting']:23s} {r['estimator']:14s} B={r['batch_size']:<5d} cos {cos}")
    print(f"report: {Path(args.out) / 'exact.md'}")
    return 0


EXTERNAL_BESIDE = ("grpo", "rloo", "turn_loo", "turn")  # what an --external function is compared with by default


def cmd_mc_creditbench(args: argparse.Namespace) -> int:
    """``--oracle mc``: per-turn Monte-Carlo values of recorded episodes, and credit against them."""
    from tqdm import tqdm

    from turngym.agents.policy import PolicyError
    from turngym.credit.mc_oracle import run_mc_creditbench
    from turngym.credit.table import parse_estimators
    from turngym.run.lock import RunError
    from turngym.run.pipeline import PipelineError, env_kwargs

    if not args.episodes:
        fail("--oracle mc needs --episodes FILE (e.g. a turngym eval run's episodes.jsonl)")
    bar = tqdm(desc="branches", unit="rollout", dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        summary = attempt(lambda: run_mc_creditbench(
            args.episodes, args.out, args.model, reward_labels(args),
            estimators=parse_estimators(args.estimators), env_kwargs=env_kwargs(args.env_arg) or None,
            rollouts=args.rollouts, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
            concurrency=args.concurrency, seed=args.seed, scorer=args.scorer, progress=progress),
            ValueError, FileNotFoundError, PolicyError, PipelineError, RunError)
    finally:
        bar.close()
    print(f"{summary['episodes']} episodes, {summary['rollouts']} continuations per prefix")
    print(f"report: {Path(args.out) / 'mc_oracle.md'}")
    return 0


def cmd_creditbench(args: argparse.Namespace) -> int:
    if args.oracle == "exact":
        return cmd_exact_creditbench(args)
    if args.oracle == "mc":
        return cmd_mc_creditbench(args)
    from turngym.credit.ablate import make_rewards
    from turngym.credit.creditbench import ENVS, BenchConfig, build, run_creditbench
    from turngym.credit.table import parse_estimators
    from turngym.progress import StageClock

    names = reward_labels(args)

    def bench() -> dict[str, Any]:
        cfg = BenchConfig(envs=tuple(e.strip() for e in args.envs.split(",") if e.strip()) or ENVS, groups=args.groups,
                          k=args.k, seed=args.seed, p_useful=args.p_useful, noise=args.noise,
                          retriever=None if args.index == "default" else args.index,
                          designs=tuple(d.strip() for d in args.designs.split(",") if d.strip()), truth=args.truth,
                          truth_map=args.truth_map, estimators=tuple(parse_estimators(args.estimators)))
        clock = StageClock()
        clock.stage(f"building the planted episodes ({', '.join(cfg.envs)})…")
        start = time.perf_counter()
        built = build(cfg)
        build_s = time.perf_counter() - start
        clock.stage("loading the rewards' models…")
        episodes = [e for groups in built.values() for g in groups for e in g]
        rewards = make_rewards(names, scorer=args.scorer, scribe_llm=args.scribe_llm, scribe_episodes=episodes,
                               tokens="text")  # scripted episodes carry text, not a policy's ids
        return run_creditbench(cfg, rewards, args.out, n_boot=args.bootstrap, built=built, build_s=build_s,
                               progress=clock.stage)

    summary = attempt(bench, FileNotFoundError, ValueError, RuntimeError)
    for env_name, e in summary["envs"].items():
        for name, w in e["rewards"].items():
            if "error" in w:
                print(f"{env_name:9s} {name:8s} FAILED: {w['error']}")
                continue
            a = w["advantage"]["auc"]
            print(f"{env_name:9s} {name:8s} credit AUC on advantages {'–' if a is None else f'{a:.3f}'} ({w['estimator']})")
    print(f"report: {Path(args.out) / 'creditbench.md'}")
    log_trackers(args, args.out)
    from turngym.credit.creditbench import failures

    return failed(failures(summary), str(Path(args.out) / "creditbench.md"))


def cmd_main_job(args: argparse.Namespace) -> int:
    from turngym.cli._progress import BarProgress
    from turngym.evals.mainjob import MainJobConfig, run_main_job

    if args.rewards is None:
        args.rewards = ",".join(MainJobConfig.rewards)
    cfg = MainJobConfig(out=Path(args.out), model=args.model, scorer=args.scorer or args.model, k=args.k, limit=args.limit,
                        concurrency=args.concurrency, scribe=args.scribe, bench_groups=args.bench_groups,
                        bench_k=args.bench_k, seed=args.seed, setup_s=args.setup_s,
                        bench_envs=tuple(e.strip() for e in args.bench_envs.split(",") if e.strip()),
                        scorer_dtype=args.scorer_dtype, prefix_cache_tokens=args.prefix_cache_tokens,
                        rewards=tuple(reward_labels(args)), **ray_fields(args))
    job = attempt(lambda: run_main_job(cfg, progress=lambda name: BarProgress(desc=name)),
                  FileNotFoundError, ValueError, RuntimeError)
    print(f"report: {job.report}")
    return failed(job.failures, str(job.report))


COMMANDS = ("creditbench", "main-job")


def add_parser(sub: Any) -> None:
    cb = sub.add_parser("creditbench", help="rewards on episodes with planted per-turn truth (credit accuracy)")
    cb.add_argument("--out", required=True)
    cb.add_argument("--envs", default="searchqa,mathcode,bfcl", help="envs with planted truth, comma-separated")
    add_reward_args(cb, "outcome,ttrl,empo,funrl,siop,igpo", "; add scribe to judge with --scribe-llm")
    cb.add_argument("--scorer", default="qwen2.5-coder-0.5b-instruct", help="support-scoring model for siop/igpo")
    cb.add_argument("--scribe-llm", default="qwen2.5-coder-0.5b-instruct", help="scribe's decomposer/judge model")
    cb.add_argument("--groups", type=int, default=8, help="groups per env")
    cb.add_argument("--k", type=int, default=4, help="episodes per group")
    cb.add_argument("--seed", type=int, default=0)
    cb.add_argument("--p-useful", type=float, default=0.5, help="chance a tool turn is useful (label 1)")
    cb.add_argument("--noise", type=float, default=0.15, help="chance the final answer ignores the evidence")
    cb.add_argument("--index", default="default", help="SearchQA index directory or server URL")
    cb.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the intervals")
    cb.add_argument("--designs", default="random", help="random (each tool turn useful with --p-useful), contrast "
                    "(useful and useless tool turns in every episode, both orders; searchqa and mathcode), or both: "
                    "random,contrast")
    cb.add_argument("--truth", default="planted", help="the per-turn truth key scored (planted, or an env's own such "
                    "as retrieval_hit)")
    cb.add_argument("--truth-map", default=None, help="truth value -> label, e.g. '+1:1,-1:0,0:skip'")
    cb.add_argument("--estimators", default="", help="score every reward under these estimators too (a,b,...), "
                    "besides its declared one")
    cb.add_argument("--oracle", choices=("planted", "exact", "mc"), default="planted",
                    help="planted: rewards on scripted episodes; exact: estimators' gradients on small MDPs; "
                         "mc: Monte-Carlo turn values of recorded episodes (--episodes) from branched continuations")
    cb.add_argument("--episodes", default=None, help="--oracle mc: the recorded episodes (JSONL, one env)")
    cb.add_argument("--rollouts", type=int, default=8, help="--oracle mc: continuations per prefix")
    cb.add_argument("--model", default=None,
                    help="--oracle mc: the policy that continues (default: the episodes' run settings' model)")
    cb.add_argument("--env-arg", action="append", default=[], help="--oracle mc: env option key=value (default: run.json)")
    cb.add_argument("--temperature", type=float, default=None,
                    help="--oracle mc: sampling temperature (default: run.json's, else 1.0)")
    cb.add_argument("--max-new-tokens", type=int, default=None,
                    help="--oracle mc: tokens per turn (default: run.json's, else 256)")
    cb.add_argument("--concurrency", type=int, default=8, help="--oracle mc: episodes in flight")
    cb.add_argument("--batch-sizes", default="4,32,256", help="--oracle exact: episodes per batch")
    cb.add_argument("--group-size", type=int, default=None, help="--oracle exact: episodes per group (default: the batch)")
    cb.add_argument("--seeds", type=int, default=200, help="--oracle exact: independent batches per batch size")
    cb.add_argument("--external", action="append", default=[], metavar="MODULE:FUNCTION",
                    help="--oracle exact: also score this advantage function of another framework (repeatable); "
                         "compared with --estimators (default: grpo, rloo, turn_loo, turn)")
    cb.add_argument("--external-form", default="turns", choices=("turns", "verl"),
                    help="how --external takes rewards: turns (per-turn lists in and out) or verl (core_algos' "
                         "token_level_rewards, response_mask, index; one token per turn)")
    add_tracker_arguments(cb)
    cb.set_defaults(run=run)

    mj = sub.add_parser("main-job", help="evals on every env, reward ablation and creditbench in one process")
    mj.add_argument("--out", default="runs/main", help="output folder (one subfolder per stage)")
    mj.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="the agent model")
    mj.add_argument("--scorer", default=None, help="support scorer for siop/igpo (default: the agent model, fp32)")
    mj.add_argument("--k", type=int, default=4, help="samples per item (one group)")
    mj.add_argument("--limit", type=int, default=3, help="items per env")
    mj.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    mj.add_argument("--scribe", action="store_true", help="also score with SCRIBE judged by the agent model (slow on CPU)")
    add_reward_args(mj, None, " (default: the main job's: outcome, ttrl, empo, funrl, siop, igpo); --scribe adds scribe")
    mj.add_argument("--bench-groups", type=int, default=4, help="creditbench groups per env")
    mj.add_argument("--bench-envs", default="searchqa,mathcode", help="creditbench envs (bfcl too: slow on CPU)")
    mj.add_argument("--bench-k", type=int, default=4, help="creditbench episodes per group")
    mj.add_argument("--seed", type=int, default=0)
    add_ray_args(mj)
    mj.add_argument("--setup-s", type=float, default=None, help="set-up seconds measured by the caller, for the report")
    mj.add_argument("--scorer-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="dtype the support scorer runs in (float32: the reference setting)")
    mj.add_argument("--prefix-cache-tokens", type=int, default=40_000,
                    help="tokens of longest-prefix forwards the scorer keeps for siop and igpo to share (0: none)")
    mj.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return cmd_creditbench(args) if args.command == "creditbench" else cmd_main_job(args)
