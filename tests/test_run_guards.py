"""Runs: one writer per --out (a dead writer's lock is taken over), settings stored and checked on
rerun, missing indexes and bad argument values refused before any model loads or episode plays."""

import json
import signal
import subprocess
import sys
import time

import pytest

from turngym.agents.policy import PolicyBase
from turngym.agents.tiny import tiny_model_dir
from turngym.cli import main
from turngym.episode.reader import read_episodes
from turngym.evals.harness import EvalError, EvalSpec, run_eval
from turngym.run.lock import RunError, RunLock, differences, without_identity

SLOW_EVAL = """
import sys, time
from turngym.agents.loading import load_hf_policy
from turngym.evals.harness import EvalSpec, run_eval
pol = load_hf_policy(sys.argv[2], dtype="float32", device="cpu")
inner = pol.generate
def slow(reqs, s):
    time.sleep(0.2)
    return inner(reqs, s)
pol.generate = slow
run_eval(EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, limit=10, k=1, concurrency=2,
                  max_new_tokens=8), sys.argv[1], policy=pol)
"""
SPEC = dict(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, limit=10, k=1, concurrency=2, max_new_tokens=8)


class NoModel(PolicyBase):
    """A fake policy (test only) that fails the test if any episode is played."""

    name = "no-model"
    tokenizer = None

    def generate(self, requests, sampling):
        raise AssertionError("an episode was played")


def wait_for_lines(path, n, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_bytes().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {n} lines")


def test_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, tiny_chat_policy):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EVAL, str(out), str(tiny_model_dir(chat=True))])
    try:
        wait_for_lines(out / "episodes.jsonl", 2)
        with pytest.raises(EvalError, match=rf"being written by another run \(pid {proc.pid} "):
            run_eval(EvalSpec(**SPEC), out, policy=tiny_chat_policy)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = [e.id for e in read_episodes(out / "episodes.jsonl").episodes]
    results = run_eval(EvalSpec(**SPEC), out, policy=tiny_chat_policy)  # the killed writer's lock is taken over
    ids = [e.id for e in read_episodes(out / "episodes.jsonl").episodes]
    assert ids[: len(before)] == before and len(ids) == len(set(ids)) == 10 == results["episodes"]


def test_rerun_with_other_settings_refuses_naming_them_and_overwrite_moves_the_old_run_aside(tmp_path, tiny_chat_policy):
    out = tmp_path / "run"
    spec = dict(SPEC, limit=3)
    run_eval(EvalSpec(**spec), out, policy=tiny_chat_policy)
    written = (out / "episodes.jsonl").read_bytes()
    stored = json.loads((out / "run.json").read_text())
    assert stored["sampling"]["max_new_tokens"] == 8 and stored["env_kwargs"] == {"max_turns": 2}
    with pytest.raises(EvalError) as err:
        run_eval(EvalSpec(**dict(spec, max_new_tokens=6, env_kwargs={"max_turns": 3})), out, policy=NoModel())
    msg = str(err.value)
    assert "sampling.max_new_tokens: 8 → 6" in msg and "env_kwargs.max_turns: 2 → 3" in msg and "--overwrite" in msg
    assert (out / "episodes.jsonl").read_bytes() == written  # nothing touched
    # identical settings resume (nothing to play) and a larger subset extends the run
    assert run_eval(EvalSpec(**spec), out, policy=NoModel())["episodes"] == 3
    assert run_eval(EvalSpec(**dict(spec, limit=4)), out, policy=tiny_chat_policy)["episodes"] == 4
    # --overwrite: the old run is moved aside intact, the new one starts fresh
    res = run_eval(EvalSpec(**dict(spec, max_new_tokens=6)), out, policy=tiny_chat_policy, overwrite=True)
    [aside] = list(out.glob("replaced-*"))
    assert (aside / "episodes.jsonl").read_bytes().startswith(written) and (aside / "run.json").exists()
    assert res["episodes"] == 3 and json.loads((out / "run.json").read_text())["sampling"]["max_new_tokens"] == 6


def test_missing_index_or_server_fails_before_the_model_loads(tmp_path):
    for retriever, words in [("/nonexistent/index", "SearchQA-v0: retriever='/nonexistent/index': no index at"),
                             ("http://127.0.0.1:9", "SearchQA-v0: retrieval server http://127.0.0.1:9/retrieve is unreachable")]:
        spec = EvalSpec(env_id="turngym/SearchQA-v0", env_kwargs={"retriever": retriever}, limit=2,
                        model="/nonexistent/model")
        with pytest.raises(EvalError, match=words):
            run_eval(spec, tmp_path / "o", policy=None)  # policy=None: it would load --model, and fail differently
        assert not (tmp_path / "o" / "episodes.jsonl").exists() and not (tmp_path / "o" / "run.json").exists()


