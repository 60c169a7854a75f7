import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.envs.parsing import (
    MAX_CALL_SYMBOLS,
    MAX_INPUT_CHARS,
    ParseResult,
    parse_code_blocks,
    parse_hermes_tool_calls,
    parse_json_calls,
    parse_python_calls,
    parse_tag_calls,
    tag_matches,
)
from turngym.grading.math_answers import extract_boxed


def test_tag_calls():
    r = parse_tag_calls("think <search> capital of France </search> then")
    assert r.calls == [{"name": "search", "arguments": {"query": "capital of France"}}]
    r = parse_tag_calls("<answer>Paris</answer>")
    assert r.calls == [{"name": "answer", "arguments": {"answer": "Paris"}}]
    assert "never closed" in parse_tag_calls("<search>open").error
    assert "no tool call" in parse_tag_calls("just text").error


def test_hermes_calls():
    r = parse_hermes_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
                                '<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}</tool_call>')
    assert r.calls == [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}}]
    assert "invalid JSON" in parse_hermes_tool_calls("<tool_call>{name: f}</tool_call>").error
    assert "name" in parse_hermes_tool_calls('<tool_call>{"arguments": {}}</tool_call>').error
    assert "never closed" in parse_hermes_tool_calls('<tool_call>{"name": "f"}').error


def test_json_calls_bare_and_fenced():
    assert parse_json_calls('{"name": "f", "arguments": {"x": [1]}}').calls == [{"name": "f", "arguments": {"x": [1]}}]
    fenced = 'Sure.\n```json\n[{"name": "f", "parameters": {}}, {"function": {"name": "g", "arguments": "{}"}}]\n```'
    assert [c["name"] for c in parse_json_calls(fenced).calls] == ["f", "g"]
    assert parse_json_calls('I will call {"name": "h", "arguments": {}} now').calls[0]["name"] == "h"
    assert parse_json_calls('{"name": "f", "arguments": 3}').error.startswith('"arguments" of f')
    assert parse_json_calls("nothing here").error == "no JSON call found"


def test_code_blocks_in_order():
    text = "a\n```python\nx = 1\n```\nb <code>print(x)</code>\n```py\ny=2\n```"
    assert [c["arguments"]["code"].strip() for c in parse_code_blocks(text).calls] == ["x = 1", "print(x)", "y=2"]
    assert "never closed" in parse_code_blocks("```python\nprint(1)").error
    assert parse_code_blocks("no code").error.startswith("no ```python")


def test_python_call_lists():
    r = parse_python_calls('[f(a=1), g(b="x", c=[1, -2.5], d={"k": None}), mod.h(e=True)]')
    assert r.calls == [{"name": "f", "arguments": {"a": 1}},
                       {"name": "g", "arguments": {"b": "x", "c": [1, -2.5], "d": {"k": None}}},
                       {"name": "mod.h", "arguments": {"e": True}}]
    assert parse_python_calls("f(a=1)").calls == [{"name": "f", "arguments": {"a": 1}}]
    assert "keyword" in parse_python_calls("[f(1)]").error
    assert "not a literal" in parse_python_calls("[f(a=__import__('os').system('x'))]").error
    assert "not a valid call list" in parse_python_calls("[f(a=]").error
    assert parse_python_calls("").error.startswith("empty")


def test_non_text_and_oversized_input():
    assert parse_tag_calls(None).error.startswith("expected text")
    assert "limit" in parse_json_calls("{" * 300_000).error


def test_tag_matches_read_what_the_lazy_regex_reads():
    """The linear scan against ``re.finditer(r"<(a|b)>(.*?)</\\1>", DOTALL)``, the quadratic reading it replaces."""
    rng = random.Random(0)
    pieces = ["<a>", "</a>", "<b>", "</b>", "<ab>", "</ab>", "x", "<", ">", "/", "\n"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        tags = rng.choice([("a", "b"), ("b", "a"), ("a",), ("a", "ab"), ("ab", "a")])
        names = "|".join(re.escape(t) for t in tags)
        reference = [(m.start(), m.group(1), m.group(2)) for m in re.finditer(rf"<({names})>(.*?)</\1>", text, re.DOTALL)]
        assert tag_matches(text, tags) == reference, (text, tags)


def _boxed_reference(text):
    """The quadratic reading ``extract_boxed`` replaces: scan each box's braces from its opening."""
    last = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end(): i - 1].strip()
    if last is None:
        bare = re.findall(r"\\boxed\s+([^\s$]+)", text)
        last = bare[-1].strip() if bare else None
    return last


