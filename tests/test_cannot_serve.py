"""Nothing trains or evaluates on an env that cannot work, and a failure is a failure.

A SearchQA-v0 retriever that cannot serve (no index at the path, a folder that is no index, a server that does not
answer) is refused when the env is built, in every entry point that builds one, with one line naming the env and
the retriever; a command whose reward fails writes what succeeded, marks the failure and exits non-zero."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import gymnasium
import pytest

import turngym  # noqa: F401 - registers the envs
from turngym.corpora.lucene import RetrieverError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def bad_retrievers(tmp_path):
    (tmp_path / "empty").mkdir()
    return [(str(tmp_path / "missing"), "no index at"),
            (str(tmp_path / "empty"), "is not a Lucene index"),
            (f"dense:{tmp_path / 'empty'}", "is not a dense index"),
            (closed_port_url(), "is unreachable")]


def build_trl(retriever):
    from turngym.integrations.trl import environment_factory

    return environment_factory("SearchQA-v0", dataset="nq", retriever=retriever)()


def build_verifiers(retriever):
    from turngym.integrations.verifiers_env import load_environment

    return load_environment("SearchQA-v0", indices=[0], dataset="nq", retriever=retriever)


def build_verifiers_tools(retriever):
    from turngym.integrations.verifiers_tools import load_environment

    return load_environment("SearchQA-v0", indices=[0], dataset="nq", retriever=retriever)


def build_skyrl(retriever):
    from turngym.integrations.skyrl import make_env

    return make_env("SearchQA-v0", dataset="nq", retriever=retriever)


def build_openenv(retriever):
    from turngym.integrations.openenv import make_app

    return make_app("SearchQA-v0", dataset="nq", retriever=retriever)


ENTRY_POINTS = {
    "gymnasium.make": lambda r: gymnasium.make("turngym/SearchQA-v0", dataset="nq", retriever=r),
    "trl environment_factory": build_trl,
    "verifiers load_environment": build_verifiers,
    "verifiers tools load_environment": build_verifiers_tools,
    "skyrl make_env": build_skyrl,
    "openenv make_app": build_openenv,
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_retriever_that_cannot_serve_is_refused_where_the_env_is_built(entry, tmp_path):
    for retriever, words in bad_retrievers(tmp_path):
        with pytest.raises(RetrieverError) as exc:
            ENTRY_POINTS[entry](retriever)
        msg = str(exc.value)
        assert msg.startswith("turngym/SearchQA-v0: ") and words in msg and "\n" not in msg, (entry, msg)


def test_a_real_index_and_a_live_server_are_accepted(lucene_index):
    from turngym.corpora.service import RetrievalServer

    index = lucene_index([{"id": "p1", "title": "Paris", "text": "Paris is the capital of France."}])
    gymnasium.make("turngym/SearchQA-v0", dataset="nq", retriever=index).close()
    server = RetrievalServer(index, port=0, threads=1)
    server.start()
    try:
        gymnasium.make("turngym/SearchQA-v0", dataset="nq", retriever=f"http://127.0.0.1:{server.server_address[1]}").close()
    finally:
        server.shutdown()


def test_the_trainer_refuses_it_before_the_model_loads(tmp_path):
    from turngym.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(CONFIGS / "train_digits.yaml"), "env.id=turngym/SearchQA-v0", "env.kwargs.dataset=nq",
              f"env.kwargs.retriever={tmp_path / 'missing'}", "model.name_or_path=/nonexistent/model",
              f"trl.output_dir={tmp_path / 'out'}"])
    assert "turngym/SearchQA-v0: retriever=" in str(exc.value.code) and "no index at" in str(exc.value.code)


def test_a_reward_that_fails_makes_ablate_exit_non_zero_after_writing_the_rest(tiny_chat_policy, tmp_path, capsys):
    """SIOP scored by a model whose tokenizer differs from the one that produced the episodes' ids fails on every
    group; outcome still scores, the report marks the failure, and the command exits 1 (it used to exit 0)."""
    from turngym.agents.tiny import tiny_model_dir
    from turngym.cli import main
    from turngym.episode import EpisodeWriter
    from turngym.episode.reader import read_episodes
    from turngym.evals.harness import EvalSpec, run_eval

    run_eval(EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, model=tiny_chat_policy.name, limit=1,
                      k=2, max_new_tokens=6, temperature=1.0), tmp_path / "ev", policy=tiny_chat_policy)
    episodes = read_episodes(tmp_path / "ev" / "episodes.jsonl").episodes
    for ep, answer in zip(episodes, ["5343", "12"], strict=True):  # the random tiny model answers nothing: give answers
        ep.final_answer = answer  # so SIOP has answers to score (with the other model, whose tokenizer differs)
    with EpisodeWriter(tmp_path / "answered.jsonl") as w:
        w.write_all(episodes)
    other = json.dumps({"model": str(tiny_model_dir(chat=True, vocab_size=400))})
    code = main(["ablate", "--episodes", str(tmp_path / "answered.jsonl"), "--rewards", "outcome,siop",
                 "--scorer", other, "--out", str(tmp_path / "abl")])
    err = capsys.readouterr().err
    assert code == 1 and "error: 1 part(s) failed (siop)" in err
    report = (tmp_path / "abl" / "ablation.md").read_text()
    assert "**siop failed**" in report and "outcome" in report
    scores = [json.loads(line) for line in (tmp_path / "abl" / "scores.jsonl").read_text().splitlines()]
    assert {s["reward"] for s in scores} == {"outcome"} and len(scores) == 2
    assert main(["ablate", "--episodes", str(tmp_path / "answered.jsonl"), "--rewards", "outcome",
                 "--out", str(tmp_path / "abl2")]) == 0


def test_local_mistakes_are_refused_before_anything_heavy_loads(tmp_path):
    """A misspelt estimator is refused before TRL is imported; a --model path that holds nothing, before a load
    (it used to be tried on the hub: 49 s of retries offline); both in a fresh process, so imports are counted."""
    import subprocess
    import sys

    (tmp_path / "models").mkdir()
    code = ("import sys\nfrom turngym.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    print(e.code)\n"
            "print('heavy:', sorted(m for m in ('trl', 'torch', 'transformers') if m in sys.modules))")
    runs = {
        "estimator": ["train", "--config", str(CONFIGS / "train_digits.yaml"), "estimator.name=turnloo"],
        "model": ["eval", "--env", "Calculator-v0", "--model", "models/nope", "--limit", "1", "--out", str(tmp_path / "o")],
    }
    for what, argv in runs.items():
        out = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300).stdout
        assert "heavy: []" in out, (what, out)
        assert {"estimator": "unknown advantage estimator 'turnloo'", "model": "model path not found: models/nope"}[what] \
            in out, (what, out)
    assert not (tmp_path / "o" / "episodes.jsonl").exists()
