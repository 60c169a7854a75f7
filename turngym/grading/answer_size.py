"""How large the numbers are that an answer asks sympy to build: the cheap check before grading.

math-verify evaluates numeric powers, factorials, Γ, binomials and bounded products exactly, so
``10^{10^{10}}``, ``(10^{6})!`` or ``\\Gamma(10^{9})`` would run for minutes (or exhaust memory)
before any comparison. :func:`unbounded_reason` reads the answer with a small recursive-descent
reader of the LaTeX arithmetic it contains, bounds the number of digits of every numeric
sub-expression, and names the first one past the limits. Symbols stay symbolic (``x^{100}`` is
cheap), and small towers are computed like any power (``2^{2^{2}}`` is 16). Linear in the
answer's length; an answer is at most ``MAX_ANSWER_CHARS`` long when it gets here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_DIGITS = 100_000  # 2^100000 has 30,103 digits: still cheap; a number with more digits is refused
MAX_FACTORIAL = 10_000  # 10000! has 35,660 digits
MAX_TERMS = 10_000  # terms of a \prod or \sum with numeric bounds
MAX_DEPTH = 100  # nested groups
EXACT = 1e15  # below this a value is carried as a float (exponents, factorial arguments, bounds)

_TOKEN = re.compile(r"\d+(?:\.\d+)?|\.\d+|\\[A-Za-z]+|\\.|\*\*|[A-Za-z]|\S")
# spacing, sizing and markup that carry no value (``\!`` is a negative space, not a factorial)
_SKIP = frozenset({"\\left", "\\right", "\\big", "\\Big", "\\bigg", "\\Bigg", "\\displaystyle", "\\limits",
                   "\\,", "\\;", "\\:", "\\!", "\\ ", "\\quad", "\\qquad", "$", "'", "|", "\\|", "\\lfloor",
                   "\\rfloor", "\\lceil", "\\rceil", "\\{", "\\}", "\\lvert", "\\rvert"})
_ADD = frozenset({"+", "-", "\\pm", "\\mp"})
_MUL = frozenset({"*", "\\cdot", "\\times", "/", "\\div", "\\choose"})
_NOT_ATOM = frozenset({*_ADD, *_MUL, "^", "**", "!", "_", "=", ",", ";", ":", "<", ">", ")", "}", "]", "\\le", "\\leq",
                       "\\ge", "\\geq", "\\ne", "\\neq", "\\lt", "\\gt", "\\approx", "\\sim", "\\equiv", "\\in",
                       "\\cup", "\\cap", "\\setminus", "\\to", "\\rightarrow", "\\Rightarrow", "\\implies", "\\iff",
                       "\\land", "\\lor", "\\wedge", "\\vee", "\\mid", "\\colon", "&", "\\\\"})
_OPEN = {"{": "}", "(": ")", "[": "]"}
_FRAC = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
_BINOM = frozenset({"\\binom", "\\dbinom", "\\tbinom"})
_LOG2 = math.log10(2)


class _Refused(Exception):
    pass


@dataclass(frozen=True)
class _Num:
    """A numeric sub-expression: ``lg`` bounds log10 of the largest integer sympy builds for it (its
    numerator or denominator); ``val`` is its value while it is below ``EXACT`` in size, else None."""

    lg: float
    val: float | None


def _num(lg: float, val: float | None, what: str) -> _Num:
    if not lg <= MAX_DIGITS:  # NaN too
        raise _Refused(f"{what} with more than {MAX_DIGITS:,} digits")
    if val is not None and not (math.isfinite(val) and abs(val) < EXACT):
        val = None
    return _Num(max(lg, 0.0), val)


def _literal(text: str) -> _Num:
    whole, _, frac = text.partition(".")
    whole = whole.lstrip("0") or "0"
    lg = (len(whole) - 1 + math.log10(int(whole[:15]) or 1) - (min(len(whole), 15) - 1)) + len(frac)
    return _num(lg, float(text) if len(whole) <= 15 else None, "a number")


def _add(a: _Num | None, b: _Num | None, sign: float) -> _Num | None:
    if a is None or b is None:
        return None
    val = a.val + sign * b.val if a.val is not None and b.val is not None else None
    return _num(max(a.lg, b.lg) + 1, val, "a sum")


def _mul(a: _Num | None, b: _Num | None) -> _Num | None:
    if a is None or b is None:
        return None
    val = a.val * b.val if a.val is not None and b.val is not None else None
    return _num(a.lg + b.lg, val, "a product")


def _div(a: _Num | None, b: _Num | None) -> _Num | None:
    if a is None or b is None:
        return None
    val = a.val / b.val if a.val is not None and b.val else None
    return _num(a.lg + b.lg, val, "a quotient")


def _pow(base: _Num | None, exp: _Num | None) -> _Num | None:
    if base is None or exp is None:
        return None  # a symbol stays symbolic; the numeric side was checked when it was read
    if base.val is not None and abs(base.val) in (0.0, 1.0):
        return base
    if exp.val is None:
        raise _Refused("a power whose exponent is above 10^15 (a power tower)")
    lg = abs(exp.val) * max(base.lg, _LOG2)
    try:
        val = base.val ** exp.val if base.val is not None and lg < 16 else None
    except (OverflowError, ZeroDivisionError):
        val = None
    return _num(lg, val if isinstance(val, float | int) else None, "a power")


def _factorial(n: _Num | None, what: str = "a factorial", shift: float = 0.0) -> _Num | None:
    if n is None:
        return None
    if n.val is None or n.val + shift > MAX_FACTORIAL:
        raise _Refused(f"{what} of more than {MAX_FACTORIAL:,}")
    m = n.val + shift
    if m < 0:
        return _Num(0.0, None)  # sympy: zoo or Γ of a negative non-integer, no big integer
    lg = math.lgamma(m + 1) / math.log(10)
    return _num(lg, math.gamma(m + 1) if lg < 15 else None, what)


def _binom(n: _Num | None, k: _Num | None) -> _Num | None:
    if n is None or k is None:
        return None
    if n.val is None:
        raise _Refused(f"a binomial coefficient with more than {MAX_DIGITS:,} digits")
    lg = abs(n.val) * _LOG2
    val = float(math.comb(int(n.val), int(k.val))) if lg < 15 and k.val is not None and n.val == int(n.val) \
        and k.val == int(k.val) and 0 <= k.val <= n.val else None
    return _num(lg, val, "a binomial coefficient")


class _Reader:
    """Recursive descent over the answer's tokens: expr := term (± term)*; term := unary ((·|/|implicit) unary)*;
    unary := -unary | power; power := atom !* (^ exponent)? !*; exponent := ±atom (^ exponent)?."""

    def __init__(self, text: str):
        self.toks = [t for t in _TOKEN.findall(text) if t not in _SKIP]
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        self.i += 1
        return self.toks[self.i - 1]

    def starts_atom(self) -> bool:
        t = self.peek()
        return t is not None and t not in _NOT_ATOM

    def sequence(self, close: str | None) -> _Num | None:
        """Expressions up to ``close`` (or the end), each checked; the value of the last one."""
        last = None
        while self.peek() is not None and self.peek() != close:
            start = self.i
            last = self.expr()
            if self.i == start:
                self.take()  # a separator (=, comma, a relation) or a stray closing bracket
                last = None
        if close is not None and self.peek() == close:
            self.take()
        return last

    def expr(self) -> _Num | None:
        value = self.term()
        while self.peek() in _ADD:
            sign = -1.0 if self.take() == "-" else 1.0
            value = _add(value, self.term(), sign)
        return value

    def term(self) -> _Num | None:
        value = self.unary()
        while True:
            t = self.peek()
            if t in _MUL:
                self.take()
                rhs = self.unary()
                value = _div(value, rhs) if t in ("/", "\\div") else _binom(value, rhs) if t == "\\choose" \
                    else _mul(value, rhs)
            elif self.starts_atom():
                value = _mul(value, self.power())
            else:
                return value

    def unary(self) -> _Num | None:
        if self.peek() in _ADD:
            self.take()
            return self.unary()  # the sign does not change the size
        return self.power()

    def postfix(self, value: _Num | None) -> _Num | None:
        while self.peek() == "!":
            self.take()
            value = _factorial(value)
        return value

    def power(self) -> _Num | None:
        value = self.postfix(self.atom())
        if self.peek() in ("^", "**"):
            self.take()
            value = self.postfix(_pow(value, self.exponent()))
        return value

    def exponent(self) -> _Num | None:
        if self.peek() in _ADD:
            self.take()
        value = self.atom()
        if self.peek() in ("^", "**"):  # right-associative: a^b^c = a^(b^c), the larger reading
            self.take()
            value = _pow(value, self.exponent())
        return value

    def group(self) -> _Num | None:
        close = _OPEN[self.take()]
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"groups nested more than {MAX_DEPTH} deep")
        start = self.i
        value = self.sequence(close)
        self.depth -= 1
        inner = self.toks[start:self.i - 1]
        return value if not any(t in (",", ";") for t in inner) else None  # a tuple or interval: no one number

    def atom(self) -> _Num | None:
        t = self.peek()
        if t is None or t in _NOT_ATOM:
            return None
        if t in _OPEN:
            return self.group()
        self.take()
        if t[0].isdigit() or t[0] == "." and len(t) > 1:
            return _literal(t)
        if t in _FRAC:
            return _div(self.atom(), self.atom())
        if t in _BINOM:
            return _binom(self.atom(), self.atom())
        if t == "\\sqrt":
            if self.peek() == "[":
                self.group()
            value = self.atom()
            return None if value is None else _Num(value.lg, math.sqrt(abs(value.val)) if value.val is not None else None)
        if t == "\\Gamma":
            return _factorial(self.atom(), "Γ", shift=-1.0)
        if t in ("\\prod", "\\sum"):
            return self.bounded(t)
        if t.startswith("\\") and self.peek() == "{":
            self.group()  # \text{...}, \mathrm{...}: read (and checked), but no number
        return None

    def bounded(self, kind: str) -> _Num | None:
        """``\\prod_{k=a}^{b} body`` / ``\\sum``: sympy evaluates term by term, so the count is bounded."""
        low = high = None
        if self.peek() == "_":
            self.take()
            low = self.group() if self.peek() in _OPEN else self.atom()
        if self.peek() in ("^", "**"):
            self.take()
            high = self.exponent()
        body = self.power()
        if low is None or high is None or low.val is None and high.val is None:
            return None
        if low.val is None or high.val is None or high.val - low.val + 1 > MAX_TERMS:
            name = "a product" if kind == "\\prod" else "a sum"
            raise _Refused(f"{name} of more than {MAX_TERMS:,} terms")
        count = max(0.0, high.val - low.val + 1)
        if kind == "\\prod" and body is not None:
            return _num(count * body.lg, None, "a product")
        return None


def unbounded_reason(answer: str) -> str | None:
    """Why grading ``answer`` would build a number too large to evaluate (time or memory), or None. Cheap."""
    try:
        _Reader(answer).sequence(None)
    except _Refused as exc:
        return str(exc)
    except RecursionError:
        return "an expression nested too deeply to read"
    except (ArithmeticError, ValueError):  # a reading this reader did not foresee: math-verify's time budget still holds
        return None
    return None
