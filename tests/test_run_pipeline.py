"""The run pipeline behind play / rollout / eval: every registered env through every run command, bad
combinations refused before the model loads with one message and no file, progress from the first
turn, and sharded evals that merge into the unsharded run."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from turngym.agents.policy import PolicyBase
from turngym.cli import main
from turngym.envs import ENTRY_POINTS
from turngym.episode.reader import read_episodes
from turngym.run.lock import without_identity

COMMANDS = ("play", "rollout", "eval")


class FakeTextPolicy(PolicyBase):
    """A fake policy (test only, text backend, no tokenizer): answers every request from its last message.

    For a calculator question it computes the answer for every other item (so runs have both outcomes);
    anything else gets ``<answer>1</answer>``. ``delay`` seconds per generate call make it a slow fake.
    """

    name = "fake-text"
    tokenizer = None
    max_context = None

    def __init__(self, delay: float = 0.0, events: list | None = None):
        self.delay, self.events, self.calls = delay, events, 0

    def generate(self, requests, sampling):
        from turngym.agents.policy import Generation

        self.calls += 1
        if self.events is not None:
            self.events.append(("generate", self.calls))
        time.sleep(self.delay)
        out = []
        for req in requests:
            last = (req.messages or [{"content": req.prompt_text or ""}])[-1]["content"]
            m = re.search(r"What is (\d+) \* (\d+) \+ (\d+)\?", last)
            if m and int(m.group(1)) % 2:
                a, b, c = map(int, m.groups())
                out.append(Generation(text=f"<answer>{a * b + c}</answer>"))
            else:
                out.append(Generation(text="<answer>1</answer>"))
        return out


@pytest.fixture
def fake_loader(monkeypatch):
    """Route every model load to a fake text policy; ``loads`` counts the loads."""
    state = {"loads": 0, "policy": FakeTextPolicy()}

    def load(model, base_url=None, **kwargs):
        state["loads"] += 1
        return state["policy"]

    import turngym.agents.loading

    monkeypatch.setattr(turngym.agents.loading, "load_policy", load)
    return state


def env_args(env: str) -> list[str]:
    name = env.split("/")[1]
    if name.startswith(("DelayedEffect", "Recovery", "VariableHorizon")):
        return ["--env", name]  # an MDP's horizon is its turn limit
    extra = ["--dataset", "simple_python"] if name.startswith("BFCL") else []
    return ["--env", name, "--max-turns", "2", *extra]


def command_args(command: str, out: Path) -> list[str]:
    if command == "play":
        return ["play", "--out", str(out / "play.jsonl")]
    if command == "rollout":
        return ["rollout", "--limit", "1", "--k", "2", "--out", str(out / "ro.jsonl")]
    return ["eval", "--limit", "1", "--k", "2", "--out", str(out / "ev")]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("env", sorted(ENTRY_POINTS))
def test_every_registered_env_runs_through_every_run_command(tmp_path, capsys, fake_loader, env, command):
    assert main([*command_args(command, tmp_path), *env_args(env), "--model", "fake", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    if command == "play":
        assert "=== " in out and len(read_episodes(tmp_path / "play.jsonl").episodes) == 1
    elif command == "rollout":
        assert "2 new episodes; 2 in" in out and json.loads((tmp_path / "ro.jsonl.run.json").read_text())["env"] == env
    else:
        results = json.loads((tmp_path / "ev" / "results.json").read_text())
        assert results["env"] == env and results["episodes"] == 2
    assert fake_loader["loads"] == 1


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("bad, words", [
    (["--env", "Digits-v0", "--env-arg", "prompt_style=base"], "turngym/Digits-v0 takes no prompt_style"),
    (["--env", "BFCL-v0", "--env-arg", "prompt_style=chat"], "turngym/BFCL-v0 takes no prompt_style"),
    (["--env", "Calculator-v0", "--env-arg", "prompt_style=fancy"], "takes prompt_style chat or base"),
    (["--env", "Nope-v0"], "unknown env 'turngym/Nope-v0'; turngym envs: turngym/BFCL-v0"),
    (["--env", "Calculator-v0", "--env-arg", "max_turns"], "--env-arg takes key=value"),
    (["--env", "Calculator-v0", "--env-arg", "colour=red"], "bad arguments for turngym/Calculator-v0"),
    (["--env", "Calculator-v0", "--max-turns", "0"], "--max-turns must be >= 1"),
])
def test_bad_combinations_fail_before_the_model_loads_with_one_line_and_no_file(tmp_path, capsys, fake_loader,
                                                                               command, bad, words):
    with pytest.raises(SystemExit) as exit_:
        main([*command_args(command, tmp_path), *bad, "--model", "fake"])
    message = str(exit_.value.code)
    assert message.startswith("error: ") and words in message and "\n" not in message
    assert fake_loader["loads"] == 0
    assert list(tmp_path.iterdir()) == []  # no run.json, no lock, no folder


def test_the_bug_that_was_rollout_on_envs_without_prompt_styles(tmp_path, capsys, fake_loader):
    """``rollout --env BFCL-v0`` / ``Digits-v0`` passed prompt_style to envs that take none (after the model loaded)."""
    for env in ("Digits-v0", "BFCL-v0"):
        out = tmp_path / f"{env}.jsonl"
        assert main(["rollout", "--env", env, "--dataset" if env == "BFCL-v0" else "--max-turns",
                     "simple_python" if env == "BFCL-v0" else "2", "--limit", "1", "--model", "fake",
                     "--out", str(out)]) == 0
        assert len(read_episodes(out).episodes) == 1


def written_before(events: list, call: int) -> list[str]:
    """The text written before the fake model's ``call``-th generate call."""
    end = events.index(("generate", call))
    return [e[2] for e in events[:end] if e[0] == "out"]


