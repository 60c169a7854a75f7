"""The ``turngym`` command (also ``python -m turngym``): one module per command group, each with
``add_parser(sub)`` and ``run(args)``.

Building the parser imports only the command modules, never what they run (``turngym --help`` needs no
numpy, gymnasium, httpx or torch); a command imports its library when it runs, and turns the library's
typed errors into one ``error:`` line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from turngym._version import __version__
from turngym.cli import analysis, credit, imports, index, lm_eval, run, scribe, serve, train
from turngym.cli._common import Parser, fail
from turngym.cli._stops import stops
from turngym.extras import MissingExtra

GROUPS = (run, index, train, analysis, scribe, credit, imports, serve, lm_eval)  # the order --help lists them


def build_parser() -> Parser:
    p = Parser(prog="turngym", description="Multi-turn tool-use environments, turn-level rewards, evaluation and "
               "GRPO training.")
    p.add_argument("--version", action="version", version=f"turngym {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with stops():  # SIGTERM → 143, Ctrl-C → 130: one line each, the finished episodes flushed
        return _main(argv)


def _main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["lm-eval"]:  # lm-eval's own command line, with the turngym model registered
            return lm_eval.run_lm_eval(argv[1:])
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # only `train` takes more: its YAML overrides and TRL flags (turngym/training/overrides.py)
            if args.command != "train":
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            args.overrides = extra
        return int(args.run(args) or 0)
    except MissingExtra as exc:  # a part used without its optional install: the message names the pip command
        fail(exc)
