"""A run folder belongs to one run: its id is in every episode id, kept by resume; a folder whose episodes name
another model, env, run or settings is refused in one line before the model loads; scores of one run never join
another run's episodes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium
import pytest

import turngym  # noqa: F401 - registers the envs
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.episode.reader import read_episodes
from turngym.evals.harness import EvalError, EvalSpec, run_eval

CALC = {"env_id": "turngym/Calculator-v0", "env_kwargs": {"max_turns": 2}, "max_new_tokens": 6, "temperature": 1.0}


def spec(policy, **over) -> EvalSpec:
    return EvalSpec(**{**CALC, "model": policy.name, "limit": 2, "k": 2, **over})


def python_api_episodes(policy, path: Path, env_id: str = "turngym/Calculator-v0", n: int = 1) -> bytes:
    """Episodes written the way docs/scale.md's example writes them: a runner, an episodes file, no run.json."""
    make = lambda: gymnasium.make(env_id, max_turns=2)  # noqa: E731
    runner = RolloutRunner(policy, make, SamplingParams(max_new_tokens=6, temperature=1.0), k=2, concurrency=2)
    runner.run(range(n), path)
    return path.read_bytes()


def renamed(policy, name: str):
    other = copy.copy(policy)
    other.name = name
    return other


def test_a_folder_of_another_models_episodes_is_refused_before_the_model_loads(tiny_chat_policy, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    before = python_api_episodes(renamed(tiny_chat_policy, "someone-else"), out / "episodes.jsonl")
    # policy=None: the run would load --model (which does not exist); the refusal comes first
    with pytest.raises(EvalError, match=r"holds episodes of another run \(2 of model 'someone-else' \(this run's: "):
        run_eval(spec(tiny_chat_policy, model="/nonexistent/model"), out, policy=None)
    assert (out / "episodes.jsonl").read_bytes() == before and not (out / "run.json").exists()


def test_a_folder_of_another_envs_episodes_is_refused(tiny_chat_policy, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    before = python_api_episodes(tiny_chat_policy, out / "episodes.jsonl", env_id="turngym/Digits-v0")
    with pytest.raises(EvalError, match="2 of env 'turngym/Digits-v0'"):
        run_eval(spec(tiny_chat_policy), out, policy=tiny_chat_policy)
    assert (out / "episodes.jsonl").read_bytes() == before


def test_a_folder_without_run_json_is_adopted_only_when_its_episodes_match(tiny_chat_policy, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    python_api_episodes(tiny_chat_policy, out / "episodes.jsonl")  # item 0, same model and env: adopted
    legacy = {e.id for e in read_episodes(out / "episodes.jsonl").episodes}
    results = run_eval(spec(tiny_chat_policy), out, policy=tiny_chat_policy)
    assert "is adopted" in capsys.readouterr().out
    episodes = read_episodes(out / "episodes.jsonl").episodes
    assert results["episodes"] == 4 and len(episodes) == 4 and legacy <= {e.id for e in episodes}  # item 0 not replayed
    assert json.loads((out / "run.json").read_text())["run_id"] == ""  # its episodes' ids stay as they were written


def test_ids_are_unique_per_run_and_kept_by_resume_while_seeds_do_not_depend_on_the_run(tiny_chat_policy, tmp_path):
    run_eval(spec(tiny_chat_policy, limit=1), tmp_path / "a", policy=tiny_chat_policy)
    run_id = json.loads((tmp_path / "a" / "run.json").read_text())["run_id"]
    run_eval(spec(tiny_chat_policy), tmp_path / "a", policy=tiny_chat_policy)  # resumed: item 1 added
    for d in "bc":
        run_eval(spec(tiny_chat_policy), tmp_path / d, policy=tiny_chat_policy)
    a, b, c = (read_episodes(tmp_path / d / "episodes.jsonl").episodes for d in "abc")
    assert json.loads((tmp_path / "a" / "run.json").read_text())["run_id"] == run_id and len(a) == 4
    assert all(e.id.startswith(f"{run_id}|") and e.meta["run"]["id"] == run_id for e in a)
    assert not {e.id for e in a} & {e.id for e in b} and not {e.id for e in b} & {e.id for e in c}
    assert len({e.meta["run"]["settings"] for e in a + b + c}) == 1  # the same settings, the same digest
    # the same --seed resets every env with the same seed and samples the same actions in two runs played alike
    by_key = lambda eps: sorted((e.id.split("|", 1)[1], e.seed, [t.action for t in e.turns]) for e in eps)  # noqa: E731
    assert by_key(b) == by_key(c)
    assert [x[:2] for x in by_key(a)] == [x[:2] for x in by_key(b)]


@pytest.mark.parametrize("what", ["run", "settings"])
def test_episodes_of_another_run_or_settings_are_refused(tiny_chat_policy, tmp_path, what):
    run_eval(spec(tiny_chat_policy, limit=1), tmp_path / "a", policy=tiny_chat_policy)
    written = (tmp_path / "a" / "episodes.jsonl").read_bytes()
    other_id = json.loads((tmp_path / "a" / "run.json").read_text())["run_id"]
    if what == "run":  # another run's episodes appended to a folder whose run.json names its own run
        run_eval(spec(tiny_chat_policy, limit=1), tmp_path / "b", policy=tiny_chat_policy)
        target, over, words = tmp_path / "b", {}, f"2 of run '{other_id}'"
        with (target / "episodes.jsonl").open("ab") as f:
            f.write(written)
    else:  # a folder without run.json whose episodes recorded other settings (max_new_tokens 6, not 7)
        target, over, words = tmp_path / "c", {"max_new_tokens": 7}, "2 of settings digest"
        target.mkdir()
        (target / "episodes.jsonl").write_bytes(written)
    before = (target / "episodes.jsonl").read_bytes()
    with pytest.raises(EvalError, match=words):
        run_eval(spec(tiny_chat_policy, **over), target, policy=tiny_chat_policy)
    assert (target / "episodes.jsonl").read_bytes() == before


def test_a_copied_episodes_file_with_the_same_settings_is_adopted_under_its_own_run(tiny_chat_policy, tmp_path):
    run_eval(spec(tiny_chat_policy, limit=1), tmp_path / "a", policy=tiny_chat_policy)
    run_id = json.loads((tmp_path / "a" / "run.json").read_text())["run_id"]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "episodes.jsonl").write_bytes((tmp_path / "a" / "episodes.jsonl").read_bytes())
    run_eval(spec(tiny_chat_policy), tmp_path / "c", policy=tiny_chat_policy)
    assert json.loads((tmp_path / "c" / "run.json").read_text())["run_id"] == run_id
    assert len(read_episodes(tmp_path / "c" / "episodes.jsonl").episodes) == 4


def test_scores_of_another_run_are_refused_by_the_viewer(tiny_chat_policy, tmp_path):
    from turngym.cli import main

    for d in "ab":
        run_eval(spec(tiny_chat_policy, limit=1), tmp_path / d, policy=tiny_chat_policy)
        assert main(["ablate", "--episodes", str(tmp_path / d / "episodes.jsonl"), "--rewards", "outcome",
                     "--out", str(tmp_path / d / "abl")]) == 0
    run_b = json.loads((tmp_path / "b" / "run.json").read_text())["run_id"]
    with pytest.raises(SystemExit, match=f"the episodes are of run {run_b}: are the scores of another run"):
        main(["view", str(tmp_path / "b" / "episodes.jsonl"), "--scores", str(tmp_path / "a" / "abl" / "scores.jsonl"),
              "--out", str(tmp_path / "v.html")])
    assert main(["view", str(tmp_path / "b" / "episodes.jsonl"), "--scores", str(tmp_path / "b" / "abl" / "scores.jsonl"),
                 "--out", str(tmp_path / "v.html")]) == 0
