"""Tool-call parsers for the formats agents write. None of them raises.

Every parser returns a :class:`ParseResult`: the calls it decoded (``{"name", "arguments"}``)
and, when something was malformed, an ``error`` sentence the env shows the agent. An
unexpected internal failure is also turned into an error (prefixed ``internal parser
error``) rather than an exception, so a hostile string can never crash an episode.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turngym.episode import MAX_ACTION_CHARS

MAX_INPUT_CHARS = MAX_ACTION_CHARS  # the parsers read no longer action
# Python's parser takes ~40 µs per call of a call list, so a list of calls is bounded by its symbols (a call
# or list item needs at least one): an action at the cap made of ``f(a=1), `` would take a second to parse
MAX_CALL_SYMBOLS = 2_000
_CALL_SYMBOLS = ",()[]{}=+-*/%<>&|^~'\":@."


@dataclass
class ParseResult:
    calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _never_raises(fn: Callable[..., ParseResult]) -> Callable[..., ParseResult]:
    @functools.wraps(fn)
    def wrapper(text: Any, *args: Any, **kwargs: Any) -> ParseResult:
        if not isinstance(text, str):
            return ParseResult(error=f"expected text, got {type(text).__name__}")
        if len(text) > MAX_INPUT_CHARS:
            return ParseResult(
                error=f"action is {len(text)} characters; the limit is {MAX_INPUT_CHARS}"
            )
        try:
            return fn(text, *args, **kwargs)
        except RecursionError:
            return ParseResult(error="call is nested too deeply to parse")
        except Exception as exc:  # noqa: BLE001 - the contract is: never raise
            return ParseResult(error=f"internal parser error: {type(exc).__name__}: {exc}")

    return wrapper


# ------------------------------------------------------------------ tag spans


def tag_spans(text: str, tags: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(tag, inner text)`` of each closed ``<tag>...</tag>``, in order (see :func:`tag_matches`)."""
    return [(name, body) for _, name, body in tag_matches(text, tags)]