class TimedStream:
    """Records every write with its time and appends it to a shared event list (test only)."""

    def __init__(self, events: list):
        self.events = events

    def write(self, text: str) -> int:
        if text.strip():
            self.events.append(("out", time.perf_counter(), text))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_eval_progress_starts_at_the_first_turn_with_the_run_elapsed_time(tmp_path, monkeypatch, fake_loader):
    events: list = []
    fake_loader["policy"] = FakeTextPolicy(delay=0.6, events=events)  # a slow fake model: 0.6 s per generate call
    monkeypatch.setattr(sys, "stderr", TimedStream(events))
    monkeypatch.setattr(sys, "stdout", TimedStream(events))
    start = time.perf_counter()
    assert main(["eval", "--env", "Calculator-v0", "--env-arg", "max_turns=3", "--limit", "2", "--k", "1",
                 "--concurrency", "1", "--model", "fake", "--out", str(tmp_path / "ev")]) == 0
    writes = [e for e in events if e[0] == "out"]
    before = "".join(written_before(events, 1))
    assert "checking turngym/Calculator-v0" in before and "loading model" in before  # lines before any model work
    bar_lines = [w[2] for w in writes if "episodes:" in w[2]]
    assert bar_lines and "0/2" in bar_lines[0]  # the bar is up before the first episode ends
    # the bar's elapsed time is the run's: the last line shows at least the 2 x 0.6 s the fake model slept
    elapsed = re.findall(r"\[(\d\d):(\d\d)<", bar_lines[-1])
    assert elapsed and int(elapsed[-1][0]) * 60 + int(elapsed[-1][1]) >= 1
    assert writes[0][1] - start < writes[-1][1] - start


def test_play_streams_each_turn_before_the_next_is_generated(tmp_path, monkeypatch, fake_loader):
    events: list = []

    class TwoTurnFake(FakeTextPolicy):
        """A slow fake (test only) that first calls the calculator, then answers."""

        def generate(self, requests, sampling):
            from turngym.agents.policy import Generation

            super().generate(requests, sampling)
            return [Generation(text="<calc>1+1</calc>" if self.calls == 1 else "<answer>2</answer>")]

    fake_loader["policy"] = TwoTurnFake(delay=0.2, events=events)
    monkeypatch.setattr(sys, "stdout", TimedStream(events))
    monkeypatch.setattr(sys, "stderr", TimedStream(events))
    assert main(["play", "--env", "Calculator-v0", "--max-turns", "3", "--model", "fake"]) == 0
    assert "--- turn 0 [agent]" in "".join(written_before(events, 2))  # turn 0 printed before turn 1 is generated
    assert "What is" in "".join(written_before(events, 1))  # the prompt before the first call


def comparable(results: dict) -> dict:
    return {k: v for k, v in results.items() if k not in ("wall_s_this_run", "shard", "merged_from", "behaviour")}


def episode_record(ep) -> tuple:
    """An episode's content and its ids within its run (every run prefixes its own id: ``run|group#k``)."""
    run = ep.meta["run"]["id"]
    assert ep.id.startswith(f"{run}|") and ep.group.startswith(f"{run}|")
    return (ep.id.removeprefix(f"{run}|"), ep.group.removeprefix(f"{run}|"),
            [(t.action, t.observation, t.metrics.get("correct")) for t in ep.turns], ep.outcome, ep.final_answer,
            ep.meta["run"]["settings"])


