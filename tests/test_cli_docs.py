"""docs/cli.md names every ``turngym`` command the parser has (read from argparse's subparsers, nested ones
such as ``index build`` included), and ``turngym lm-eval --help`` shows turngym's part before lm-eval's."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from turngym.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """Every command path the parser takes (``eval``, ``index build``, ``import messages``, ...)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = f"{prefix}{name}"
                nested = commands(sub, path + " ")
                found.extend(nested or [path])
    return found


def test_the_parser_has_nested_commands():
    found = commands(build_parser())
    assert {"eval", "serve-env", "lm-eval", "index build", "scribe diagnose", "import messages"} <= set(found)


def test_cli_md_lists_every_command():
    table = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split("\n## ", 1)[0]  # the page's command table
    listed = set(re.findall(r"`([a-z][a-z-]*(?: [a-z][a-z-]*)?)(?: \(|`)", table))
    assert [c for c in commands(build_parser()) if c not in listed] == []


def test_lm_eval_help_shows_turngyms_part_first():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "turngym.cli", "lm-eval", "--help"], env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.startswith("usage: turngym lm-eval"), out[:500]
    ours, theirs = out.index("--model_args of the 'turngym' model"), out.index("lm-eval's own options follow.")
    assert ours < theirs and "max_turns=N" in out[ours:theirs]
    assert "--tasks" in out[theirs:]  # lm-eval's own help follows