def tag_matches(text: str, tags: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """``(start, tag, inner text)`` of each closed ``<tag>...</tag>`` in order, as
    ``re.finditer(r"<(a|b)>(.*?)</\\1>", text, re.DOTALL)`` reads them, in linear time.

    That regex is quadratic on a text of many opened tags that never close (each one is scanned
    to the end). Here ``str.find`` gives each tag's next opening; the earliest one is closed by the
    first matching closing tag after it, and a tag with no closing tag after an opening can match
    nowhere later, so it is dropped. The text is not capped here: callers read actions within
    ``MAX_ACTION_CHARS``."""
    markers = _markers(tuple(tags))
    nxt = {t: i for t, (opening, _) in markers.items() if (i := text.find(opening)) >= 0}
    spans: list[tuple[int, str, str]] = []
    pos = 0
    while nxt:
        tag = min(nxt, key=nxt.__getitem__)  # the regex's leftmost match (two tags never start at one place)
        start = nxt[tag]
        body = start + len(tag) + 2
        close = text.find(markers[tag][1], body)
        if close < 0:
            del nxt[tag]
            continue
        spans.append((start, tag, text[body:close]))
        pos = close + len(tag) + 3
        for t, i in list(nxt.items()):
            if i < pos:
                j = text.find(markers[t][0], pos)
                if j < 0:
                    del nxt[t]
                else:
                    nxt[t] = j
    return spans


@functools.lru_cache(maxsize=64)
def _markers(tags: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Each tag's opening and closing marker, once per tag set (an env's tags are a constant)."""
    return {t: (f"<{t}>", f"</{t}>") for t in dict.fromkeys(tags)}


# ------------------------------------------------------------------ tag calls


_TAG_ARGUMENT = {"search": "query", "answer": "answer"}


@_never_raises
def parse_tag_calls(text: str, tags: tuple[str, ...] = ("search", "answer")) -> ParseResult:
    """``<search>q</search>`` / ``<answer>a</answer>``: each closed tag is a call whose
    argument is the stripped inner text, in order of appearance."""
    if not tags:
        return ParseResult(error="no tags configured")
    names = "|".join(re.escape(t) for t in tags)
    calls = [{"name": name, "arguments": {_TAG_ARGUMENT.get(name, "text"): body.strip()}}
             for name, body in tag_spans(text, tags)]
    if calls:
        return ParseResult(calls=calls)
    opened = re.search(rf"<({names})>", text)
    if opened:
        return ParseResult(error=f"<{opened.group(1)}> is opened but never closed with </{opened.group(1)}>")
    return ParseResult(error="no tool call found; use " + " or ".join(f"<{t}>...</{t}>" for t in tags))


# ------------------------------------------------------------------ JSON calls


def _normalise_call(obj: Any) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"a call must be a JSON object, got {type(obj).__name__}"
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI wire shape
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, 'a call needs a non-empty string "name"'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f'"arguments" of {name} is a string that is not JSON: {exc.msg}'
    if not isinstance(args, dict):
        return None, f'"arguments" of {name} must be an object, got {type(args).__name__}'
    return {"name": name, "arguments": args}, None


def _decode_calls(payload: str) -> ParseResult:
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as exc:
        return ParseResult(error=f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
    items = obj if isinstance(obj, list) else [obj]
    calls = []
    for item in items:
        call, err = _normalise_call(item)
        if err:
            return ParseResult(error=err)
        calls.append(call)
    if not calls:
        return ParseResult(error="empty list of calls")
    return ParseResult(calls=calls)


@_never_raises
def parse_hermes_tool_calls(text: str, open_at_end: bool = False) -> ParseResult:
    """Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one or more).

    ``open_at_end=True`` also reads a last ``<tool_call>`` left open to the end of the text, as
    vLLM's Hermes tool parser does (``<tool_call>(.*?)</tool_call>|<tool_call>(.*)``); the default
    needs every block closed."""
    blocks = [body for _, body in tag_spans(text, ("tool_call",))]
    tail = text[text.rfind("</tool_call>") + len("</tool_call>"):] if blocks else text
    if open_at_end and "<tool_call>" in tail:
        blocks.append(tail[tail.index("<tool_call>") + len("<tool_call>"):])
    if not blocks:
        if "<tool_call>" in text:
            return ParseResult(error="<tool_call> is opened but never closed with </tool_call>")
        return ParseResult(error="no <tool_call>...</tool_call> block found")
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks, start=1):
        res = _decode_calls(block.strip())
        if res.error:
            return ParseResult(calls=calls, error=f"tool call {i}: {res.error}")
        calls.extend(res.calls)
    return ParseResult(calls=calls)


_FENCE_JSON = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)


@_never_raises
def parse_json_calls(text: str) -> ParseResult:
    """A fenced ```json block, or a bare JSON object / list making up the message."""
    fenced = _FENCE_JSON.search(text)
    if fenced:
        return _decode_calls(fenced.group(1).strip())
    stripped = text.strip()
    if stripped[:1] in "{[":
        return _decode_calls(stripped)
    start = min((i for i in (stripped.find("{"), stripped.find("[")) if i >= 0), default=-1)
    if start < 0:
        return ParseResult(error="no JSON call found")
    decoder = json.JSONDecoder()
    try:
        obj, _ = decoder.raw_decode(stripped[start:])
    except json.JSONDecodeError as exc:
        return ParseResult(error=f"invalid JSON: {exc.msg}")
    return _decode_calls(json.dumps(obj))


# ------------------------------------------------------------------ code blocks

_CODE_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_FENCE_LINES = re.compile(r"^\s*```(?:python|py)?\s*\n|\n?```\s*$")  # a fence line left inside a block


@_never_raises
def parse_code_blocks(text: str) -> ParseResult:
    """```python fences and ``<code>`` tags, in order; each is a ``python`` call."""
    tagged = tag_matches(text, ("code",)) if "<code>" in text else []
    if tagged:  # both kinds, in order of appearance
        spans = [(m.start(), m.group(1)) for m in _CODE_FENCE.finditer(text)] + [(s, b) for s, _, b in tagged]
        codes = [code for _, code in sorted(spans, key=lambda s: s[0])]
    else:
        codes = _CODE_FENCE.findall(text)
    calls = []
    for code in codes:
        if not code or code.isspace():
            continue  # an empty block (cheap to skip: a hostile action may hold tens of thousands)
        code = _FENCE_LINES.sub("", code)
        if code.strip():
            calls.append({"name": "python", "arguments": {"code": code}})
    if calls:
        return ParseResult(calls=calls)
    if re.search(r"```(?:python|py)", text, re.IGNORECASE) or "<code>" in text:
        return ParseResult(error="a code block is opened but never closed (or is empty)")
    return ParseResult(error="no ```python code block found")


# ------------------------------------------------------------------ python call lists


def too_many_call_symbols(text: str) -> str | None:
    """Why a Python call list is refused unread (more than ``MAX_CALL_SYMBOLS`` brackets, commas, operators,
    quotes), or None. Counted with ``str.count``, so deciding costs a few linear passes in C."""
    n = sum(map(text.count, _CALL_SYMBOLS))
    if n > MAX_CALL_SYMBOLS:
        return (f"the call list has {n:,} symbols (brackets, commas, operators, quotes); the limit is "
                f"{MAX_CALL_SYMBOLS:,}")
    return None


class _CallSyntaxError(ValueError):
    pass


def _literal(node: ast.AST) -> Any:
    """Python literal arguments, as BFCL's decoder accepts them (no evaluation of code)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals = [_literal(e) for e in node.elts]
        return tuple(vals) if isinstance(node, ast.Tuple) else vals
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _CallSyntaxError("dict unpacking (**) is not allowed in arguments")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        val = _literal(node.operand)
        if not isinstance(val, (int, float, complex)) or isinstance(val, bool):
            raise _CallSyntaxError("sign applied to a non-number")
        return -val if isinstance(node.op, ast.USub) else val
    if isinstance(node, ast.Name):  # BFCL keeps bare identifiers as strings
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node)
    raise _CallSyntaxError(f"argument is not a literal value: {ast.dump(node)[:80]}")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise _CallSyntaxError("function name must be a dotted identifier")


