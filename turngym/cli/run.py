"""``turngym play``, ``rollout`` and ``eval``: the run commands, each a writer over one pipeline (turngym.run.pipeline)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turngym.cli._common import (
    add_batching,
    add_env_args,
    add_model_args,
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

COMMANDS = ("play", "rollout", "eval")


def add_parser(sub: Any) -> None:
    play = sub.add_parser("play", help="play one episode, printing each turn as it happens")
    add_env_args(play)
    add_model_args(play)
    play.add_argument("--index", type=int, default=0, help="dataset item (file order)")
    play.add_argument("--question", default=None, help="an ad-hoc question instead of a dataset item")
    play.add_argument("--answer", action="append", default=None, help="gold answer for --question (repeatable)")
    play.add_argument("--human", action="store_true", help="type the agent's actions yourself")
    play.add_argument("--out", default=None, help="append the episode to this JSONL file")
    add_ray_args(play)
    play.set_defaults(run=run)

    ro = sub.add_parser("rollout", help="play many episodes concurrently into a resumable JSONL file")
    add_env_args(ro)
    add_model_args(ro)
    ro.add_argument("--out", required=True, type=Path, help="episodes JSONL (settings and subset are kept beside it)")
    ro.add_argument("--limit", type=int, default=8, help="first N items (file order) from --start")
    ro.add_argument("--start", type=int, default=0, help="first item (file order)")
    ro.add_argument("--k", type=int, default=1, help="rollouts per item (one group)")
    ro.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    add_batching(ro)
    add_ray_args(ro)
    ro.add_argument("--overwrite", action="store_true",
                    help="start fresh when --out holds episodes of other settings (they are moved aside, not deleted)")
    ro.set_defaults(run=run)

    ev = sub.add_parser("eval", help="evaluate a model on an env and dataset subset (resumable, shardable)")
    add_env_args(ev)
    add_model_args(ev, temperature=0.0)
    ev.add_argument("--out", required=True, help="the run's folder (episodes, run.json, results, report, viewer)")
    ev.add_argument("--limit", type=int, default=None, help="first N items (file order) from --start (default: all)")
    ev.add_argument("--start", type=int, default=0, help="first item (file order)")
    ev.add_argument("--subset", default=None, help="file of item ids or indices (JSON list or one per line)")
    ev.add_argument("--k", type=int, default=1, help="samples per item (pass@k)")
    ev.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    add_batching(ev)
    add_ray_args(ev)
    ev.add_argument("--shard", default=None, metavar="I/N",
                    help="play only slice I of N of the subset (every N-th item from the I-th); merge the N folders "
                         "with --merge")
    ev.add_argument("--merge", nargs="+", default=None, metavar="SHARD_DIR",
                    help="merge the folders of --shard 1/N..N/N into --out (one run; nothing is played)")
    ev.add_argument("--overwrite", action="store_true",
                    help="start fresh when --out holds a run of other settings (its files are moved aside, not deleted)")
    add_reward_args(ev, None, " (default: none): after the run, score its episodes with these rewards into OUT/ablation, "
                    "as `turngym ablate` does")
    add_tracker_arguments(ev)
    ev.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from turngym.agents.policy import PolicyError
    from turngym.run.pipeline import PipelineError

    command = {"play": _play, "rollout": _rollout, "eval": _eval}[args.command]
    return attempt(lambda: command(args), PipelineError, PolicyError, FileNotFoundError)


def _spec(args: argparse.Namespace, env: str | None = None, dataset: str | None = None, **fields: Any):
    from turngym.run.pipeline import RunSpec, env_id, env_kwargs

    kwargs = env_kwargs(args.env_arg, args.dataset if dataset is None else dataset, args.max_turns)
    return RunSpec(env_id=env_id(env or args.env), env_kwargs=kwargs, model=args.model, base_url=args.base_url,
                   server=args.server, prompt_format=args.prompt_format, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, seed=args.seed, **ray_fields(args), **fields)


# ----------------------------------------------------------------------------- play


def _play(args: argparse.Namespace) -> int:
    from turngym.agents.runner import RolloutTask
    from turngym.cli._progress import TurnPrinter
    from turngym.run.outputs import NoWriter
    from turngym.run.pipeline import execute

    if args.human:
        return _play_human(args)
    task = (RolloutTask(index=args.index) if args.question is None
            else RolloutTask(task={"question": args.question, "answers": args.answer or []}))
    spec = _spec(args, k=1, concurrency=1, tasks=[task])
    printer = TurnPrinter()
    outcome = execute(spec, NoWriter(), progress=printer)
    [episode] = outcome.episodes
    state = "terminated" if episode.terminated else "truncated"
    print(f"\n=== {state} after {len(episode.turns)} turns; final answer {episode.final_answer!r}; "
          f"gold {episode.task.get('answers')}; outcome {episode.outcome}")
    if args.out:
        from turngym.episode import EpisodeWriter

        with EpisodeWriter(args.out) as w:
            w.write(episode)
        print(f"episode appended to {args.out}")
    return 0


def _play_human(args: argparse.Namespace) -> int:
    from turngym.run.pipeline import PipelineError, make_env, styled_env_kwargs

    spec = _spec(args)
    env = make_env(spec.env_id, styled_env_kwargs(spec, "chat"))  # a person reads and writes chat turns
    if args.question is None and not 0 <= args.index < env.unwrapped.num_items():
        raise PipelineError(f"--index {args.index} is out of range ({spec.env_id} has {env.unwrapped.num_items()} items)")
    options: dict[str, Any] = ({"index": args.index} if args.question is None
                               else {"task": {"question": args.question, "answers": args.answer or []}})
    obs, info = env.reset(seed=args.seed, options=options)
    print(obs)
    while True:
        try:
            action = input("\n[you] > ")
        except EOFError:
            print("\n(input closed)")
            return 0
        obs, reward, terminated, truncated, info = env.step(action)
        print(f"[env] {obs}" if obs else "")
        if terminated or truncated:
            print(f"episode ended ({'terminated' if terminated else 'truncated'}); outcome: {info['outcome']}")
            return 0


# ----------------------------------------------------------------------------- rollout


def _rollout(args: argparse.Namespace) -> int:
    from turngym.cli._progress import BarProgress
    from turngym.episode.reader import read_episodes
    from turngym.run.outputs import JsonlWriter
    from turngym.run.pipeline import execute

    spec = _spec(args, k=args.k, concurrency=args.concurrency, batching=args.batching, start=args.start, limit=args.limit)
    bar = BarProgress()
    try:
        outcome = execute(spec, JsonlWriter(args.out), progress=bar, overwrite=args.overwrite)
    finally:
        bar.finish()
    if outcome.note:
        bar.stage(outcome.note)
    report = read_episodes(args.out)
    acc = [e.outcome.get("correct") for e in report.episodes if "correct" in e.outcome]
    print(f"{len(outcome.episodes)} new episodes; {len(report.episodes)} in {args.out}"
          + (f"; accuracy {sum(map(bool, acc)) / len(acc):.3f}" if acc else ""))
    return 0


# ----------------------------------------------------------------------------- eval


def _eval(args: argparse.Namespace) -> int:
    if args.merge:
        return _merge(args)
    if "," in args.env:  # several envs in one process: the model is loaded once and reused
        return _eval_many(args)
    from turngym.cli._progress import BarProgress
    from turngym.evals.harness import run_eval
    from turngym.run.pipeline import Shard

    rewards = reward_labels(args) if args.rewards else []  # an unknown reward or option: one line, before the model loads
    spec = _spec(args, k=args.k, limit=args.limit, start=args.start, subset_file=args.subset,
                 concurrency=args.concurrency, batching=args.batching,
                 shard=Shard.parse(args.shard) if args.shard else None)
    bar = BarProgress()
    try:
        results = run_eval(spec, args.out, progress=bar, overwrite=args.overwrite)
    finally:
        bar.finish()
    _print_results(results, Path(args.out))
    failures = _score_rewards(Path(args.out), rewards) if rewards else {}
    log_trackers(args, args.out)
    return failed(failures, args.out)


def _score_rewards(out: Path, rewards: list[str]) -> dict[str, str]:
    """``eval --rewards``: the run's episodes scored by each reward, the same ablation ``turngym ablate`` writes;
    returns the rewards that failed (reward → error)."""
    from turngym.credit.ablate import run_ablation

    summary = attempt(lambda: run_ablation(out / "episodes.jsonl", rewards, out / "ablation"), FileNotFoundError, ValueError)
    for name, err in summary["errors"].items():
        print(f"{name}: FAILED: {err}")
    print(f"rewards: {out / 'ablation' / 'ablation.md'}")
    return {f"reward {name}": err for name, err in summary["errors"].items()}


def _print_results(results: dict[str, Any], out: Path, prefix: str = "") -> None:
    from turngym.views.report import format_metric

    for name, m in results["metrics"].items():
        print(f"{prefix}{name}: {format_metric(m)} (n={m['n']})")
    if results.get("ungraded"):
        print(f"ungraded: {results['ungraded']} episode(s) without a verdict, left out of the rates (see report.md)")
    print(f"report: {out / 'report.md'}")


def _eval_many(args: argparse.Namespace) -> int:
    """``--env A[:dataset],B[:dataset] --out DIR``: every env checked first, the model loaded once and reused;
    each env's results go to ``DIR/<env>[-<dataset>]``."""
    from turngym.cli._progress import BarProgress
    from turngym.evals.harness import run_eval
    from turngym.run.pipeline import PipelineError, join_ray, load_policy, prepare, validate

    if args.dataset:
        fail("with several envs give each its dataset as --env NAME:DATASET, not --dataset")
    rewards = reward_labels(args) if args.rewards else []
    if args.subset or args.shard:
        fail("--subset and --shard name items of one dataset; evaluate several envs with --limit/--start")
    runs = []
    for part in (p.strip() for p in args.env.split(",") if p.strip()):
        name, _, dataset = part.partition(":")
        spec = _spec(args, env=name, dataset=dataset or "", k=args.k, limit=args.limit, start=args.start,
                     concurrency=args.concurrency, batching=args.batching)
        out = Path(args.out) / (spec.env_id.split("/")[-1] + (f"-{dataset}" if dataset else ""))
        try:
            validate(spec)
            prepare(spec)
        except PipelineError as exc:
            fail(f"({spec.env_id}) {exc}")
        runs.append((spec, out))
    bar = BarProgress()
    bar.stage(f"{len(runs)} envs checked; the model is loaded once for all of them")
    join_ray(runs[0][0])  # a bad --ray address is one message before the model loads
    policy = load_policy(runs[0][0], bar)
    failures: dict[str, str] = {}
    for spec, out in runs:
        bar = BarProgress(desc=spec.env_id.split("/")[-1])
        try:
            results = run_eval(spec, out, policy=policy, progress=bar, overwrite=args.overwrite)
        except PipelineError as exc:
            fail(f"({spec.env_id}) {exc}")
        finally:
            bar.finish()
        _print_results(results, out, prefix=f"{spec.env_id} ")
        if rewards:
            failures.update({f"{spec.env_id} {k}": v for k, v in _score_rewards(out, rewards).items()})
    return failed(failures, args.out)


def _merge(args: argparse.Namespace) -> int:
    from turngym.evals.harness import merge_shards

    results = merge_shards(args.merge, args.out)
    print(f"merged {len(args.merge)} shards: {results['episodes']} episodes")
    _print_results(results, Path(args.out))
    return 0
