"""The benchmark harness: metrics on hand-made episodes, resumable eval, ablation, reports, lm-eval bridge."""

import json
import math
import signal
import subprocess
import sys
import time

import pytest

from turngym.agents.tiny import tiny_model_dir
from turngym.credit.ablate import ablate, spearman
from turngym.episode import Episode, EpisodeWriter, Turn
from turngym.episode.reader import read_episodes
from turngym.evals.harness import EvalError, EvalSpec, resolve_subset, run_eval
from turngym.grading.metrics import behaviour_metrics, outcome_metrics, pass_at_k, wilson
from turngym.integrations.lm_eval_bridge import parse_reply
from turngym.rewards import get_reward
from turngym.truth import TruthValue
from turngym.views.report import compare_runs


def ep(i, group, correct, turns=2, **outcome):
    return Episode(id=f"e{i}", env_id="turngym/MathCode-v0", group=group, task={"dataset": "d", "question": group},
                   turns=[Turn(index=t, action="x", tool_calls=[{"name": "python", "arguments": {}}] * (t % 2),
                               latency_ms={"generate": 10.0, "tool": 1.0}) for t in range(turns)],
                   final_answer="1" if correct is not None else None,
                   outcome=({"correct": correct} if correct is not None else {}) | outcome,
                   meta={"wall_ms": 100.0 * turns})


def test_metrics_on_hand_made_episodes():
    eps = [ep(0, "a", 1.0), ep(1, "a", 0.0), ep(2, "a", 1.0), ep(3, "b", 0.0), ep(4, "b", 0.0), ep(5, "b", 0.0, turns=4)]
    m = outcome_metrics(eps, k=2)
    # 2 tasks of 3 samples: the task is the unit, so accuracy is pass@1 (same value, n, interval)
    assert m["accuracy"]["value"] == pytest.approx(2 / 6) and m["accuracy"]["n"] == 2
    assert m["accuracy"] == m["pass@1"]
    single = outcome_metrics([ep(i, f"t{i}", float(i < 2)) for i in range(6)])
    lo, hi = single["accuracy"]["ci95"]
    assert single["accuracy"]["n"] == 6 and single["accuracy"]["ci"] == "wilson"
    assert lo == pytest.approx(0.0968, abs=1e-3) and hi == pytest.approx(0.7000, abs=1e-3)  # Wilson 95%
    assert m["pass@1"]["value"] == pytest.approx((2 / 3 + 0) / 2)
    assert m["pass@2"]["value"] == pytest.approx(((1 - math.comb(1, 2) / math.comb(3, 2)) + 0) / 2)
    b = behaviour_metrics(eps)
    assert b["turns_per_episode"]["value"] == pytest.approx(14 / 6)
    assert b["tool_calls_per_episode"]["value"] == pytest.approx((1 * 5 + 2) / 6)
    assert b["latency_ms"]["generate_mean"] == pytest.approx(10.0 * 14 / 6)
    assert pass_at_k(5, 5, 3) == 1.0 and pass_at_k(5, 0, 3) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_partial_credit_reports_its_mean_credit_and_no_pass_at_k():
    """Measured on the previous version: Digits-v0 showed accuracy 0.072 next to pass@1 1.000 (any credit
    counted as a pass). A partial-credit env declares no success, so pass@k is not reported there."""
    eps = [ep(i, g, c) for i, (g, c) in enumerate([("a", 0.1), ("a", 0.0), ("b", 0.05), ("b", 0.14)])]
    m = outcome_metrics(eps, k=2)
    assert m["accuracy"]["value"] == pytest.approx(0.0725) and m["accuracy"]["ci"] == "bootstrap BCa"
    assert not any(key.startswith("pass@") for key in m)
    whole = outcome_metrics([ep(i, g, c) for i, (g, c) in enumerate([("a", 1.0), ("a", 0.0), ("b", 0.0), ("b", 0.0)])], k=2)
    assert whole["pass@1"] == whole["accuracy"] and whole["pass@2"]["value"] == pytest.approx(0.5)
    assert wilson(0, 0).n == 0
    qa = outcome_metrics([ep(0, "a", None, em=1.0, f1=1.0), ep(1, "a", None, em=0.0, f1=0.5)])
    assert qa["em"]["value"] == 0.5 and qa["f1"]["value"] == 0.75