def _call_from_node(node: ast.AST) -> dict[str, Any]:
    if not isinstance(node, ast.Call):
        raise _CallSyntaxError("each list item must be a function call like f(a=1)")
    if node.args:
        raise _CallSyntaxError(f"{_dotted(node.func)}: pass arguments by keyword (name=value)")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise _CallSyntaxError(f"{_dotted(node.func)}: **kwargs is not allowed")
        args[kw.arg] = _literal(kw.value)
    return {"name": _dotted(node.func), "arguments": args}


@_never_raises
def parse_python_calls(text: str) -> ParseResult:
    """BFCL prompting format: ``[f(a=1), g(b="x")]`` (brackets optional for one call)."""
    src = text.strip()
    fenced = re.search(r"```(?:python|py)?[ \t]*\n(.*?)```", src, re.DOTALL)
    if fenced:
        src = fenced.group(1).strip()
    if not src:
        return ParseResult(error="empty action: no function call")
    if not src.startswith("["):
        src = f"[{src}]"
    too_many = too_many_call_symbols(src)
    if too_many:
        return ParseResult(error=too_many)
    try:
        with warnings.catch_warnings():  # odd escapes in agent text are not our warning to print
            warnings.simplefilter("ignore")
            tree = ast.parse(src, mode="eval")
    except SyntaxError as exc:
        return ParseResult(error=f"not a valid call list: {exc.msg}")
    except ValueError as exc:  # e.g. null bytes
        return ParseResult(error=f"not a valid call list: {exc}")
    body = tree.body
    if not isinstance(body, (ast.List, ast.Tuple)):
        return ParseResult(error="expected a list of calls like [f(a=1), g(b=2)]")
    try:
        calls = [_call_from_node(el) for el in body.elts]
    except _CallSyntaxError as exc:
        return ParseResult(error=str(exc))
    if not calls:
        return ParseResult(error="empty list of calls")
    return ParseResult(calls=calls)


