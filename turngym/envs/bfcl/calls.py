"""Decode model output into BFCL calls, and refuse what bfcl-eval would evaluate unsafely.

Two tool formats:

* ``prompting``: BFCL's own format, ``[func(arg=val), ...]``, decoded by bfcl-eval's
  ``default_decode_ast_prompting`` / ``default_decode_execute_prompting`` (Python, or
  tree-sitter for Java and JavaScript).
* ``native``: Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks, as chat templates with ``tools=`` ask for. Decoded to the same
  ``[{name: {arg: value}}]`` shape bfcl-eval's function-calling handlers produce.

bfcl-eval trusts model output in two places: its Python decoder ``eval``\\ s any binary
operation it meets in an argument (``x=__import__('os').system('...') + 1``), and its
multi-turn executor ``eval``\\ s the re-encoded call string in a module that has
``importlib`` and ``inspect`` in scope (``{'inspect.os.system': {...}}`` decodes into a
nested call). :func:`unsafe_arithmetic` and :func:`guard_execution` refuse exactly those
shapes before bfcl-eval sees them; every benign output gets bfcl-eval's own verdict.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from turngym.envs.bfcl.upstream import bfcl
from turngym.envs.parsing import MAX_INPUT_CHARS, parse_hermes_tool_calls, too_many_call_symbols

TOOL_FORMATS = ("prompting", "native")
_MAX_POW_EXPONENT = 64
_SAFE_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


@dataclass
class Decoded:
    """One model step decoded: the calls, or why there are none."""

    calls: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None

    @property
    def has_calls(self) -> bool:
        return self.error is None and bool(self.calls)


# ------------------------------------------------------------------ safety of the Python decoder


def _is_safe_arithmetic(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex, str))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_safe_arithmetic(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, _SAFE_BINOPS):
        if not (_is_safe_arithmetic(node.left) and _is_safe_arithmetic(node.right)):
            return False
        strings = [isinstance(n, ast.Constant) and isinstance(n.value, str) for n in (node.left, node.right)]
        if any(strings) and not isinstance(node.op, ast.Add):  # 'a' * 10**9 would exhaust memory
            return False
        if isinstance(node.op, ast.Pow):
            exp = node.right
            return isinstance(exp, ast.Constant) and isinstance(exp.value, (int, float)) \
                and abs(exp.value) <= _MAX_POW_EXPONENT and not isinstance(node.left, ast.BinOp)
        return True
    return False


def _wrap_like_bfcl(text: str) -> str:
    """The string bfcl-eval's prompting decoder hands to ``ast.parse``."""
    text = text.strip("`\n ")
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    return text.strip().strip("'")


