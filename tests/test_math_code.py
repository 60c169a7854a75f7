import threading

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.corpora.datasets import load_dataset
from turngym.envs.math_code import MathCodeEnv
from turngym.grading.math_answers import extract_boxed, grade_answer
from turngym.sandbox import SandboxLimits, SandboxPool


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(size=1, limits=SandboxLimits(wall_s=3, cpu_s=3), preload=("math",))
    yield p
    p.close()


def test_math_code_passes_gymnasium_checker(pool):
    env = gymnasium.make("turngym/MathCode-v0", dataset="aime24", sandbox=pool)
    check_env(env.unwrapped)
    env.close()


def test_two_code_turns_then_boxed_answer_is_graded(pool):
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=5)
    obs, info = env.reset(seed=0, options={"index": 0})
    assert "Janet" in obs and env.episode.task["answers"] == ["18"] and "answers" not in info["task"]
    obs, _, term, _, info = env.step("Eggs left:\n```python\nleft = 16 - 3 - 4\nprint(left)\n```\n```output")
    assert obs == "\n9\n```\n" and not term and info["turn"]["metrics"]["exec_ok"]
    obs, _, term, _, _ = env.step("<code>print(left * 2)</code>")  # state persisted across turns
    assert obs == "\n```output\n18\n```\n" and not term
    obs, reward, term, trunc, info = env.step("She makes \\boxed{18} dollars.")
    assert term and not trunc and info["outcome"]["correct"] and info["final_answer"] == "18"
    ep = env.unwrapped.episode
    assert ep.turns[1].truth["feeds_answer"].value and not ep.turns[0].truth["feeds_answer"].value
    assert "feeds_answer" not in ep.turns[1].metrics  # truth lives where rewards do not read


def test_wrong_answer_errors_and_turn_limit(pool):
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=2)
    env.reset(options={"index": 0})
    obs, *_ = env.step("```python\nundefined_name\n```")
    assert "NameError" in obs
    _, _, term, trunc, info = env.step("I think more is needed.")
    assert trunc and not term and info["outcome"]["correct"] is False and info["outcome"]["answered"] is False
    env.reset(options={"index": 0})
    *_, info = env.step("\\boxed{17}")
    assert info["outcome"]["correct"] is False


def test_a_reply_runs_at_most_max_code_blocks_cells(pool):
    """One reply of thousands of code blocks would run thousands of cells in one env.step."""
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_code_blocks=3)
    env.reset(options={"index": 0})
    obs, _, _, _, info = env.step("".join(f"```python\nprint({i})\n```\n" for i in range(5)))
    assert info["turn"]["metrics"]["code_blocks"] == 3 and len(info["turn"]["tool_calls"]) == 3
    assert "0\n1\n2" in obs and "3" not in obs.replace("first 3", "") and "2 more were not run" in obs
    with pytest.raises(ValueError, match="max_code_blocks"):
        MathCodeEnv(dataset="gsm8k", sandbox=pool, max_code_blocks=0)


def test_output_is_truncated_with_a_marker(pool):
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_output_chars=100)
    env.reset(options={"index": 0})
    obs, *_ = env.step("```python\nprint('x' * 5000)\n```")
    assert "[output truncated]" in obs and len(obs) < 200


def test_hostile_code_in_the_env_keeps_the_env_working(pool):
    env = MathCodeEnv(dataset="gsm8k", sandbox=pool, max_turns=5)
    env.reset(options={"index": 0})
    obs, *_ = env.step("```python\nwhile True: pass\n```")
    assert "time limit" in obs
    obs, *_ = env.step("```python\nprint(6 * 7)\n```")
    assert "42" in obs


@pytest.mark.parametrize("pred,gold,ok", [
    ("\\frac{1}{2}", "0.5", True), ("0.5", "\\frac12", True), ("10\\text{ cm}", "10", True),
    ("1,000", "1000", True), ("1{,}000", "1000", True), ("(1,3]", "(1, 3]", True), ("[1,3]", "(1,3]", False),
    ("\\text{(C)}", "C", True), ("x^2+1", "1+x^2", True), ("3", "4", False), ("", "4", False),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True), ("70", "70", True),
])
def test_grading_cases(pred, gold, ok):
    assert grade_answer(pred, [gold]).correct is ok


def test_boxed_extraction():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{2}{3}}") == "\\frac{2}{3}"  # last wins
    assert extract_boxed("\\boxed{}") == ""
    assert extract_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert extract_boxed("\\boxed 5") == "5"
    assert extract_boxed("\\boxed{unclosed") is None and extract_boxed("none") is None
    assert grade_answer(extract_boxed("\\boxed{}"), ["1"]).reason == "empty boxed answer"
    assert grade_answer(None, ["1"]).reason == "no boxed answer"


def test_grading_is_safe_off_the_main_thread():
    results = []

    def run():
        results.append(grade_answer("\\frac{6}{8}", ["0.75"]).correct)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


def test_bundled_datasets_and_manifests(tmp_path):
    sizes = {"math500": 500, "aime24": 30, "aime25": 30, "gsm8k": 1319}
    for name, n in sizes.items():
        ds = load_dataset(name)
        assert len(ds) == n == ds.manifest.count and len(set(ds.manifest.item_ids)) == n
        assert ds.manifest.sha256 and all(it["answers"] for it in ds.items)
    assert load_dataset("math500")[0]["id"] == "test/precalculus/807.json"
    assert load_dataset("aime25")[0]["answers"] == ["70"]
    local = tmp_path / "mine.jsonl"
    local.write_text('{"problem": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    ds = load_dataset(str(local))
    assert [it["answers"] for it in ds.items] == [["2"], ["4"]] and ds.manifest.source == str(local)
    sub = ds.manifest.subset([1], ds.items)
    assert sub.count == 1 and sub.item_ids == ["1"]


def test_dataset_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_dataset(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_dataset(str(bad))
    with pytest.raises(ValueError, match="split"):
        load_dataset("math500", split="train")
    with pytest.raises(ValueError, match="Hugging Face"):
        load_dataset("someone/not-a-bundled-dataset")
