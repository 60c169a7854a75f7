"""``turngym train`` says what it is doing from the first second: a line per stage before TRL's bar (config,
env and data, model, reward, trainer), and where TRL shows no bar, a line per optimizer step with its
outcome reward, the elapsed time and an ETA. Also the count line every counted stage shares."""

from __future__ import annotations

import os
import re
import time

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from turngym.agents.tiny import tiny_model_dir  # noqa: E402
from turngym.cli import main  # noqa: E402
from turngym.progress import StageClock, count_text, span  # noqa: E402

STAMP = re.compile(r"^\[\s*(\d+\.\d) s\] (.*)$")


def said(err: str) -> list[tuple[float, str]]:
    return [(float(m.group(1)), m.group(2)) for m in map(STAMP.match, err.splitlines()) if m]


def test_count_line_eta_is_the_rate_of_the_units_counted_now():
    assert count_text("step", 3, 10, 30.0, 3) == "step 3/10, ETA 1 min 10 s"
    # resumed at step 50: 3 steps in 30 s, 7 left
    assert count_text("step", 53, 60, 30.0, 3, "outcome reward 0.500") == "step 53/60, outcome reward 0.500, ETA 1 min 10 s"
    assert count_text("step", 10, 10, 99.0, 10) == "step 10/10"          # done: no ETA
    assert count_text("replies", 0, 8, 5.0, 0) == "replies 0/8"          # no rate yet: no ETA
    assert [span(s) for s in (4.4, 59.6, 61, 3600 * 2 + 7 * 60 + 20)] == ["4 s", "1 min 00 s", "1 min 01 s", "2 h 07 min"]


def test_an_llm_count_starts_under_the_current_stage_and_each_chunk_prints_a_line(capsys):
    clock = StageClock()
    clock.stage("distilling 6 rubrics…")
    for done in (0, 2, 4, 6):
        clock.count(done, 6)
    clock.stage("judging…")
    clock.count(0, 3)
    clock.count(3, 3)
    lines = [text for _, text in said(capsys.readouterr().err)]
    assert lines[0] == "distilling 6 rubrics…"
    assert lines[1].startswith("distilling 6 rubrics: replies 2/6, ETA ")
    assert lines[2].startswith("distilling 6 rubrics: replies 4/6, ETA ")
    assert lines[3] == "distilling 6 rubrics: replies 6/6"
    assert lines[4:] == ["judging…", "judging: replies 3/3"]


class FakeTrainerForTest:
    """A fake trainer inside this test: only the latest batch's outcome the callback reads."""

    last_outcome: float | None = None


@pytest.mark.parametrize("resume_at", [0, 2])
def test_step_lines_count_each_step_with_its_reward_and_an_eta_when_trls_bar_is_off(tmp_path, capsys, resume_at):
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig

    from turngym.training.progress import StepLines

    args = GRPOConfig(output_dir=str(tmp_path), disable_tqdm=True, use_cpu=True, report_to="none")
    state, control, trainer = TrainerState(max_steps=5, global_step=resume_at), TrainerControl(), FakeTrainerForTest()
    cb = StepLines(StageClock(), trainer)
    cb.on_train_begin(args, state, control)
    for step in range(resume_at + 1, 6):
        time.sleep(0.01)
        state.global_step, trainer.last_outcome = step, step / 10
        cb.on_step_end(args, state, control)
    lines = [text for _, text in said(capsys.readouterr().err)]
    assert lines[0] == f"training: steps {resume_at + 1}-5"
    steps = lines[1:]
    assert [re.match(r"step (\d)/5", s).group(1) for s in steps] == [str(s) for s in range(resume_at + 1, 6)]
    assert all(f"outcome reward {int(s[5]) / 10:.3f}" in s for s in steps)
    assert all(", ETA " in s for s in steps[:-1]) and "ETA" not in steps[-1]