def test_subset_resolution_and_errors(tmp_path):
    ids = ["x0", "x1", "x2", "x3"]
    assert resolve_subset(ids, limit=2, start=1) == [1, 2]
    f = tmp_path / "s.json"
    f.write_text(json.dumps(["x3", 0, "x1"]))
    assert resolve_subset(ids, subset_file=str(f)) == [3, 0, 1]
    (tmp_path / "s.txt").write_text("x2\nx0\n")
    assert resolve_subset(ids, subset_file=str(tmp_path / "s.txt")) == [2, 0]
    f.write_text(json.dumps(["nope"]))
    with pytest.raises(EvalError, match="neither an item id"):
        resolve_subset(ids, subset_file=str(f))
    with pytest.raises(EvalError, match="not found"):
        resolve_subset(ids, subset_file=str(tmp_path / "missing"))
    with pytest.raises(EvalError, match="unknown env"):
        run_eval(EvalSpec(env_id="turngym/Nope-v0"), tmp_path / "o", policy=object())


EVAL_SCRIPT = """
import sys, time
from turngym.agents.loading import load_hf_policy
from turngym.evals.harness import EvalSpec, run_eval
pol = load_hf_policy(sys.argv[2], dtype="float32", device="cpu")
inner = pol.generate
def slow(reqs, s):
    time.sleep(0.05)
    return inner(reqs, s)
pol.generate = slow
run_eval(EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, limit=12, k=2, concurrency=3,
                  max_new_tokens=8, temperature=1.0), sys.argv[1], policy=pol)
"""


def test_eval_resumes_after_kill_with_no_lost_or_duplicated_episodes(tmp_path, tiny_chat_policy):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", EVAL_SCRIPT, str(out), str(tiny_model_dir(chat=True))])
    deadline = time.time() + 120
    while time.time() < deadline:
        p = out / "episodes.jsonl"
        if p.exists() and len(p.read_bytes().splitlines()) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = len(read_episodes(out / "episodes.jsonl").episodes)
    assert 5 <= before < 24
    spec = EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, limit=12, k=2, concurrency=3,
                    max_new_tokens=8, temperature=1.0)
    results = run_eval(spec, out, policy=tiny_chat_policy)
    ids = [e.id for e in read_episodes(out / "episodes.jsonl").episodes]
    assert len(ids) == 24 == len(set(ids)) == results["episodes"]
    assert results["subset"]["indices"] == list(range(12)) or results["subset"].get("count") == 12
    assert (out / "report.md").read_text().startswith("# Evaluation: turngym/Calculator-v0")
    assert (out / "metrics.png").exists() and (out / "behaviour.png").exists()


def test_eval_on_a_bundled_dataset_records_the_manifest_and_report_compares_runs(tmp_path, tiny_chat_policy):
    a = run_eval(EvalSpec(env_id="turngym/MathCode-v0", env_kwargs={"dataset": "aime25", "max_turns": 1}, limit=2,
                          max_new_tokens=6), tmp_path / "a", policy=tiny_chat_policy)
    assert a["subset"]["dataset"] == "aime25" and a["subset"]["item_ids"] == ["2025-I-1", "2025-I-2"]
    assert a["subset"]["sha256"] and "accuracy" in a["metrics"]
    b = run_eval(EvalSpec(env_id="turngym/MathCode-v0", env_kwargs={"dataset": "aime25", "max_turns": 2}, limit=2,
                          max_new_tokens=6), tmp_path / "b", policy=tiny_chat_policy)
    assert b["episodes"] == 2
    path = compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp.md")
    text = path.read_text()
    assert "| a | turngym/MathCode-v0" in text and "| b |" in text and (tmp_path / "cmp.png").exists()
    with pytest.raises(FileNotFoundError, match="no results.json"):
        compare_runs([tmp_path / "nothing"], tmp_path / "x.md")


