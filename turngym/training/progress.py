"""``turngym train``'s progress inside training. Each step first plays its episodes, which on a CPU can take
minutes, so the rollouts report as they go: a finished turn refreshes TRL's bar (``rollouts 3/8 ep, 12 turns``
as its postfix), or, where the bar is off (``disable_tqdm``), a finished episode prints a line, and so does a
finished turn at most every ``every_s`` seconds. Where the bar is off, each optimizer step also prints its
count, the latest batch's mean outcome, the elapsed time and an ETA, in the same line format as every other
command (:mod:`turngym.progress`); with the bar on, TRL's bar says that. With several processes, only the
first reports."""

from __future__ import annotations

import time
from typing import Any

from transformers import ProgressCallback, TrainerCallback

from turngym.progress import StageClock, Tally


class StepLines(TrainerCallback):
    """A TRL callback: one progress line per optimizer step when TRL shows no bar, and the trainer's rollout
    watch (``TurnGRPOTrainer.rollout_watch``: :meth:`rollouts_begin`, :meth:`rollout_turn`,
    :meth:`rollout_episodes`). ``trainer`` is read for ``last_outcome`` (the latest training batch's mean
    outcome) and its ``callback_handler`` (TRL's bar)."""

    def __init__(self, clock: StageClock, trainer: Any, every_s: float = 10.0) -> None:
        self.clock = clock
        self.trainer = trainer
        self.every_s = every_s
        self.tally: Tally | None = None
        self.lines = False       # bar off, main process: print lines
        self.bar: Any = None     # TRL's training bar, when it shows on this process
        self.step, self.max_steps = 0, 0
        self.turns, self.done, self.total, self.said_at = 0, 0, 0, 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # counted from the step training starts at, so a resumed run's ETA is the rate of the steps done now
        self.tally = self.clock.tally("step", state.max_steps, state.global_step)
        self.max_steps = state.max_steps
        self.lines = bool(args.disable_tqdm) and state.is_world_process_zero
        if self.lines:
            self.clock.stage(f"training: steps {state.global_step + 1}-{state.max_steps}")
        elif state.is_world_process_zero:  # TRL's ProgressCallback made its bar in its own on_train_begin
            handler = getattr(self.trainer, "callback_handler", None)
            bars = [cb.training_bar for cb in getattr(handler, "callbacks", []) if isinstance(cb, ProgressCallback)]
            self.bar = next((b for b in bars if b is not None), None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.lines and self.tally is not None:
            outcome = self.trainer.last_outcome
            self.tally.update(state.global_step, "" if outcome is None else f"outcome reward {outcome:.3f}")

    # ------------------------------------------------------------------ the rollouts of a step

    def rollouts_begin(self, step: int, episodes: int) -> None:
        """A rollout call starts: ``episodes`` to play for optimizer step ``step`` (1-based)."""
        self.step, self.turns, self.done, self.total, self.said_at = step, 0, 0, episodes, time.perf_counter()
        self._show(True)

    def rollout_turn(self, episode: Any) -> None:
        """The runner's ``on_turn``: called when an episode starts (no turns yet) and after each of its turns."""
        if not episode.turns:
            return
        self.turns += 1
        self._show(time.perf_counter() - self.said_at >= self.every_s)

    def rollout_episodes(self, done: int, total: int) -> None:
        """The runner's ``progress``: ``done`` of ``total`` episodes of this call have ended."""
        self.done, self.total = done, total
        self._show(True)

    def _show(self, line_due: bool) -> None:
        episodes = f"{self.done}/{self.total}"
        if self.bar is not None:
            self.bar.set_postfix_str(f"rollouts {episodes} ep, {self.turns} turns")  # refreshes elapsed time
        elif self.lines and line_due:
            self.said_at = time.perf_counter()
            self.clock.stage(f"step {self.step}/{self.max_steps}: rollouts {episodes} episodes, {self.turns} turns",
                             keep_label=True)