def test_step_lines_stay_quiet_under_trls_bar(tmp_path, capsys):
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig

    from turngym.training.progress import StepLines

    args = GRPOConfig(output_dir=str(tmp_path), disable_tqdm=False, use_cpu=True, report_to="none")
    state = TrainerState(max_steps=2, global_step=0)
    cb = StepLines(StageClock(), FakeTrainerForTest())
    cb.on_train_begin(args, state, TrainerControl())
    state.global_step = 1
    cb.on_step_end(args, state, TrainerControl())
    assert said(capsys.readouterr().err) == []


def test_train_says_its_first_stage_before_it_builds_anything(tmp_path, capsys, monkeypatch):
    import turngym.training.config as config

    seen: list[str] = []

    def refuse_after_looking(cfg, progress):  # stands in for the heavy build: what was said before it ran?
        seen.extend(text for _, text in said(capsys.readouterr().err))
        raise ValueError("stop here")

    monkeypatch.setattr(config, "build_trainer", refuse_after_looking)
    path = tmp_path / "run.yaml"
    path.write_text("env: {id: turngym/Calculator-v0}\ntrl: {output_dir: out}\n")
    with pytest.raises(SystemExit, match="stop here"):
        main(["train", "--config", str(path)])
    assert seen == [f"reading {path}…"]


def test_build_trainer_names_each_stage_before_it_runs(tmp_path):
    from turngym.training.config import TrainConfig, build_trainer

    stages: list[str] = []
    model = str(tiny_model_dir(chat=True))
    cfg = TrainConfig(env={"id": "turngym/Calculator-v0"}, data={"indices": [0, 4]}, model={"name_or_path": model},
                      trl={"output_dir": str(tmp_path / "o"), "per_device_train_batch_size": 4, "num_generations": 4,
                           "max_completion_length": 8, "max_steps": 1, "report_to": "none", "use_cpu": True})
    trainer = build_trainer(cfg, progress=stages.append)
    assert stages == ["importing TRL and transformers…",
                      "loading turngym/Calculator-v0 and its dataset; selecting the training items…",
                      f"loading the model from {model}…", "building the reward 'outcome'…",
                      "building the trainer (4 training items)…"]
    assert trainer.last_outcome is None


def test_step_lines_stay_quiet_on_a_process_other_than_the_first(tmp_path, capsys):
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig

    from turngym.training.progress import StepLines

    args = GRPOConfig(output_dir=str(tmp_path), disable_tqdm=True, use_cpu=True, report_to="none")
    state = TrainerState(max_steps=2, global_step=0)
    state.is_world_process_zero = False
    trainer = FakeTrainerForTest()
    cb = StepLines(StageClock(), trainer)
    cb.on_train_begin(args, state, TrainerControl())
    state.global_step, trainer.last_outcome = 1, 0.5
    cb.on_step_end(args, state, TrainerControl())
    assert said(capsys.readouterr().err) == []


@pytest.mark.parametrize("rank", [None, "0", "1", "3"])
def test_a_main_only_clock_speaks_only_on_rank_zero(capsys, monkeypatch, rank):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    clock = StageClock(main_only=True)
    clock.stage("loading…")
    clock.tally("step", 2).update(1)
    lines = [text for _, text in said(capsys.readouterr().err)]
    assert lines == ([] if rank in ("1", "3") else ["loading…", lines[-1]])
    StageClock().stage("every process")  # a clock without main_only speaks on any rank
    assert [text for _, text in said(capsys.readouterr().err)] == ["every process"]


