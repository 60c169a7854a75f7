"""``turngym lm-eval-tasks`` (task YAMLs for turngym's benchmarks) and ``turngym lm-eval`` (lm-eval's own command line)."""

from __future__ import annotations

import argparse
from typing import Any

COMMANDS = ("lm-eval-tasks", "lm-eval")

# printed before lm-eval's own help, which knows nothing of the model turngym registers
HELP = """usage: turngym lm-eval [lm-eval's options] --model turngym --model_args ARGS

lm-eval's own command line with the 'turngym' model registered: it plays each request as a whole
turngym episode (one backend call per turn, the env's stop strings) and lm-eval scores the outcome the
env graded. turngym's tasks come from `turngym lm-eval-tasks --out DIR`, found with --include_path DIR.

--model_args of the 'turngym' model (comma-separated KEY=VALUE):
  backend=NAME         the lm-eval backend that generates (hf, vllm, local-completions, ...; default hf)
  max_turns=N          turns per episode (default 4)
  max_new_tokens=N     tokens per turn (default 256)
  concurrency=N        episodes played at once (default 8)
  retriever=SPEC       SearchQA-v0's retriever (a Lucene index folder, dense:PATH, hybrid:..., or a URL)
  anything else        goes to the backend: pretrained= takes a hub id, a folder, turngym's model names
                       (default, qwen2.5-coder-0.5b-instruct) and .gguf files; with backend=hf, device=
                       defaults to cuda when there is one, else cpu

example: turngym lm-eval --include_path lm_eval_tasks --tasks turngym_gsm8k --model turngym \\
           --model_args backend=hf,pretrained=default,max_turns=2 --limit 2

lm-eval's own options follow.
"""


def add_parser(sub: Any) -> None:
    lt = sub.add_parser("lm-eval-tasks", help="write lm-eval task YAMLs for turngym's benchmarks")
    lt.add_argument("--out", required=True, help="folder for the task YAMLs")
    lt.add_argument("--datasets", default=None, help="comma-separated (default: all)")
    lt.add_argument("--limit", type=int, default=None, help="items per task (default: all)")
    lt.set_defaults(run=run)
    # listed for --help only: main() hands `turngym lm-eval ARGS` to lm-eval's own parser before this one runs
    sub.add_parser("lm-eval", add_help=False, help="lm-eval's own command line with the 'turngym' model registered")


def run(args: argparse.Namespace) -> int:
    from turngym.integrations.lm_eval_bridge import write_tasks

    names = write_tasks(args.out, args.datasets.split(",") if args.datasets else None, args.limit)
    print(f"wrote {len(names)} tasks to {args.out}: {', '.join(names)}")
    print(f"run: turngym lm-eval --include_path {args.out} --tasks {names[0]} --model turngym "
          "--model_args backend=hf,pretrained=MODEL")
    return 0


def run_lm_eval(argv: list[str]) -> int:
    from turngym.cli._common import fail
    from turngym.integrations.lm_eval_bridge import main as lm_eval_main

    if not argv or any(a in ("-h", "--help") for a in argv):
        print(HELP, flush=True)
    try:
        lm_eval_main(argv)
    except ValueError as exc:
        if not str(exc).startswith("Tasks not found"):  # lm-eval's own message for an unknown --tasks name
            raise
        fail(f"{exc}. lm-eval lists its tasks with `turngym lm-eval ls tasks`; turngym's own are written by "
             "`turngym lm-eval-tasks --out DIR` and found with --include_path DIR")
    return 0
