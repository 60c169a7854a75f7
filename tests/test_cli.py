import json
import subprocess
import sys

from turngym.agents.tiny import tiny_model_dir
from turngym.episode.reader import read_episodes

CLI = [sys.executable, "-m", "turngym.cli"]


def test_play_human_reads_actions_from_stdin():
    proc = subprocess.run(CLI + ["play", "--human", "--env", "Calculator-v0", "--index", "3"],
                          input="<calc>2*3</calc>\n<answer>6</answer>\n", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "<result>6</result>" in proc.stdout and "episode ended (terminated)" in proc.stdout


def test_play_with_a_model_prints_turns_and_writes_the_episode(tmp_path):
    out = tmp_path / "play.jsonl"
    proc = subprocess.run(CLI + ["play", "--model", str(tiny_model_dir(chat=True)), "--env", "Calculator-v0",
                                 "--max-turns", "2", "--max-new-tokens", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--- turn 0 [agent]" in proc.stdout and "after 2 turns" in proc.stdout
    [ep] = read_episodes(out).episodes
    assert ep.turns and ep.prompt_ids


def test_rollout_resumes_and_bad_input_is_a_clear_message(tmp_path):
    out = tmp_path / "r.jsonl"
    args = CLI + ["rollout", "--model", str(tiny_model_dir(chat=True)), "--env", "Calculator-v0", "--limit", "3",
                  "--k", "2", "--max-turns", "2", "--max-new-tokens", "6", "--out", str(out)]
    assert subprocess.run(args, capture_output=True, text=True, timeout=120).returncode == 0
    again = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert "0 new episodes; 6 in" in again.stdout
    bad = subprocess.run(CLI + ["play", "--env", "Nope-v0", "--human"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown env" in bad.stderr
    missing = subprocess.run(CLI + ["play", "--model", str(tmp_path / "no-model")], capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "not found" in missing.stderr


def test_rollout_records_the_exact_subset(tmp_path):
    import json

    out = tmp_path / "m.jsonl"
    args = CLI + ["rollout", "--model", str(tiny_model_dir(chat=True)), "--env", "MathCode-v0", "--dataset", "aime25",
                  "--start", "2", "--limit", "2", "--max-turns", "1", "--max-new-tokens", "4", "--out", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "m.jsonl.manifest.json").read_text())
    assert manifest["item_ids"] == ["2025-I-3", "2025-I-4"] and manifest["count"] == 2 and manifest["indices"] == [2, 3]
    eps = read_episodes(out).episodes
    assert {e.task["id"] for e in eps} == {"2025-I-3", "2025-I-4"}
    assert all(e.meta["dataset"]["name"] == "aime25" and e.meta["turngym"] for e in eps)


def test_bfcl_eval_reports_per_category_and_refuses_what_it_cannot_run(tmp_path):
    base = CLI + ["eval", "--env", "BFCL-v0", "--limit", "2", "--max-new-tokens", "8"]
    ok = subprocess.run(base + ["--dataset", "irrelevance", "--model", str(tiny_model_dir(chat=True)),
                                "--out", str(tmp_path / "irr")], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    results = json.loads((tmp_path / "irr" / "results.json").read_text())
    assert results["bfcl"]["per_category"]["irrelevance"]["n"] == 2
    assert "overall (V4 weights)" in (tmp_path / "irr" / "report.md").read_text()
    native = subprocess.run(base + ["--dataset", "simple_python", "--env-arg", "tool_format=native",
                                    "--model", str(tiny_model_dir(chat=False)), "--out", str(tmp_path / "nat")],
                            capture_output=True, text=True, timeout=600)
    assert native.returncode != 0 and "error: native tool calling needs a tokenizer with a chat template" in native.stderr
    web = subprocess.run(base + ["--dataset", "web_search_base", "--model", str(tiny_model_dir(chat=True)),
                                 "--out", str(tmp_path / "web")], capture_output=True, text=True, timeout=600)
    assert web.returncode != 0 and "live web search" in web.stderr


def test_python_dash_m_turngym_lists_every_command_and_its_version():
    from turngym import __version__
    from turngym.cli import build_parser

    out = subprocess.run([sys.executable, "-m", "turngym", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"turngym {__version__}"
    help_text = subprocess.run([sys.executable, "-m", "turngym", "--help"], capture_output=True, text=True, check=True).stdout
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert len(commands) >= 10
    for name in commands:
        assert name in help_text
    eval_help = subprocess.run([sys.executable, "-m", "turngym", "eval", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert eval_help.count("(default:") >= 5  # option defaults are shown


def test_attempt_turns_only_the_listed_errors_into_one_line():
    import pytest

    from turngym.cli._common import attempt

    assert attempt(lambda: 7, ValueError) == 7
    def bad() -> int:
        raise ValueError("bad value")

    with pytest.raises(SystemExit, match=r"^error: bad value$"):
        attempt(bad, ValueError)
    with pytest.raises(KeyError):  # not the user's to fix: the traceback stays
        attempt(lambda: {}["x"], ValueError)


def test_analysis_and_index_commands_report_a_missing_input_as_one_line(tmp_path):
    for argv in (["report", str(tmp_path / "no-run"), "--out", str(tmp_path / "c.md")],
                 ["view", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "v.html")],
                 ["index", "build", "--input", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "idx")]):
        proc = subprocess.run(CLI + argv, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, (argv, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]  # after any progress bar
        assert last.startswith("error:") and "Traceback" not in proc.stderr, (argv, proc.stderr)
