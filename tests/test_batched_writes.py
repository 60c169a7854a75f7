"""Finished episodes are written in batches yet never lost: flushed on exit, on error and on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from turngym.agents.policy import Generation, PolicyBase
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv
from turngym.episode.reader import read_episodes

SLOW_RUN = r"""
import sys, time
from turngym.agents.policy import Generation, PolicyBase
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv

class FakeSlowPolicy(PolicyBase):  # a fake (test only): answers every turn after a pause
    name, tokenizer = "fake-slow", None
    def generate(self, requests, sampling):
        time.sleep(0.05)
        return [Generation(text="<answer>1</answer>") for _ in requests]

def finished(done, total):
    print("DONE", done, flush=True)

RolloutRunner(FakeSlowPolicy(), CalculatorEnv, concurrency=2, write_batch=1000, flush_s=1000.0).run(
    range(400), sys.argv[1], progress=finished)
"""


class FakePolicy(PolicyBase):
    """A fake (test only): answers every turn at once; raises on a chosen call."""

    name, tokenizer = "fake", None

    def __init__(self, fail_at=None):
        self.calls, self.fail_at = 0, fail_at

    def generate(self, requests, sampling):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("backend fell over")
        return [Generation(text="<answer>1</answer>") for _ in requests]


def test_a_sigterm_flushes_every_finished_episode_and_exits_as_terminated(tmp_path):
    out = tmp_path / "e.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, str(out)], stdout=subprocess.PIPE, text=True)
    done = 0
    while done < 10:
        line = proc.stdout.readline()
        assert line, "the run ended early"
        done = int(line.split()[1])
    assert not out.exists() or out.stat().st_size == 0  # nothing flushed yet: batch of 1000, 1000 s
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    reported = max([done] + [int(x.split()[1]) for x in rest.splitlines() if x.startswith("DONE")])
    report = read_episodes(out, strict=True)
    assert len(report.episodes) == reported == len({e.id for e in report.episodes}) and reported < 400


def test_episodes_finished_before_an_error_are_written(tmp_path):
    out = tmp_path / "e.jsonl"
    runner = RolloutRunner(FakePolicy(fail_at=6), CalculatorEnv, concurrency=1, write_batch=1000, flush_s=1000.0)
    with pytest.raises(RuntimeError, match="fell over"):
        runner.run(range(10), out)
    assert [e.task["index"] for e in read_episodes(out, strict=True).episodes] == [0, 1, 2, 3, 4]
    again = RolloutRunner(FakePolicy(), CalculatorEnv, concurrency=1).run(range(10), out)
    assert len(again) == 5 and len(read_episodes(out).episodes) == 10  # resumed: nothing twice


def test_batches_reach_the_file_while_the_run_goes_on(tmp_path):
    out = tmp_path / "e.jsonl"
    seen = []

    def progress(done, total):
        seen.append(len(out.read_bytes().splitlines()) if out.exists() else 0)

    RolloutRunner(FakePolicy(), CalculatorEnv, concurrency=4, write_batch=8, flush_s=1000.0).run(range(40), out, progress)
    assert seen[7] == 8 and seen[8] == 8 and seen[15] == 16  # flushed every 8 episodes, not per episode
    assert len(read_episodes(out, strict=True).episodes) == 40


SLOW_RUN_UNDER_A_HANDLER = SLOW_RUN.replace("RolloutRunner(FakeSlowPolicy()", """import signal
def handler(signum, frame):  # a handler someone installed before the run (Ray's driver installs one)
    print("HANDLER", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, handler)
RolloutRunner(FakeSlowPolicy()""")


def test_a_sigterm_under_someone_elses_handler_flushes_first_then_runs_it(tmp_path):
    out = tmp_path / "e.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN_UNDER_A_HANDLER, str(out)], stdout=subprocess.PIPE, text=True)
    done = 0
    while done < 10:
        line = proc.stdout.readline()
        assert line, "the run ended early"
        done = int(line.split()[1])
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 7 and "HANDLER" in rest
    reported = max([done] + [int(x.split()[1]) for x in rest.splitlines() if x.startswith("DONE")])
    assert len(read_episodes(out, strict=True).episodes) == reported
