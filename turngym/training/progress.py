"""``turngym train``'s per-step line: where TRL's bar is off (``disable_tqdm``), each optimizer step prints its
count, the latest batch's mean outcome, the elapsed time and an ETA, in the same line format as every other
command (:mod:`turngym.progress`). With the bar on, TRL's bar says the same and this stays quiet; with
several processes, only the first prints."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from turngym.progress import StageClock, Tally


class StepLines(TrainerCallback):
    """A TRL callback: one progress line per optimizer step when TRL shows no bar. ``trainer`` is read for
    ``last_outcome`` (a :class:`~turngym.training.trainer.TurnGRPOTrainer`'s latest training batch)."""

    def __init__(self, clock: StageClock, trainer: Any) -> None:
        self.clock = clock
        self.trainer = trainer
        self.tally: Tally | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # counted from the step training starts at, so a resumed run's ETA is the rate of the steps done now
        self.tally = self.clock.tally("step", state.max_steps, state.global_step)
        if args.disable_tqdm and state.is_world_process_zero:
            self.clock.stage(f"training: steps {state.global_step + 1}-{state.max_steps}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.disable_tqdm and state.is_world_process_zero and self.tally is not None:
            outcome = self.trainer.last_outcome
            self.tally.update(state.global_step, "" if outcome is None else f"outcome reward {outcome:.3f}")
