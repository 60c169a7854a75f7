"""Bad input to the credit, import, train and run commands ends as one ``error:`` line and exit status 1
(turngym.cli._common.attempt), never a traceback; each command is run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "turngym.cli"]


def one_line_error(argv: list[str], expected: str, cli: list[str] = CLI, stdin: str = "") -> None:
    proc = subprocess.run(cli + argv, capture_output=True, text=True, timeout=120, input=stdin)
    assert proc.returncode == 1, (argv, proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, (argv, proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]  # after any progress line or bar
    assert last.startswith("error: ") and expected in last, (argv, proc.stderr)


@pytest.mark.parametrize("argv, expected", [
    (["creditbench", "--envs", "nope"], "unknown creditbench env(s) ['nope']"),
    (["creditbench", "--oracle", "mc"], "--oracle mc needs --episodes FILE"),
    (["creditbench", "--oracle", "mc", "--episodes", "{tmp}/none.jsonl"], "episodes file not found"),
    (["creditbench", "--oracle", "exact", "--batch-sizes", "4,x"], "invalid literal for int()"),
])
def test_creditbench_bad_input_is_one_line(tmp_path, argv, expected):
    one_line_error([a.format(tmp=tmp_path) for a in argv] + ["--out", str(tmp_path / "cb")], expected)


def test_main_job_with_a_missing_model_is_one_line(tmp_path):
    one_line_error(["main-job", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "mj")],
                   "model path not found")


def test_import_of_a_missing_file_is_one_line(tmp_path):
    one_line_error(["import", "messages", str(tmp_path / "none.jsonl"), "--env", "SearchQA-v0",
                    "--out", str(tmp_path / "o.jsonl")], "trajectories file not found")
    assert not (tmp_path / "o.jsonl").exists()


def test_train_with_a_missing_config_is_one_line(tmp_path):
    one_line_error(["train", "--config", str(tmp_path / "none.yaml")], "config file not found")


def test_rollout_with_a_missing_model_is_one_line(tmp_path):
    one_line_error(["rollout", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "r.jsonl")],
                   "model path not found")


# a core-only install, as far as this process can tell (importlib finds no module set to None in sys.modules);
# scripts/core_install_check.py runs the same command in a real one
CORE_ONLY = [sys.executable, "-c", "import sys\nfor m in ('torch', 'transformers', 'accelerate', 'gguf'): sys.modules[m] = None\n"
             "from turngym.cli import main\nsys.exit(main(sys.argv[1:]))"]


def test_eval_with_the_default_model_without_the_models_extra_is_one_line(tmp_path):
    one_line_error(["eval", "--env", "Calculator-v0", "--limit", "1", "--out", str(tmp_path / "ev")],
                   "a local model needs torch and transformers: pip install 'turngym[models]'", cli=CORE_ONLY)


def test_play_with_an_index_out_of_range_is_one_line():
    one_line_error(["play", "--env", "Calculator-v0", "--human", "--index", "99999"],
                   "--index 99999 is out of range (turngym/Calculator-v0 has 10000 items)")
    one_line_error(["play", "--env", "Calculator-v0", "--human", "--index", "-1"], "--index -1 is out of range")


def test_lm_eval_with_an_unknown_task_is_one_line():
    one_line_error(["lm-eval", "--tasks", "no_such_task", "--model", "turngym"],
                   "Tasks not found: no_such_task. lm-eval lists its tasks with `turngym lm-eval ls tasks`")
