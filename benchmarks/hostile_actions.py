"""Hostile actions and answers: what one policy output can cost the run (goals: ``env.step`` <= 50 ms on a
200 KB hostile action; a refused answer decided in < 1 ms).

Part 1, ``env.step`` side by side with a benign action of the same length (prose, then a valid answer or
call) on every env that reads raw actions: MathCode-v0 (``\\boxed`` extraction, code blocks), SearchQA-v0
(tags and Hermes tool calls), Calculator-v0 (tag calls) and BFCL-v0 (prompting and native calls); then
each parser alone. Each hostile action is one of the shapes that made a regex or scan quadratic (many
openings that never close, deep nesting) and is as long as the action cap allows (``MAX_ACTION_CHARS``).
Part 2, ``grade_answer`` on answers the size check refuses, beside a plain answer decided by the
normalised match (no grader either way). Medians of ``--repeats`` runs, arms alternating.

Usage: python benchmarks/hostile_actions.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gymnasium as gym

import turngym  # noqa: F401 - registers the envs
from turngym.episode import MAX_ACTION_CHARS
from turngym.grading.math_answers import extract_boxed, grade_answer

N = MAX_ACTION_CHARS


def fill(unit: str, tail: str = "") -> str:
    """``unit`` repeated up to the cap, then ``tail``."""
    return unit * ((N - len(tail)) // len(unit)) + tail


def benign(tail: str) -> str:
    return fill("The sum of the parts is what we want here. ", tail)


# env id, env kwargs, [(name, hostile action)], benign action of the same length
CASES: list[tuple[str, dict, list[tuple[str, str]], str]] = [
    ("turngym/MathCode-v0", {"dataset": "gsm8k"},
     [("unclosed \\boxed{ x N", fill("\\boxed{")), ("one \\boxed{ then { x N", "\\boxed{" + fill("{")[7:]),
      ("unclosed <code> x N", fill("<code>")), ("```python fences x N", fill("```python\n")),
      ("\\boxed{1} then } x N", "\\boxed{1}" + fill("}")[9:])],
     benign("\\boxed{18}")),
    ("turngym/SearchQA-v0", {"dataset": "nq", "retriever": "http://127.0.0.1:9"},
     [("unclosed <search> x N", fill("<search>")), ("unclosed <answer> x N", fill("<answer>")),
      ("<search></answer> x N", fill("<search></answer>"))],
     benign("<answer>Paris</answer>")),
    ("turngym/SearchQA-v0", {"dataset": "nq", "retriever": "http://127.0.0.1:9", "tool_format": "native"},
     [("unclosed <tool_call> x N", fill("<tool_call>")), ("unclosed <answer> x N", fill("<answer>"))],
     benign("<answer>Paris</answer>")),
    ("turngym/Calculator-v0", {},
     [("unclosed <calc> x N", fill("<calc>")), ("unclosed <answer> x N", fill("<answer>"))],
     benign("<answer>3</answer>")),
    ("turngym/BFCL-v0", {"category": "simple_python", "tool_format": "prompting"},
     [("[ x N", fill("[")), ("f( x N", fill("f(")), ("f(a=1), x N", fill("f(a=1), ")), ("((( then 1", fill("(", "1"))],
     benign("[f(a=1)]")),
    ("turngym/BFCL-v0", {"category": "simple_python", "tool_format": "native"},
     [("unclosed <tool_call> x N", fill("<tool_call>")), ("{ x N in a block", "<tool_call>" + fill("{", "</tool_call>")[11:])],
     benign('<tool_call>{"name": "f", "arguments": {}}</tool_call>')),
]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def step_ms(env: gym.Env, action: str) -> float:
    env.reset(options={"index": 0})
    return timed(lambda: env.step(action))


def median_pair(a: Callable[[], float], b: Callable[[], float], repeats: int) -> tuple[float, float]:
    xs, ys = [], []
    for r in range(repeats):
        for arm in ((a, xs), (b, ys)) if r % 2 == 0 else ((b, ys), (a, xs)):
            arm[1].append(arm[0]())
    return statistics.median(xs), statistics.median(ys)


def parser_cases() -> list[tuple[str, Callable[[str], object], str]]:
    from turngym.envs.bfcl.calls import decode_native, decode_prompting
    from turngym.envs.parsing import (
        parse_code_blocks,
        parse_hermes_tool_calls,
        parse_json_calls,
        parse_python_calls,
        parse_tag_calls,
    )
    from turngym.envs.search_qa import last_answer

    return [
        ("extract_boxed", extract_boxed, fill("\\boxed{")),
        ("parse_tag_calls", parse_tag_calls, fill("<search>")),
        ("parse_hermes_tool_calls", parse_hermes_tool_calls, fill("<tool_call>")),
        ("parse_json_calls", parse_json_calls, fill("```json\n{")),
        ("parse_json_calls", parse_json_calls, fill("[")),
        ("parse_code_blocks", parse_code_blocks, fill("<code>")),
        ("parse_code_blocks", parse_code_blocks, fill("```py\n")),
        ("parse_python_calls", parse_python_calls, fill("f(a=1), ")),
        ("parse_python_calls", parse_python_calls, fill("[")),
        ("decode_prompting", decode_prompting, fill("f(a=1), ")),
        ("decode_native", decode_native, fill("<tool_call>")),
        ("last_answer", last_answer, fill("<answer>")),
    ]


REFUSED = [r"2^{2^{2^{2^{2^{2}}}}}", r"9^{9^{9}}", r"10^{10^{10}}", "10**10**10", r"2^{1000000}", "100000!",
           r"(10^{6})!", r"10^{99999}!", r"\Gamma(10^{9})", r"\binom{10^{9}}{5}", r"\prod_{k=1}^{10^{6}} k", "10!!"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"env.step, action of {N:,} characters (median of {args.repeats}; goal <= 50 ms)")
    worst = 0.0
    for env_id, kwargs, hostile, ok in CASES:
        env = gym.make(env_id, **kwargs).unwrapped
        label = f"{env_id.split('/')[-1]} {kwargs.get('tool_format', '')}".strip()
        for name, action in hostile:
            bad, good = median_pair(lambda e=env, a=action: step_ms(e, a), lambda e=env, a=ok: step_ms(e, a), args.repeats)
            worst = max(worst, bad)
            print(f"  {label:<22} {name:<26} {bad:8.2f} ms   benign {good:7.2f} ms   ratio {bad / good:5.2f}x", flush=True)
        env.close()
    print(f"  worst hostile env.step: {worst:.2f} ms")
    print("parsers alone, hostile input at the cap (median)")
    for name, fn, text in parser_cases():
        ms = statistics.median(timed(lambda f=fn, t=text: f(t)) for _ in range(args.repeats))
        print(f"  {name:<24} {text[:12]!r:<18} {ms:8.2f} ms", flush=True)
    print("grade_answer on refused answers (goal < 1 ms; no grader process is asked)")
    plain = statistics.median(timed(lambda: grade_answer("18", ["18"])) for _ in range(50))
    for answer in REFUSED:
        ms = statistics.median(timed(lambda a=answer: grade_answer(a, ["18"])) for _ in range(50))
        verdict = grade_answer(answer, ["18"])
        assert verdict.graded and not verdict.correct, (answer, verdict)
        print(f"  {answer:<24} {ms:7.3f} ms  ({verdict.reason})")
    print(f"  plain answer, normalised match: {plain:.3f} ms")


if __name__ == "__main__":
    main()
