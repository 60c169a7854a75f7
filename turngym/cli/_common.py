"""What the command modules share: the parser class, argument groups, and turning errors into one line.

Imports nothing heavy: ``turngym --help`` builds every parser without numpy, gymnasium, httpx or torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from turngym.agents.options import BATCHING, PROMPT_FORMATS, SERVERS

T = TypeVar("T")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, except the uninformative ones (None, off, suppressed)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An argument parser whose help shows each option's default (subcommands inherit it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def fail(exc: object) -> NoReturn:
    """End the command with one line on stderr and exit status 1."""
    raise SystemExit(f"error: {exc}")


def attempt(call: Callable[[], T], *errors: type[Exception]) -> T:
    """``call()``, where one of ``errors`` (the user's to fix: a missing file, a bad value) ends the command
    as one line (:func:`fail`); any other exception is a bug and keeps its traceback."""
    try:
        return call()
    except errors as exc:
        fail(exc)


def failed(failures: dict[str, str], written: str) -> int:
    """A command's exit status once everything that succeeded is written: 0, or 1 with one line naming every part
    that failed (a reward, a stage, a shard) and where the rest is (``written``)."""
    if not failures:
        return 0
    print(f"error: {len(failures)} part(s) failed ({', '.join(failures)}); everything else is written in {written}, "
          "where the failures are marked", file=sys.stderr, flush=True)
    return 1


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def port(text: str) -> int:
    """A TCP port for argparse: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def add_env_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--env", default="Calculator-v0", help="env id, e.g. MathCode-v0 or turngym/MathCode-v0")
    sp.add_argument("--dataset", default=None, help="dataset name, local file, or HF dataset id (default: the env's)")
    sp.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="extra env argument")
    sp.add_argument("--max-turns", type=int, default=None, help="turn limit (default: the env's)")


def add_reward_args(sp: argparse.ArgumentParser, default: str | None, help_extra: str = "") -> None:
    """``--rewards`` (labels, comma-separated; a label may carry options) and ``--reward-arg NAME.KEY=VALUE``."""
    sp.add_argument("--rewards", default=default,
                    help="rewards, comma-separated; a reward with options is written name[key=value,...] (quote it in "
                         "the shell), e.g. 'siop,siop[prefix=after_observation]' to compare both" + help_extra)
    sp.add_argument("--reward-arg", action="append", default=[], metavar="NAME.KEY=VALUE",
                    help="an option for every reward NAME among --rewards, e.g. siop.prefix=after_observation")


def reward_labels(args: argparse.Namespace) -> list[str]:
    """The rewards ``--rewards`` and ``--reward-arg`` name, each checked (an unknown reward or option: one line)."""
    from turngym.rewards.base import apply_reward_args

    labels, depth, cur = [], 0, ""
    for ch in args.rewards:  # split on commas outside name[...]
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            labels.append(cur)
            cur = ""
        else:
            cur += ch
    labels = [x.strip() for x in [*labels, cur] if x.strip()]
    return attempt(lambda: apply_reward_args(labels, args.reward_arg), ValueError)


def add_model_args(sp: argparse.ArgumentParser, temperature: float = 0.7) -> None:
    sp.add_argument("--model", default="default", help="'default' (Gemma 3 270M), a directory, a .gguf file, or a hub id")
    sp.add_argument("--base-url", default=None, help="OpenAI-compatible server URL (then --model is its model name)")
    sp.add_argument("--server", default="auto", choices=SERVERS,
                    help="with --base-url: vllm (sends vLLM-only fields, gets token ids), openai (the common API "
                         "only), or auto (asks the server's /models)")
    sp.add_argument("--prompt-format", default="chat", choices=PROMPT_FORMATS,
                    help="with --base-url: chat (/chat/completions with messages) or text (/completions with the "
                         "plain prompt, for base models)")
    sp.add_argument("--max-new-tokens", type=int, default=256, help="tokens per turn")
    sp.add_argument("--temperature", type=float, default=temperature, help="sampling temperature (0: greedy)")
    sp.add_argument("--seed", type=int, default=0, help="base seed of every episode's env and sampling")


def add_batching(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--batching", choices=BATCHING, default="static",
                    help="continuous (local models): a slot is refilled as soon as its turn ends")


def add_ray_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                    help="step the envs on a pool of Ray actors (the [ray] extra): auto joins the running cluster or "
                         "starts a local one; HOST:PORT or ray://HOST:PORT joins that cluster. Generation stays here")
    sp.add_argument("--env-workers", type=int, default=2, help="with --ray: env actors (one CPU each)")
    sp.add_argument("--envs-per-worker", type=int, default=None,
                    help="with --ray: live envs per actor (default: enough for --concurrency)")
    sp.add_argument("--ray-restarts", type=int, default=None, metavar="N",
                    help="with --ray: env actors the run may lose (died, frozen) before it stops with one line "
                         "(default: 2 per worker, at least 8)")
    sp.add_argument("--step-budget-s", type=float, default=None, metavar="S",
                    help="with --ray: the longest one env step may take; an actor silent past it (plus 10 s) is "
                         "killed and its episodes replayed (default: the env's own, docs/scale.md)")


def ray_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The run spec's Ray pool fields from the command line (the parser's dests are the fields' names)."""
    from turngym.run.pipeline import RAY_POOL_FIELDS

    return {name: getattr(args, name) for name in RAY_POOL_FIELDS}


def log_trackers(args: argparse.Namespace, out: Any) -> None:
    """After a command wrote its results folder: log it to TensorBoard / W&B when its flags ask."""
    from turngym.views.trackers import TrackerError, log_from_args

    try:
        log_from_args(args, out)
    except (TrackerError, ImportError, OSError) as exc:
        fail(f"results written to {out}, but logging them to the trackers failed: {exc}")
