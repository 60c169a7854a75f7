"""Calculator-v0: a tiny built-in tool env (arithmetic with a ``<calc>`` tool).

It needs no data files or services, so it is what ``turngym play`` and the tests use
before a benchmark env is installed, and a task where the right behaviour is known
(call the calculator, then answer) for checking that training moves rewards.
"""

from __future__ import annotations

import ast
import functools
import operator
from typing import Any

import numpy as np

from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.parsing import parse_tag_calls
from turngym.envs.tools import EnvTool, ToolParam, tag_action
from turngym.episode import RewardNeeds

NUM_ITEMS = 10_000
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

SYSTEM = (
    "You solve arithmetic problems. To compute, write <{tag}>expression</{tag}> and wait "
    "for the result. When you know the answer, write <answer>number</answer>."
)


def safe_arith(expr: str) -> int | float:
    """Evaluate + - * / and parentheses over numbers; anything else is a ValueError."""
    if len(expr) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            if abs(node.value) > 1e12:
                raise ValueError("number too large")
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = ev(node.right)
            if right == 0:
                raise ValueError("division by zero")
            return ev(node.left) / right
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        raise ValueError("only numbers, + - * / and parentheses are allowed")

    return ev(tree.body)


def _format_number(x: int | float) -> str:
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return str(x) if isinstance(x, int) else f"{x:.6g}"


@functools.lru_cache(maxsize=NUM_ITEMS)
def _operands(index: int) -> tuple[int, int, int]:
    """Item ``index``'s three numbers: a pure function of the index, kept once drawn (making the generator
    cost more than the rest of a reset)."""
    a, b, c = (int(v) for v in np.random.default_rng(index).integers(2, 99, size=3))
    return a, b, c


class CalculatorEnv(TextEnv):
    prompt_styles = ("chat", "base")
    env_name = "turngym/Calculator-v0"
    dataset_name = "calculator"
    observation_role = None
    calc_tag = "calc"  # the calculator's tag: its prompt, stop string, parser and declared tool all read it
    stop = ("</calc>", "</answer>")
    reward_needs = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",))
    # the calculation ran; also the metric toolcall_dense reads, so credit against it is circular for that reward
    truth_keys = ("tool_ok",)

    def __init__(self, max_turns: int = 4, prompt_style: str = "chat", render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if prompt_style not in self.prompt_styles:
            raise ValueError(f"prompt_style must be 'chat' or 'base', got {prompt_style!r}")
        self.prompt_style = prompt_style
        self.stop = (f"</{self.calc_tag}>", "</answer>")

    def num_items(self) -> int:
        return NUM_ITEMS

    def declared_tools(self) -> tuple[EnvTool, ...]:
        return (EnvTool("calculator", "Evaluate an arithmetic expression over numbers with + - * / and parentheses.",
                        (ToolParam("expression", str, 'The expression to evaluate, for example "84 * 63 + 51".'),),
                        tag_action(self.calc_tag, "expression")),
                EnvTool("answer", "Give the final answer to the question; this ends the episode.",
                        (ToolParam("answer", str, "The final answer, a number."),), tag_action("answer", "answer"),
                        ends_episode=True))

    def get_item(self, index: int) -> dict[str, Any]:
        a, b, c = _operands(index)
        question = f"What is {a} * {b} + {c}?"
        return {"dataset": "calculator", "split": "test", "index": index, "id": f"calc-{index}",
                "question": question, "answers": [str(a * b + c)]}

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        system = SYSTEM.format(tag=self.calc_tag)
        if self.prompt_style == "base":
            return [{"role": "user", "content": f"{system}\n\nQuestion: {task['question']}\nAnswer:"}]
        return [{"role": "system", "content": system}, {"role": "user", "content": task["question"]}]

    def act(self, action: str) -> ActionResult:
        parsed = parse_tag_calls(action, tags=(self.calc_tag, "answer"))
        if parsed.error:
            return ActionResult(
                observation=f"\n<error>{parsed.error}</error>\n", parse_error=parsed.error,
                metrics={"valid_action": False},
            )
        call = parsed.calls[0]  # the first complete tag is what the agent did this turn
        if call["name"] == "answer":
            return ActionResult(observation=None, tool_calls=[call], terminated=True,
                                final_answer=call["arguments"]["answer"], metrics={"valid_action": True})
        try:
            value = _format_number(safe_arith(call["arguments"]["text"]))
            return ActionResult(observation=f"\n<result>{value}</result>\n", tool_calls=[call],
                                metrics={"valid_action": True, "tool_ok": True}, truth={"tool_ok": True})
        except (ValueError, OverflowError) as exc:
            return ActionResult(observation=f"\n<error>{exc}</error>\n", tool_calls=[call],
                                metrics={"valid_action": True, "tool_ok": False}, truth={"tool_ok": False})

    def grade(self, episode) -> dict[str, Any]:
        pred = (episode.final_answer or "").strip().replace(",", "")
        correct = False
        try:
            correct = any(abs(float(pred) - float(a)) < 1e-9 for a in episode.task.get("answers", []))
        except ValueError:
            correct = False
        return {"correct": correct}
