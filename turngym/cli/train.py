"""``turngym train``: GRPO with per-turn advantages (TRL), from a YAML and overrides."""

from __future__ import annotations

import argparse
from typing import Any

from turngym.cli._common import HelpFormatter, attempt

COMMANDS = ("train",)

OVERRIDES_HELP = """\
overrides of the YAML, applied in this order after it is read:
  SECTION.KEY=VALUE       any part of the config; VALUE is read as JSON, else kept as a string
                            reward.name=siop  estimator.gamma=0.9  env.kwargs.max_turns=3
                            trl.learning_rate=1e-6  model.name_or_path=DIR  max_episode_tokens=512
  --GRPOCONFIG_FIELD VALUE  TRL's own flags for trl: (parsed by TRL's HfArgumentParser over GRPOConfig)
                            --learning_rate 1e-6  --max_steps 50  --bf16 true  --report_to none
an unknown section, GRPOConfig field or flag is refused before anything is built."""


class _TrainHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the overrides' examples kept as written."""


def add_parser(sub: Any) -> None:
    tr = sub.add_parser("train", help="GRPO with per-turn advantages (TRL); launch with accelerate for many GPUs",
                        usage="turngym train --config YAML [options] [SECTION.KEY=VALUE ...] [--GRPOCONFIG_FIELD VALUE ...]",
                        formatter_class=_TrainHelpFormatter, epilog=OVERRIDES_HELP)
    tr.add_argument("--config", required=True, help="YAML: env, data, reward, estimator, model, peft, trl")
    tr.add_argument("--resume", default=None, help="a checkpoint directory, or 'true' for the latest in output_dir")
    tr.add_argument("--allow-eval-overlap", action="store_true",
                    help="train even on items whose question is in an evaluation set (same as data.eval_overlap: allow)")
    tr.set_defaults(run=run, overrides=[])


def run(args: argparse.Namespace) -> int:
    import os

    from turngym.progress import StageClock

    clock = StageClock(main_only=True)  # under accelerate launch: once, not once per process
    clock.stage(f"reading {args.config}…")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from turngym.training.config import TrainConfig, build_trainer
    from turngym.training.overrides import apply_overrides, parse_overrides

    def build():
        cfg = TrainConfig.load(args.config)
        apply_overrides(cfg, parse_overrides(args.overrides))
        if args.allow_eval_overlap:
            cfg.data["eval_overlap"] = "allow"
        return build_trainer(cfg, progress=clock.stage)

    from turngym.corpora.lucene import RetrieverError
    from turngym.sandbox.base import SandboxError

    # an env that cannot serve (a retriever, a remote sandbox) is one line, before the model loads
    trainer = attempt(build, FileNotFoundError, ValueError, RetrieverError, SandboxError)
    from turngym.training.progress import StepLines

    lines = StepLines(clock, trainer)
    trainer.add_callback(lines)
    trainer.rollout_watch = lines  # each step's rollouts report their turns and episodes as they end
    shown = "a line per step" if trainer.args.disable_tqdm else "TRL's bar follows"
    clock.stage(f"training ({shown}); each step plays its episodes before it updates the model…")
    trainer.train(resume_from_checkpoint=args.resume)
    clock.stage("saving the model…")
    trainer.save_model()
    if not clock.quiet:
        print(f"model saved to {trainer.args.output_dir}")
    return 0