def test_corrupt_episodes_file_is_reported_and_replayed(tmp_path, tiny_chat_policy, capsys):
    spec = EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 1}, limit=3, max_new_tokens=4)
    run_eval(spec, tmp_path, policy=tiny_chat_policy)
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "episodes.jsonl").write_text(lines[0] + '{"broken\n' + "".join(lines[2:]))
    res = run_eval(spec, tmp_path, policy=tiny_chat_policy)
    assert "corrupt line" in capsys.readouterr().out and res["episodes"] == 3


def search_episode(i, group, answer, hits, gold="Paris"):
    turns = [Turn(index=t, action="<search>q</search>", observation=("Paris" if h else "nothing"),
                  truth={"retrieval_hit": TruthValue(h, "env")}) for t, h in enumerate(hits)]
    turns.append(Turn(index=len(hits), action=f"<answer>{answer}</answer>"))
    return Episode(id=f"s{i}", env_id="turngym/SearchQA-v0", group=group, task={"question": group, "answers": [gold]},
                   turns=turns, final_answer=answer, outcome={"em": float(answer == gold), "f1": float(answer == gold)})


def test_ablation_reports_credit_accuracy_and_correlations(tmp_path):
    eps = [search_episode(0, "q1", "Paris", [True, False]), search_episode(1, "q1", "Paris", [False, True]),
           search_episode(2, "q1", "Lyon", [False, False]), search_episode(3, "q1", "Paris", [True, True]),
           search_episode(4, "q2", "Rome", [False]), search_episode(5, "q2", "Paris", [True])]

    HITS = {e.id: [t.truth["retrieval_hit"].value for t in e.turns if t.truth] for e in eps}  # noqa: N806

    from turngym.rewards.base import GroupReward

    class FakeHitReward(GroupReward):
        """A fake per-turn reward that pays exactly the retrieval hits (credit accuracy 1), known from outside:
        the episodes it is handed carry no truth."""
        name = "fake-hits"
        estimator = "turn"

        def score_group(self, group):
            from turngym.rewards.base import GroupScores
            return GroupScores([[float(HITS[e.id][t.index]) if t.index < len(HITS[e.id]) else 0.0 for t in e.turns]
                                for e in group])

    summary = ablate(eps, {"outcome": get_reward("outcome"), "ttrl": get_reward("ttrl"), "hits": FakeHitReward()},
                     tmp_path)
    assert summary["groups"] == 2 and summary["turns_with_ground_truth"] == 10
    assert summary["rewards"]["hits"]["credit_accuracy"] == pytest.approx(1.0)
    assert summary["rewards"]["outcome"]["agreement_with_gold_outcome"] == pytest.approx(1.0)
    assert summary["correlation"]["outcome"]["outcome"] == pytest.approx(1.0)
    for f in ("ablation.json", "ablation.md", "credit_maps.png"):
        assert (tmp_path / f).exists()
    assert spearman([1, 2, 3], [1, 1, 1]) is None