def run_cli(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    msg = str(exc.value.code)
    assert msg.startswith("error: ") and "\n" not in msg and "Traceback" not in capsys.readouterr().err
    return msg


@pytest.mark.parametrize("args,words", [
    (["--k", "0"], "--k must be >= 1, got 0"),
    (["--concurrency", "0"], "--concurrency must be >= 1, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--start", "-5"], "--start must be >= 0, got -5"),
    (["--max-turns", "0"], "--max-turns must be >= 1, got 0"),
    (["--limit", "0"], "--limit must be >= 1, got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--temperature", "nan"], "--temperature must be >= 0"),
    (["--start", "1000000"], "past the end of the dataset"),
    (["--env-arg", "retriever=/nonexistent", "--env", "SearchQA-v0"], "SearchQA-v0: retriever='/nonexistent': no index at"),
    (["--env", "MathCode-v0", "--dataset", "/nonexistent/data.jsonl"], "cannot make turngym/MathCode-v0"),
])
@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_bad_argument_values_get_one_line_before_any_model_loads(tmp_path, capsys, command, args, words):
    out = tmp_path / ("o" if command == "eval" else "o.jsonl")
    msg = run_cli(capsys, command, "--out", str(out), "--model", "/nonexistent/model", *args)
    assert words in msg
    assert not (tmp_path / "o" / "episodes.jsonl").exists() and not out.is_file()


def test_rollout_and_eval_store_their_settings_in_one_shape_and_an_older_rollout_file_still_resumes(tmp_path, capsys):
    from turngym.credit.mc_oracle import recorded_settings

    model = str(tiny_model_dir(chat=True))
    common = ["--model", model, "--limit", "1", "--max-new-tokens", "4", "--max-turns", "1", "--temperature", "0"]
    assert main(["rollout", "--out", str(tmp_path / "ro.jsonl"), *common]) == 0
    assert main(["eval", "--out", str(tmp_path / "ev"), *common]) == 0
    rollout = json.loads((tmp_path / "ro.jsonl.run.json").read_text())
    evaluated = json.loads((tmp_path / "ev" / "run.json").read_text())
    assert without_identity(rollout) == without_identity(evaluated) and rollout["run_id"] != evaluated["run_id"]
    assert rollout["env_kwargs"] == {"max_turns": 1}
    # the shape rollout stored before: dataset (None without --dataset) and max_turns beside env_kwargs
    old = {k: v for k, v in rollout.items() if k != "env_kwargs"} | {"env_kwargs": {}, "dataset": None, "max_turns": 1}
    (tmp_path / "ro.jsonl.run.json").write_text(json.dumps(old))
    written = (tmp_path / "ro.jsonl").read_bytes()
    assert recorded_settings(tmp_path / "ro.jsonl")[0]["env_kwargs"] == {"max_turns": 1}  # the MC oracle replays with it
    assert main(["rollout", "--out", str(tmp_path / "ro.jsonl"), *common]) == 0  # resumes: the same settings
    assert (tmp_path / "ro.jsonl").read_bytes() == written
    assert json.loads((tmp_path / "ro.jsonl.run.json").read_text()) == rollout  # stored again in today's shape
    capsys.readouterr()


def test_unwritable_output_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker / "run", "/proc/turngym-no-such-dir/run"):
        msg = run_cli(capsys, "eval", "--out", str(out), "--model", "/nonexistent/model", "--limit", "1")
        assert "cannot write to output folder" in msg


def test_rollout_lock_settings_and_resume(tmp_path, capsys):
    out = tmp_path / "ro.jsonl"
    model = str(tiny_model_dir(chat=True))
    base = ["rollout", "--out", str(out), "--model", model, "--limit", "2", "--max-new-tokens", "4", "--max-turns", "1"]
    assert main(base) == 0
    first = out.read_bytes()
    assert len(read_episodes(out).episodes) == 2 and json.loads(open(f"{out}.run.json").read())["env_kwargs"]["max_turns"] == 1
    assert main(base) == 0 and out.read_bytes() == first  # identical settings: resumes, nothing new to play
    msg = run_cli(capsys, *base[:-4], "--max-new-tokens", "5", "--max-turns", "1")
    assert "sampling.max_new_tokens: 4 → 5" in msg and out.read_bytes() == first
    with RunLock(f"{out}.lock", "x"):
        msg = run_cli(capsys, *base)
        assert "being written by another run" in msg


def test_lock_and_differences_units(tmp_path):
    lock = RunLock(tmp_path / ".lock", "folder t").acquire()
    with pytest.raises(RunError, match=r"folder t is being written by another run \(pid \d+ on "):
        RunLock(tmp_path / ".lock", "folder t").acquire()
    lock.release()
    RunLock(tmp_path / ".lock", "folder t").acquire().release()
    assert differences({"a": 1, "s": {"t": 0.0, "m": 8}}, {"a": 1, "s": {"t": 0.0, "m": 9}, "b": None}) == \
        ["b: \"(unset)\" → null", "s.m: 8 → 9"]


def test_missing_model_fails_before_any_episode_or_settings_are_written(tmp_path, capsys):
    out = tmp_path / "o"
    msg = run_cli(capsys, "eval", "--out", str(out), "--model", str(tmp_path / "no-model"), "--limit", "1")
    assert "not found" in msg and not (out / "episodes.jsonl").exists() and not (out / "run.json").exists()
