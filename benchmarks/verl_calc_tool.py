"""The calculator as a verl function tool (``multi_turn.function_tool_path``) for benchmarks/verl_agent_loop.py:
verl's ToolAgentLoop calls it where turngym's Calculator-v0 runs the same ``safe_arith``."""

from __future__ import annotations

from verl.tools.function_tool import function_tool

from turngym.envs.calculator import safe_arith


@function_tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / and parentheses.
    """
    return f"<result>{safe_arith(expression)}</result>"