def test_ablate_and_eval_commands_give_clear_errors(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "turngym.cli", "ablate", "--episodes", str(tmp_path / "none.jsonl"),
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not found" in bad.stderr
    f = tmp_path / "e.jsonl"
    with EpisodeWriter(f) as w:
        w.write(search_episode(0, "q", "Paris", [True]))
    bad = subprocess.run([sys.executable, "-m", "turngym.cli", "ablate", "--episodes", str(f), "--rewards", "siop",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "needs --scorer" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "turngym.cli", "eval", "--env", "Nope-v0", "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown env" in bad.stderr


def test_lm_eval_bridge_runs_multi_turn_episodes_with_an_lm_eval_backend(tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from turngym.integrations.lm_eval_bridge import make_turngym_lm_class, write_tasks

    names = write_tasks(tmp_path, ["gsm8k"], limit=2)
    lm = make_turngym_lm_class()(backend="hf", pretrained=str(tiny_model_dir(chat=True)), max_turns=2,
                                 max_new_tokens=8, device="cpu")
    res = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=TaskManager(include_path=str(tmp_path)),
                                  bootstrap_iters=0, log_samples=True)
    assert res["results"]["turngym_gsm8k"]["acc,none"] == 0.0
    replies = [parse_reply(s["resps"][0][0]) for s in res["samples"]["turngym_gsm8k"]]
    assert len(replies) == 2 and all(r["turns"] == 2 and "correct" in r["outcome"] for r in replies)
    for sample in res["samples"]["turngym_gsm8k"]:  # logged samples show the question and what the model wrote
        assert sample["doc"]["question"] in sample["arguments"][0][0]
        assert sample["resps"][0][0].index("<turngym-result>") > 0


def test_lm_eval_task_folders_are_portable_and_other_model_types_get_a_clear_error(tmp_path):
    import shutil

    import lm_eval
    from lm_eval.tasks import TaskManager

    from turngym.integrations.lm_eval_bridge import make_turngym_lm_class, process_results, write_tasks

    names = write_tasks(tmp_path / "written", ["gsm8k"], limit=1)
    assert str(tmp_path) not in "".join(f.read_text() for f in (tmp_path / "written").glob("*.yaml"))
    moved = shutil.move(str(tmp_path / "written"), str(tmp_path / "moved"))
    lm = make_turngym_lm_class()(backend="hf", pretrained=str(tiny_model_dir(chat=True)), max_turns=1,
                                 max_new_tokens=4, device="cpu")
    res = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=TaskManager(include_path=moved),
                                  bootstrap_iters=0)
    assert res["results"]["turngym_gsm8k"]["acc,none"] == 0.0
    # a plain generation model's text (what `--model hf` would give) is refused, never scored 0
    with pytest.raises(ValueError, match="only the 'turngym' lm-eval model can play"):
        process_results({"question": "q"}, ["The answer is 4."])


def test_unknown_dataset_server_down_and_full_disk_are_clear_and_lose_nothing(tmp_path, tiny_chat_policy, monkeypatch):
    import errno
    import socket

    from turngym.agents.openai_compat import OpenAICompatPolicy
    from turngym.episode import EpisodeWriter as Writer

    with pytest.raises(EvalError, match="cannot make"):
        run_eval(EvalSpec(env_id="turngym/MathCode-v0", env_kwargs={"dataset": "no-such-dataset"}), tmp_path / "a",
                 policy=tiny_chat_policy)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    down = OpenAICompatPolicy(model="m", base_url=f"http://127.0.0.1:{port}/v1", retries=0, timeout_s=2)
    with pytest.raises(EvalError, match="model backend failed.*rerun"):
        run_eval(EvalSpec(env_id="turngym/Calculator-v0", limit=2), tmp_path / "b", policy=down)

    spec = EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 1}, limit=4, max_new_tokens=4, concurrency=1)
    real_write, calls = Writer.write, {"n": 0}

    def write_then_fill_disk(self, episode):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, episode)

    monkeypatch.setattr(Writer, "write", write_then_fill_disk)
    with pytest.raises(EvalError, match="disk full.*intact"):
        run_eval(spec, tmp_path / "c", policy=tiny_chat_policy)
    monkeypatch.setattr(Writer, "write", real_write)
    assert len(read_episodes(tmp_path / "c" / "episodes.jsonl").episodes) == 2
    assert run_eval(spec, tmp_path / "c", policy=tiny_chat_policy)["episodes"] == 4


def test_lm_eval_bridge_runs_bfcl_categories(tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from turngym.integrations.lm_eval_bridge import make_turngym_lm_class, write_tasks

    names = write_tasks(tmp_path, ["bfcl_irrelevance", "bfcl_multi_turn_base"], limit=1)
    lm = make_turngym_lm_class()(backend="hf", pretrained=str(tiny_model_dir(chat=True)), max_new_tokens=8,
                                 device="cpu")
    res = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=TaskManager(include_path=str(tmp_path)),
                                  bootstrap_iters=0, log_samples=True)
    [irr] = [parse_reply(s["resps"][0][0]) for s in res["samples"]["turngym_bfcl_irrelevance"]]
    assert irr["outcome"]["category"] == "irrelevance" and irr["turns"] == 1
    # a random tiny model makes no decodable call: right for irrelevance (1.0)
    assert res["results"]["turngym_bfcl_irrelevance"]["acc,none"] == float(irr["outcome"]["bfcl_valid"]) == 1.0
    [mt] = [parse_reply(s["resps"][0][0]) for s in res["samples"]["turngym_bfcl_multi_turn_base"]]
    assert mt["outcome"]["category"] == "multi_turn_base" and mt["outcome"]["bfcl_valid"] is False