def test_extract_boxed_reads_what_the_per_box_scan_reads():
    rng = random.Random(1)
    pieces = ["\\boxed{", "\\fbox {", "\\boxed ", "{", "}", "1", " ", "\\{", "\\}", "x$", "\\boxed"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        assert extract_boxed(text) == _boxed_reference(text), text


HOSTILE = MAX_INPUT_CHARS  # actions as long as the cap allows


def fill(unit, tail=""):
    return unit * ((HOSTILE - len(tail)) // len(unit)) + tail


def test_hostile_actions_at_the_cap_get_their_ordinary_answers():
    """Each shape made a scan quadratic (``\\boxed{`` x 4,000 took 13-18 s in env.step; 200 KB, about 11
    minutes). benchmarks/hostile_actions.py times them; here each gets the answer it should."""
    assert extract_boxed(fill("\\boxed{")) is None
    assert extract_boxed(fill("\\boxed{", "1}")) == "1"
    assert extract_boxed("\\boxed{" + fill("{")[7:]) is None
    assert extract_boxed("\\boxed{1}" + "x" * HOSTILE) is None  # over the cap: refused unread, like every parser
    assert "never closed" in parse_tag_calls(fill("<search>")).error
    assert parse_tag_calls(fill("<search>", "<answer>a</answer>")).calls == [{"name": "answer", "arguments": {"answer": "a"}}]
    assert "never closed" in parse_hermes_tool_calls(fill("<tool_call>")).error
    assert "never closed" in parse_code_blocks(fill("<code>")).error
    assert parse_code_blocks(fill("```py\n")).error
    assert parse_code_blocks(fill("```py\n```\n", "```python\nprint(1)\n```")).calls == [
        {"name": "python", "arguments": {"code": "print(1)\n"}}]


def test_a_call_list_is_bounded_by_its_symbols():
    """Python's parser takes about a second for 25,000 calls; a call list is refused past MAX_CALL_SYMBOLS."""
    ok = ", ".join(["f(a=1)"] * (MAX_CALL_SYMBOLS // 4 - 1))
    assert len(parse_python_calls(f"[{ok}]").calls) == MAX_CALL_SYMBOLS // 4 - 1
    error = parse_python_calls(fill("f(a=1), ")).error
    assert "symbols" in error and f"{MAX_CALL_SYMBOLS:,}" in error


def test_deep_nesting_is_an_error_not_a_crash():
    assert parse_python_calls("[f(a=" + "[" * 5000 + "]" * 5000 + ")]").error
    assert parse_json_calls("[" * 100_000 + "]" * 100_000).error


FRAGMENTS = st.sampled_from([
    "<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "```python\n", "```json\n",
    "```", "<code>", "</code>", "{", "}", "[", "]", "(", ")", '"name"', '"arguments"', ":", ",", "=", "f(",
    "a=1", '"x"', "None", "\\", "\n", "\x00", "😀", "-", "**", "lambda", "'", "1e999", "__import__",
])
TEXTS = st.one_of(st.text(max_size=300), st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=40).map("".join))


def _check_result(res):
    assert isinstance(res, ParseResult)
    assert res.error is None or not res.error.startswith("internal parser error"), res.error
    assert (res.error is None) == bool(res.calls) or res.error is not None
    for call in res.calls:
        assert isinstance(call["name"], str) and isinstance(call["arguments"], dict)


PARSERS = {"tags": parse_tag_calls, "hermes": parse_hermes_tool_calls, "json": parse_json_calls,
           "code": parse_code_blocks, "python_calls": parse_python_calls}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parsers_survive_fuzzing(name):
    parser = PARSERS[name]

    @settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(TEXTS)
    def run(text):
        _check_result(parser(text))

    run()
