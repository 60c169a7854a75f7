"""The ``turngym`` command (also ``python -m turngym``): one subcommand per job; ``turngym --help`` lists them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turngym.evals.commands import env_kwargs as _env_kwargs


def _port(text: str) -> int:
    """A TCP port for argparse: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {port}")
    return port


def _env_id(name: str) -> str:
    return name if "/" in name else f"turngym/{name}"


def _make_env(args: argparse.Namespace, prompt_style: str | None):
    import gymnasium

    import turngym  # noqa: F401 - registers the envs

    kwargs = _env_kwargs(args.env_arg, args.dataset, args.max_turns)
    if prompt_style and "prompt_style" not in kwargs:
        kwargs["prompt_style"] = prompt_style
    env_id = _env_id(args.env)
    if env_id not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("turngym/"))
        raise SystemExit(f"unknown env {args.env!r}; turngym envs: {', '.join(known)}")
    try:
        return gymnasium.make(env_id, **kwargs)
    except TypeError as exc:
        raise SystemExit(f"bad arguments for {env_id}: {exc}") from None
    except (ValueError, FileNotFoundError, ImportError) as exc:  # e.g. a dataset that cannot be found
        raise SystemExit(f"error: cannot make {env_id} with {kwargs}: {exc}") from None


def _server_options(args: argparse.Namespace) -> dict[str, str]:
    """``--server``/``--prompt-format`` as policy arguments (one error line if they cannot apply)."""
    from turngym.agents.openai_compat import server_options

    try:
        return server_options(args.base_url, args.server, args.prompt_format)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def _load_policy(args: argparse.Namespace):
    from turngym.agents.loading import load_policy

    options = _server_options(args)
    print(f"loading model {args.model!r} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        policy = load_policy(args.model, base_url=args.base_url, **options)
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"model ready in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return policy


def _prompt_style(policy: Any) -> str:
    tok = getattr(policy, "tokenizer", None)
    return "chat" if tok is None or getattr(tok, "chat_template", None) else "base"


def _sampling(args: argparse.Namespace):
    from turngym.agents.policy import SamplingParams

    return SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)


def cmd_play(args: argparse.Namespace) -> int:
    from turngym.agents.runner import RolloutRunner, RolloutTask
    from turngym.envs.base import render_messages

    if args.human:
        env = _make_env(args, "chat")
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

    policy = _load_policy(args)
    style = _prompt_style(policy)
    task = (RolloutTask(index=args.index) if args.question is None
            else RolloutTask(task={"question": args.question, "answers": args.answer or []}))
    runner = RolloutRunner(policy, lambda: _make_env(args, style), _sampling(args), k=1, concurrency=1, seed=args.seed)
    [episode] = runner.run([task])
    print(render_messages(episode.prompt))
    for t in episode.turns:
        print(f"\n--- turn {t.index} [agent] ({t.latency_ms.get('generate', 0):.0f} ms)\n{t.action}")
        if t.parse_error:
            print(f"--- [parse error] {t.parse_error}")
        if t.observation is not None:
            print(f"--- turn {t.index} [env]\n{t.observation}")
    state = "terminated" if episode.terminated else "truncated"
    print(f"\n=== {state} after {len(episode.turns)} turns; final answer {episode.final_answer!r}; "
          f"gold {episode.task.get('answers')}; outcome {episode.outcome}")
    if args.out:
        from turngym.episode import EpisodeWriter

        with EpisodeWriter(args.out) as w:
            w.write(episode)
        print(f"episode appended to {args.out}")
    return 0


def _run_args_ok(args: argparse.Namespace) -> None:
    """One line for the first argument value of ``eval``/``rollout`` that cannot work."""
    from turngym.evals.runs import RunError, validate_run_args

    try:
        validate_run_args(k=args.k, concurrency=args.concurrency, max_new_tokens=args.max_new_tokens,
                          start=args.start, limit=args.limit, max_turns=args.max_turns, temperature=args.temperature)
    except RunError as exc:
        raise SystemExit(f"error: {exc}") from None


def cmd_rollout(args: argparse.Namespace) -> int:
    from turngym.evals.runs import RunError, RunLock

    _run_args_ok(args)
    _server_options(args)
    if args.out.is_dir():
        raise SystemExit(f"error: --out {args.out} is a folder; rollout writes one JSONL file")
    try:
        with RunLock(f"{args.out}.lock", f"episodes file {args.out}"):
            return _rollout_locked(args)
    except RunError as exc:
        raise SystemExit(f"error: {exc}") from None