@pytest.mark.parametrize("env", ["turngym/Calculator-v0", "turngym/BFCL-v0"])  # subsets recorded as indices / item ids
def test_sharded_eval_merged_equals_the_unsharded_run(tmp_path, capsys, fake_loader, env):
    base = ["eval", *env_args(env), "--limit", "7", "--k", "2", "--model", "fake"]
    assert main([*base, "--out", str(tmp_path / "all")]) == 0
    shards = [tmp_path / f"s{i}" for i in (1, 2, 3)]
    threads = [threading.Thread(target=main, args=([*base, "--shard", f"{i}/3", "--out", str(d)],))
               for i, d in zip((1, 2, 3), shards, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sizes = [json.loads((d / "results.json").read_text())["episodes"] for d in shards]
    assert sizes == [6, 4, 4]  # items 0,3,6 / 1,4 / 2,5, two samples each
    assert main(["eval", "--merge", *map(str, shards), "--out", str(tmp_path / "merged")]) == 0
    whole = json.loads((tmp_path / "all" / "results.json").read_text())
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    if env.endswith("Calculator-v0"):  # both outcomes occur, so the comparison means something
        assert 0 < whole["metrics"]["accuracy"]["value"] < 1
    assert merged["episodes"] == whole["episodes"] == 14 and comparable(merged) == comparable(whole)
    assert merged["behaviour"]["turns_per_episode"] == whole["behaviour"]["turns_per_episode"]
    assert sorted(map(episode_record, read_episodes(tmp_path / "merged" / "episodes.jsonl").episodes)) \
        == sorted(map(episode_record, read_episodes(tmp_path / "all" / "episodes.jsonl").episodes))
    merged_run, whole_run = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("merged", "all"))
    assert without_identity(merged_run) == without_identity(whole_run)
    # the merged folder is one run holding its shards' runs, and finished: a run into it is refused, nothing added
    shard_runs = sorted(json.loads((d / "run.json").read_text())["run_id"] for d in shards)
    assert merged_run["merged_runs"] == shard_runs and len(set(shard_runs)) == 3 and merged_run["run_id"] not in shard_runs
    with pytest.raises(SystemExit, match="holds a merge of 3 shard runs"):
        main([*base, "--out", str(tmp_path / "merged")])
    assert len(read_episodes(tmp_path / "merged" / "episodes.jsonl").episodes) == 14


def test_merge_refuses_shards_of_other_settings_or_missing_shards(tmp_path, capsys, fake_loader):
    base = ["eval", "--env", "Calculator-v0", "--max-turns", "2", "--limit", "4", "--model", "fake"]
    assert main([*base, "--shard", "1/2", "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--shard", "2/2", "--seed", "1", "--out", str(tmp_path / "b")]) == 0
    with pytest.raises(SystemExit, match="other settings .*sampling.seed: 0 → 1"):
        main(["eval", "--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")])
    assert main([*base, "--shard", "1/3", "--out", str(tmp_path / "c")]) == 0
    with pytest.raises(SystemExit, match="shards 1/N..N/N of one run"):
        main(["eval", "--merge", str(tmp_path / "a"), str(tmp_path / "c"), "--out", str(tmp_path / "m")])
    with pytest.raises(SystemExit, match="--shard takes I/N"):
        main([*base, "--shard", "3", "--out", str(tmp_path / "d")])


def test_cli_prints_intervals_as_report_md_does(tmp_path, capsys, fake_loader):
    assert main(["eval", "--env", "Calculator-v0", "--max-turns", "2", "--limit", "1", "--model", "fake",
                 "--out", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and re.search(r"accuracy: \d\.\d{3} (\[\d\.\d{3}, \d\.\d{3}\]|\(.+\)) \(n=1\)", out)


def test_help_imports_only_parsers_and_import_turngym_still_registers_the_envs():
    import subprocess

    heavy = ("numpy", "gymnasium", "httpx", "torch", "transformers", "tqdm")
    probe = ("import sys, turngym.cli\ntry:\n    turngym.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]") and "eval" in out
    for order in ("import turngym; import gymnasium", "import gymnasium; import turngym",
                  "import turngym.envs.base; import gymnasium"):
        code = f"{order}; gymnasium.make('turngym/Calculator-v0'); print('ok')"
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "ok\n"


@pytest.mark.parametrize("env", sorted(ENTRY_POINTS))
def test_each_env_declares_the_prompt_styles_its_constructor_takes(env):
    import inspect

    from turngym.run.pipeline import env_class

    cls = env_class(env)
    takes = "prompt_style" in inspect.signature(cls.__init__).parameters
    assert takes == bool(cls.prompt_styles), f"{env}: prompt_styles {cls.prompt_styles} but prompt_style argument {takes}"
    if takes:
        assert inspect.signature(cls.__init__).parameters["prompt_style"].default in cls.prompt_styles


def test_every_option_with_a_default_shows_it_in_help():
    import argparse

    from turngym.cli import build_parser

    missing = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, [*path, name])
            elif a.option_strings and a.default not in (None, False, argparse.SUPPRESS, []) and a.dest != "help":
                shown = parser.formatter_class("x")._get_help_string(a) or ""
                if not a.help or "%(default)" not in shown:
                    missing.append(f"{' '.join(path)} {a.option_strings[0]}")

    walk(build_parser(), [])
    assert missing == []
