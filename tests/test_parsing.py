import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.envs.parsing import (
    ParseResult,
    parse_code_blocks,
    parse_hermes_tool_calls,
    parse_json_calls,
    parse_python_calls,
    parse_tag_calls,
)


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