def unsafe_arithmetic(text: str) -> str | None:
    """Why bfcl-eval's Python decoder must not see ``text``, or None when it may."""
    try:
        tree = ast.parse(_wrap_like_bfcl(text), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the decoder fails in ast.parse too, before evaluating anything
    queue = deque([tree])
    while queue:  # ast.walk's order, but one check covers all of an expression's operands (linear, not quadratic)
        node = queue.popleft()
        if isinstance(node, ast.BinOp):
            try:
                safe = _is_safe_arithmetic(node)
            except RecursionError:
                return "refused to evaluate an expression nested too deeply"
            if not safe:
                return f"refused to evaluate the expression {ast.unparse(node)[:80]!r} (only literal arithmetic)"
            continue
        queue.extend(ast.iter_child_nodes(node))
    return None


# ------------------------------------------------------------------ decoding


def decode_prompting(text: str, language: str = "python", execute: bool = False) -> Decoded:
    """BFCL's prompting decoder; ``execute`` gives call strings for the multi-turn executor."""
    if len(text) > MAX_INPUT_CHARS:
        return Decoded(error=f"action is {len(text)} characters; the limit is {MAX_INPUT_CHARS}")
    too_many = too_many_call_symbols(text)  # bfcl-eval's decoders parse it whole: bounded first
    if too_many:
        return Decoded(error=too_many)
    mods = bfcl()
    utils = mods["handler_utils"]
    fmt = mods["enums"].ReturnFormat
    if language == "python":
        reason = unsafe_arithmetic(text)
        if reason:
            return Decoded(error=reason)
    try:
        if execute:
            return Decoded(calls=utils.default_decode_execute_prompting(text))  # type: ignore[arg-type]
        return_format = {"python": fmt.PYTHON, "java": fmt.JAVA, "javascript": fmt.JAVASCRIPT}[language]
        return Decoded(calls=utils.default_decode_ast_prompting(text, return_format))
    except Exception as exc:  # noqa: BLE001 - any decoder failure means "no decodable call", as in BFCL
        return Decoded(error=f"{type(exc).__name__}: {exc}"[:300])


def decode_native(text: str, name_map: dict[str, str] | None = None) -> Decoded:
    """Hermes ``<tool_call>`` JSON blocks (turngym's shared parser); no block means the model answered in text."""
    if "<tool_call>" not in text:
        return Decoded(error="no <tool_call> block")
    parsed = parse_hermes_tool_calls(text)
    if not parsed.ok:
        return Decoded(error=f"a <tool_call> block is not valid JSON for a call: {parsed.error}")
    return Decoded(calls=[{(name_map or {}).get(c["name"], c["name"]): c["arguments"]} for c in parsed.calls])


def native_execution_strings(calls: list[dict[str, dict[str, Any]]]) -> list[str]:
    """bfcl-eval's function-calling handlers' re-encoding: ``name(k=repr(v), ...)``."""
    return bfcl()["handler_utils"].convert_to_function_call(calls)


def calls_from_strings(call_strings: Iterable[str],
                       params: Callable[[str], list[str]] | None = None) -> list[dict[str, dict[str, Any]]]:
    """Ground-truth call strings (``f(a=1)``) as decoded calls.

    Some ground truths pass arguments by position (``sort('report.pdf')``); BFCL's
    decoder keeps keyword arguments only, so ``params(name)`` (the function's parameter
    names, in order) turns them into keywords, as a model has to write them.
    """
    out = []
    for s in call_strings:
        node = ast.parse(s, mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError(f"not a plain call: {s!r}")
        args = {}
        if node.args:
            if params is None:
                raise ValueError(f"{s!r} has positional arguments; pass params= to name them")
            names = params(node.func.id)
            args.update({names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)})
        args.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
        out.append({node.func.id: args})
    return out


def render_prompting(calls: list[dict[str, dict[str, Any]]]) -> str:
    """Calls in BFCL's prompting format, ``[f(a=1), g(b='x')]``."""
    parts = [f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for c in calls for name, args in c.items()]
    return "[" + ", ".join(parts) + "]"


# ------------------------------------------------------------------ safety of the executor


def _safe_value(node: ast.AST, methods: frozenset[str]) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _safe_value(node.operand, methods)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_safe_value(e, methods) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _safe_value(k, methods) for k in node.keys) and \
            all(_safe_value(v, methods) for v in node.values)
    if isinstance(node, ast.Call):  # a nested backend call, which bfcl-eval also executes
        return _safe_call(node, methods) is None
    return False


def _safe_call(node: ast.AST, methods: frozenset[str]) -> str | None:
    if not isinstance(node, ast.Call):
        return "not a function call"
    if not isinstance(node.func, ast.Name):
        return f"{ast.unparse(node.func)[:60]!r} is not one of this task's functions"
    if node.func.id not in methods:
        return f"name '{node.func.id}' is not defined"
    if node.args:
        return "positional arguments are not allowed"
    for kw in node.keywords:
        if kw.arg is None or not _safe_value(kw.value, methods):
            return f"argument {kw.arg!r} of {node.func.id} is not a literal value"
    return None


def guard_execution(call: str, methods: frozenset[str]) -> str | None:
    """Why the call string must not reach bfcl-eval's ``eval``, or None when it may."""
    try:
        tree = ast.parse(call, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"cannot parse {call[:60]!r}: {type(exc).__name__}"
    return _safe_call(tree.body, methods)