def test_train_says_nothing_on_a_process_other_than_the_first(tmp_path, capsys, monkeypatch):
    """Under ``accelerate launch`` (``RANK`` set per process) the stage lines come from rank 0 only; an error
    still ends every process with its one line."""
    import turngym.training.config as config

    seen: list[str] = []

    def refuse_after_looking(cfg, progress):
        progress("importing TRL and transformers…")  # build_trainer's own stage lines go through the same clock
        seen.extend(capsys.readouterr().err.splitlines())
        raise ValueError("stop here")

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(config, "build_trainer", refuse_after_looking)
    path = tmp_path / "run.yaml"
    path.write_text("env: {id: turngym/Calculator-v0}\ntrl: {output_dir: out}\n")
    with pytest.raises(SystemExit, match="stop here"):
        main(["train", "--config", str(path)])
    assert seen == []


class EpisodeForTest:
    """A fake episode inside this test: the watch reads only how many turns it has."""

    def __init__(self, turns: int) -> None:
        self.turns = [None] * turns


def play_one_step(cb) -> None:
    """What the trainer tells its watch while a step's 2 episodes play 2 turns each."""
    cb.rollouts_begin(1, 2)
    for ep in range(2):
        cb.rollout_turn(EpisodeForTest(0))  # the prompt, before any turn: not counted
        cb.rollout_turn(EpisodeForTest(1))
        cb.rollout_turn(EpisodeForTest(2))
        cb.rollout_episodes(ep + 1, 2)


@pytest.mark.parametrize("every_s", [0.0, 3600.0])
def test_a_steps_rollouts_print_their_episodes_and_turns_as_they_end_when_the_bar_is_off(tmp_path, capsys, every_s):
    from transformers import TrainerControl, TrainerState
    from trl import GRPOConfig

    from turngym.training.progress import StepLines

    args = GRPOConfig(output_dir=str(tmp_path), disable_tqdm=True, use_cpu=True, report_to="none")
    cb = StepLines(StageClock(), FakeTrainerForTest(), every_s=every_s)
    cb.on_train_begin(args, TrainerState(max_steps=3, global_step=0), TrainerControl())
    play_one_step(cb)
    lines = [text for _, text in said(capsys.readouterr().err)][1:]
    per_turn = ["step 1/3: rollouts 0/2 episodes, 1 turns", "step 1/3: rollouts 0/2 episodes, 2 turns",
                "step 1/3: rollouts 1/2 episodes, 2 turns", "step 1/3: rollouts 1/2 episodes, 3 turns",
                "step 1/3: rollouts 1/2 episodes, 4 turns", "step 1/3: rollouts 2/2 episodes, 4 turns"]
    # every turn when due (every_s=0); otherwise the start and each finished episode only
    expected = per_turn if every_s == 0 else [per_turn[2], per_turn[5]]
    assert lines == ["step 1/3: rollouts 0/2 episodes, 0 turns", *expected]


def test_a_steps_rollouts_move_trls_bar_while_they_play(tmp_path, capsys):
    """With TRL's bar on, the rollouts print no lines; they set the bar's postfix (which redraws its elapsed time)."""
    from transformers import ProgressCallback, TrainerControl, TrainerState
    from trl import GRPOConfig

    from turngym.training.progress import StepLines

    class TrainerWithBarForTest(FakeTrainerForTest):
        """A fake trainer inside this test, holding TRL's real progress callback."""

        def __init__(self) -> None:
            self.callback_handler = type("Handler", (), {"callbacks": [ProgressCallback()]})()

    args = GRPOConfig(output_dir=str(tmp_path), disable_tqdm=False, use_cpu=True, report_to="none")
    state, control, trainer = TrainerState(max_steps=3, global_step=0), TrainerControl(), TrainerWithBarForTest()
    trls = trainer.callback_handler.callbacks[0]
    trls.on_train_begin(args, state, control)  # TRL makes its bar first, as in a Trainer's callback order
    cb = StepLines(StageClock(), trainer)
    cb.on_train_begin(args, state, control)
    play_one_step(cb)
    assert trls.training_bar.postfix == "rollouts 2/2 ep, 4 turns"
    err = capsys.readouterr().err
    assert said(err) == [] and "rollouts 1/2 ep, 3 turns" in err
    trls.training_bar.close()