def _rollout_locked(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from turngym.agents.runner import RolloutRunner
    from turngym.evals.runs import check_settings, store_settings

    probe = _make_env(args, None)  # env, dataset, index and settings are checked before the model loads
    try:
        probe.unwrapped.check_ready()
    except (RuntimeError, OSError, ValueError) as exc:
        raise SystemExit(f"error: {_env_id(args.env)} is not ready: {exc}") from None
    n = probe.unwrapped.num_items()
    if args.start >= n:
        raise SystemExit(f"error: --start {args.start} is past the end of the dataset ({n} items)")
    from turngym.agents.openai_compat import server_settings

    settings = {"env": _env_id(args.env), "env_kwargs": _env_kwargs(args.env_arg), "dataset": args.dataset,
                "max_turns": args.max_turns, "model": args.model, "base_url": args.base_url, "k": args.k,
                "sampling": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "seed": args.seed},
                **server_settings(_server_options(args))}
    outputs = [args.out, Path(f"{args.out}.manifest.json"), Path(f"{args.out}.torn")]
    check_settings(f"{args.out}.run.json", settings, outputs, args.overwrite)
    policy = _load_policy(args)
    note = store_settings(f"{args.out}.run.json", settings, outputs, args.overwrite)
    if note:
        print(note, file=sys.stderr)
    style = _prompt_style(policy)
    probe = _make_env(args, style)
    indices = list(range(args.start, min(n, args.start + args.limit)))
    try:
        runner = RolloutRunner(policy, lambda: _make_env(args, style), _sampling(args), k=args.k,
                               concurrency=args.concurrency, seed=args.seed, batching=args.batching)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    manifest = getattr(probe.unwrapped, "manifest", None)
    if manifest is not None:  # the exact subset this run covers, beside the episodes
        subset = manifest.subset(indices, probe.unwrapped.data.items).to_dict()
        subset.update({"indices": indices, "k": args.k, "model": args.model, "env": _env_id(args.env)})
        manifest_path = Path(f"{args.out}.manifest.json")
        manifest_path.parent.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps(subset, indent=1))
    bar = tqdm(total=len(indices) * args.k, desc="episodes", unit="ep")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    eps = runner.run(indices, args.out, progress=progress)
    bar.close()
    from turngym.episode import read_episodes

    report = read_episodes(args.out)
    acc = [e.outcome.get("correct") for e in report.episodes if "correct" in e.outcome]
    print(f"{len(eps)} new episodes; {len(report.episodes)} in {args.out}"
          + (f"; accuracy {sum(map(bool, acc)) / len(acc):.3f}" if acc else ""))
    return 0


def cmd_index_build(args: argparse.Namespace) -> int:
    from turngym.corpora.corpus import default_passages, read_user_passages, write_collection
    from turngym.corpora.lucene import RetrieverError, build_index

    out = Path(args.out)
    collection = out.parent / f"{out.name}.collection"
    try:
        sources = default_passages() if args.default else (p for f in args.input for p in read_user_passages(f))
        n = write_collection(sources, collection, dedupe=not args.no_dedupe, progress=True)
        print(f"{n} passages written to {collection}; indexing with {args.threads} threads ...", flush=True)
        seconds = build_index(collection, out, threads=args.threads)
    except (FileNotFoundError, ValueError, RetrieverError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"index built in {seconds:.1f} s: {out}")
    return 0


def cmd_index_search(args: argparse.Namespace) -> int:
    from turngym.corpora.lucene import RetrieverError
    from turngym.corpora.service import make_retriever

    try:
        retriever = make_retriever(args.index)
        hits = retriever.search(args.query, args.k)
    except (FileNotFoundError, ValueError, RetrieverError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for rank, h in enumerate(hits, start=1):
        print(f"{rank:2d}  {h.score:8.3f}  {h.docid}  {h.title}: {h.text[:160]}")
    return 0


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    from turngym.corpora.corpus import default_index_dir
    from turngym.corpora.lucene import RetrieverError
    from turngym.corpora.service import RetrievalServer

    index = str(default_index_dir()) if args.index == "default" else args.index
    try:
        server = RetrievalServer(index, host=args.host, port=args.port, threads=args.threads, max_hits=args.max_hits)
    except (RetrieverError, OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"serving {index} on http://{args.host}:{server.server_address[1]}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from turngym.training.config import TrainConfig, build_trainer
    from turngym.training.overrides import apply_overrides, parse_overrides

    try:
        cfg = TrainConfig.load(args.config)
        apply_overrides(cfg, parse_overrides(args.overrides))
        if args.allow_eval_overlap:
            cfg.data["eval_overlap"] = "allow"
        trainer = build_trainer(cfg)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    trainer.train(resume_from_checkpoint=args.resume)
    trainer.save_model()
    print(f"model saved to {trainer.args.output_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    if "," in args.env:  # several envs in one process: the model is loaded once and reused
        from turngym.evals.commands import eval_many

        return eval_many(args)
    from tqdm import tqdm

    from turngym.agents.policy import PolicyError
    from turngym.agents.tokenization import ChatTemplateError
    from turngym.evals.harness import EvalError, EvalSpec, run_eval

    _run_args_ok(args)
    env_kwargs = _env_kwargs(args.env_arg, args.dataset, args.max_turns)
    spec = EvalSpec(env_id=_env_id(args.env), env_kwargs=env_kwargs, model=args.model, base_url=args.base_url, k=args.k,
                    limit=args.limit, start=args.start, subset_file=args.subset, concurrency=args.concurrency,
                    max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                    **_server_options(args))
    bars: list[Any] = []  # made on the first episode, so an early error prints alone

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(desc="episodes", unit="ep"))
        bar = bars[0]
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        results = run_eval(spec, args.out, progress=progress, overwrite=args.overwrite)
    except (EvalError, PolicyError, RuntimeError, FileNotFoundError, ChatTemplateError) as exc:
        for bar in bars:
            bar.close()
        raise SystemExit(f"error: {exc}") from None
    for bar in bars:
        bar.close()
    for name, m in results["metrics"].items():
        print(f"{name}: {m['value']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}] (n={m['n']})")
    if results.get("ungraded"):
        print(f"ungraded: {results['ungraded']} episode(s) without a verdict, left out of the rates (see report.md)")
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from turngym.evals.ablate import run_ablation
    from turngym.evals.credit_table import parse_estimators

    try:
        summary = run_ablation(args.episodes, [r.strip() for r in args.rewards.split(",") if r.strip()], args.out,
                               scorer=args.scorer, scribe_llm=args.scribe_llm, scribe_library=args.scribe_library,
                               scribe_base_url=args.scribe_base_url, reliability_repeats=args.reliability_repeats,
                               truth=args.truth, truth_map=args.truth_map, estimators=parse_estimators(args.estimators))
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for name, m in summary["rewards"].items():
        ca = m["credit_accuracy"]
        print(f"{name:8s} credit accuracy {'–' if ca is None else f'{ca:.3f}'}")
    for name, err in summary["errors"].items():
        print(f"{name:8s} FAILED: {err}")
    print(f"report: {Path(args.out) / 'ablation.md'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from turngym.evals.report import compare_runs

    try:
        path = compare_runs(args.dirs, args.out)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"report: {path}")
    return 0


def cmd_lm_eval_tasks(args: argparse.Namespace) -> int:
    from turngym.evals.lm_eval_bridge import write_tasks

    names = write_tasks(args.out, args.datasets.split(",") if args.datasets else None, args.limit)
    print(f"wrote {len(names)} tasks to {args.out}: {', '.join(names)}")
    print(f"run: turngym lm-eval --include_path {args.out} --tasks {names[0]} --model turngym "
          "--model_args backend=hf,pretrained=MODEL")
    return 0


class _Parser(argparse.ArgumentParser):
    """An argument parser whose help shows each option's default (subcommands inherit it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


class _TrainHelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the overrides' examples kept as written."""


TRAIN_OVERRIDES_HELP = """\
overrides of the YAML, applied in this order after it is read:
  SECTION.KEY=VALUE       any part of the config; VALUE is read as JSON, else kept as a string
                            reward.name=siop  estimator.gamma=0.9  env.kwargs.max_turns=3
                            trl.learning_rate=1e-6  model.name_or_path=DIR  max_episode_tokens=512
  --GRPOCONFIG_FIELD VALUE  TRL's own flags for trl: (parsed by TRL's HfArgumentParser over GRPOConfig)
                            --learning_rate 1e-6  --max_steps 50  --bf16 true  --report_to none
an unknown section, GRPOConfig field or flag is refused before anything is built."""


def build_parser() -> argparse.ArgumentParser:
    from turngym import __version__
    from turngym.agents.openai_compat import PROMPT_FORMATS, SERVERS

    p = _Parser(prog="turngym", description="Multi-turn tool-use environments, turn-level rewards, evaluation and GRPO training.")
    p.add_argument("--version", action="version", version=f"turngym {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--env", default="Calculator-v0", help="env id, e.g. MathCode-v0 or turngym/MathCode-v0")
        sp.add_argument("--dataset", default=None, help="dataset name, local file, or HF dataset id")
        sp.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="extra env argument")
        sp.add_argument("--max-turns", type=int, default=None)
        sp.add_argument("--model", default="default", help="'default' (Gemma 3 270M), a directory, a .gguf file, or a hub id")
        sp.add_argument("--base-url", default=None, help="OpenAI-compatible server URL (then --model is its model name)")
        sp.add_argument("--server", default="auto", choices=SERVERS,
                        help="with --base-url: vllm (sends vLLM-only fields, gets token ids), openai (the common API "
                             "only), or auto (asks the server's /models)")
        sp.add_argument("--prompt-format", default="chat", choices=PROMPT_FORMATS,
                        help="with --base-url: chat (/chat/completions with messages) or text (/completions with the "
                             "plain prompt, for base models)")
        sp.add_argument("--max-new-tokens", type=int, default=256)
        sp.add_argument("--temperature", type=float, default=0.7)
        sp.add_argument("--seed", type=int, default=0)

    play = sub.add_parser("play", help="play one episode and print each turn")
    common(play)
    play.add_argument("--index", type=int, default=0, help="dataset item (file order)")
    play.add_argument("--question", default=None, help="an ad-hoc question instead of a dataset item")
    play.add_argument("--answer", action="append", default=None, help="gold answer for --question")
    play.add_argument("--human", action="store_true", help="type the agent's actions yourself")
    play.add_argument("--out", default=None, help="append the episode to this JSONL file")
    play.set_defaults(func=cmd_play)

    ro = sub.add_parser("rollout", help="play many episodes concurrently into a resumable JSONL file")
    common(ro)
    ro.add_argument("--out", required=True, type=Path)
    ro.add_argument("--limit", type=int, default=8)
    ro.add_argument("--start", type=int, default=0)
    ro.add_argument("--k", type=int, default=1, help="rollouts per item (one group)")
    ro.add_argument("--concurrency", type=int, default=8)
    ro.add_argument("--overwrite", action="store_true",
                    help="start fresh when --out holds episodes of other settings (they are moved aside, not deleted)")
    ro.add_argument("--batching", choices=["static", "continuous"], default="static",
                    help="continuous (local models): a slot is refilled as soon as its turn ends")
    ro.set_defaults(func=cmd_rollout)

    index = sub.add_parser("index", help="build or query a BM25 Lucene index").add_subparsers(dest="index_command", required=True)
    ib = index.add_parser("build", help="index the embedded corpus (--default) or JSONL passage files")
    src = ib.add_mutually_exclusive_group(required=True)
    src.add_argument("--default", action="store_true", help="the embedded Wikipedia + dataset-context corpus")
    src.add_argument("--input", nargs="+", help='JSONL passages: {"id","contents"} or {"id","title","text"}')
    ib.add_argument("--out", required=True)
    ib.add_argument("--threads", type=int, default=2)
    ib.add_argument("--no-dedupe", action="store_true")
    ib.set_defaults(func=cmd_index_build)
    isr = index.add_parser("search", help="top-k BM25 hits for a query")
    isr.add_argument("query")
    isr.add_argument("--index", default="default", help="index directory, server URL, or 'default'")
    isr.add_argument("-k", type=int, default=3)
    isr.set_defaults(func=cmd_index_search)

    srv = sub.add_parser("serve-retriever", help="serve an index over HTTP (Search-R1 /retrieve)")
    srv.add_argument("--index", default="default")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=_port, default=8000)
    srv.add_argument("--threads", type=int, default=2)
    srv.add_argument("--max-hits", type=int, default=50_000, help="cap on queries x topk per request (413 above)")
    srv.set_defaults(func=cmd_serve_retriever)

    tr = sub.add_parser("train", help="GRPO with per-turn advantages (TRL); launch with accelerate for many GPUs",
                        usage="turngym train --config YAML [options] [SECTION.KEY=VALUE ...] [--GRPOCONFIG_FIELD VALUE ...]",
                        formatter_class=_TrainHelpFormatter, epilog=TRAIN_OVERRIDES_HELP)
    tr.add_argument("--config", required=True, help="YAML: env, data, reward, estimator, model, peft, trl")
    tr.add_argument("--resume", default=None, help="a checkpoint directory, or 'true' for the latest in output_dir")
    tr.add_argument("--allow-eval-overlap", action="store_true",
                    help="train even on items whose question is in an evaluation set (same as data.eval_overlap: allow)")
    tr.set_defaults(func=cmd_train, overrides=[])

    ev = sub.add_parser("eval", help="evaluate a model on an env and dataset subset (resumable)")
    common(ev)
    ev.add_argument("--out", required=True)
    ev.add_argument("--limit", type=int, default=None, help="first N items (file order) from --start")
    ev.add_argument("--start", type=int, default=0)
    ev.add_argument("--subset", default=None, help="file of item ids or indices (JSON list or one per line)")
    ev.add_argument("--k", type=int, default=1, help="samples per item (pass@k)")
    ev.add_argument("--concurrency", type=int, default=8)
    ev.add_argument("--overwrite", action="store_true",
                    help="start fresh when --out holds a run of other settings (its files are moved aside, not deleted)")
    ev.set_defaults(func=cmd_eval, temperature=0.0)

    ab = sub.add_parser("ablate", help="score saved groups with several reward wrappers and compare credit")
    ab.add_argument("--episodes", required=True)
    ab.add_argument("--rewards", default="outcome,ttrl,empo,siop,igpo")
    ab.add_argument("--scorer", default=None, help="support-scoring model for siop/igpo ('default', a directory, a hub id) "
                    "or JSON: {\"model\": ..., \"dtype\": ...} or {\"base_url\": ..., \"model\": ..., \"tokenizer\": ...}, "
                    "plus \"tokens\": \"text\" for a scorer of another model family")
    ab.add_argument("--scribe-llm", default="default", help="scribe's decomposer/judge model (or a served model name)")
    ab.add_argument("--scribe-base-url", default=None, help="OpenAI-compatible server for --scribe-llm")
    ab.add_argument("--scribe-library", default=None, help="a skill library JSON (default: built from the episodes)")
    ab.add_argument("--reliability-repeats", type=int, default=0,
                    help="N >= 2: add the judge-reliability table of scribe and prm (each step judged N times)")
    ab.add_argument("--truth", default=None, help="the per-turn truth key scored (Turn.truth; default: the one key "
                    "each episode carries)")
    ab.add_argument("--truth-map", default=None, help="truth value -> label, e.g. '+1:1,-1:0,0:skip' (needed for "
                    "non-binary truth such as human -1/0/+1 step labels)")
    ab.add_argument("--estimators", default="", help="score every reward under these estimators too (a,b,...), "
                    "besides its declared one")
    ab.add_argument("--out", required=True)
    ab.set_defaults(func=cmd_ablate)

    rp = sub.add_parser("report", help="runs side by side")
    rp.add_argument("dirs", nargs="+")
    rp.add_argument("--out", default="comparison.md")
    rp.set_defaults(func=cmd_report)

    from turngym.evals.viewer import add_view_command

    add_view_command(sub)

    from turngym.rewards.scribe.cli import add_scribe_commands

    add_scribe_commands(sub)

    from turngym.evals.commands import add_credit_commands

    add_credit_commands(sub)

    from turngym.importers import add_import_commands

    add_import_commands(sub)

    lt = sub.add_parser("lm-eval-tasks", help="write lm-eval task YAMLs for turngym's benchmarks")
    lt.add_argument("--out", required=True)
    lt.add_argument("--datasets", default=None, help="comma-separated (default: all)")
    lt.add_argument("--limit", type=int, default=None)
    lt.set_defaults(func=cmd_lm_eval_tasks)
    # listed for --help only: main() hands `turngym lm-eval ARGS` to lm-eval's own parser before this one runs
    sub.add_parser("lm-eval", add_help=False, help="lm-eval's own command line with the 'turngym' model registered")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["lm-eval"]:  # lm-eval's own command line, with the turngym model registered
        from turngym.evals.lm_eval_bridge import main as lm_eval_main

        lm_eval_main(argv[1:])
        return 0
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only `train` takes more: its YAML overrides and TRL flags (turngym/training/overrides.py)
        if args.command != "train":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = extra
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
