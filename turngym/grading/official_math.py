"""The math answer keys TTRL votes on and EMPO clusters on, and TTRL's grader, as their code computes them.

TTRL (``PRIME-RL/TTRL`` at 3e2cc93, ``verl/verl/utils/reward_score/ttrl/``) votes on the string
``qwen/qwen_math_parser.py``'s ``extract_answer`` returns: the last ``\\boxed{}`` content passed through
``strip_string`` (lines 238-376), a Qwen2.5-Math normaliser that maps ``\\dfrac`` and ``\\tfrac`` to
``\\frac``, drops units, ``\\left``/``\\right``, dollars and percent signs, turns number words into digits and
``a/b`` into ``\\frac{a}{b}``. :func:`ttrl_answer` is that string for an env's extracted answer (turngym's
own implementation, tested case by case against the official one); an unanswered rollout's key is ``""``.
Each rollout is then checked against the label with ``qwen/math_grade.py``'s ``grade_answer`` (PRM800K's
grader): :func:`ttrl_equal` runs the ``mathruler`` package's ``grade_answer``, the same computation.

EMPO (``QingyangZhang/EMPO`` at c5eccd4, ``trl/src/open_r1/rewards.py`` lines 164-194) clusters the string
math-verify's ``parse`` extracts with EMPO's normalisation settings, after EMPO's ``normalize_prediction``
(lines 265-274); an answer math-verify cannot parse is ``""`` (no answer). :func:`empo_answer`.

Both run sympy, so they run in the math grader processes (:mod:`turngym.grading.math_answers`), bounded in
time and memory; an answer that times out twice gets no key (``None``) or no verdict (``None``).
"""

from __future__ import annotations

import re

from turngym.extras import require
from turngym.grading.math_answers import MAX_ANSWER_CHARS, GraderError, GraderPool, default_grader

# strip_string's unit words (qwen_math_parser.py lines 100-235), each also with a trailing "s". They go into
# a regular expression as written, so "." in "a ." matches any character, as in the official code.
_UNIT_WORDS = [
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .", "monkey", "prime",
    "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain", "ab", "way", "west",
    "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "a", "h", "no change", "men", "soldier", "pie", "bc",
    "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2", "sq",
    "mark", "l", "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "feet", "am", "pm", "hr",
    "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph", "day",
    "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp", "∏ cm ³", "hectare",
    "more", "sec", "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter",
    "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m", "s .", "metre",
    "meter", "inch",
]
_UNIT_PATTERNS = [re.compile(r"(^|\W)" + u + r"($|\W)") for u in _UNIT_WORDS + [u + "s" for u in _UNIT_WORDS]]

# (old, new) replacements strip_string applies in order, grouped as it groups them
_LATEX_ALIASES = (("tfrac", "frac"), ("dfrac", "frac"), ("\\neq", "\\ne"), ("\\leq", "\\le"), ("\\geq", "\\ge"),
                  ("\\left", ""), ("\\right", ""), ("\\{", "{"), ("\\}", "}"))
_DECORATIONS = (("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", ""))
_VARIABLE_PREFIXES = ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to")


def _word_number(text: str) -> str:
    """``convert_word_number`` (lines 91-96): the whole string read as number words, if it is one."""
    require("TTRL's and EMPO's math answer keys")
    from word2number import w2n

    try:
        return str(w2n.word_to_num(text))
    except Exception:  # noqa: BLE001 - word2number raises ValueError and others on anything that is not a number
        return text


def _brace_fracs(s: str) -> str:
    """``_fix_fracs`` (lines 37-66): ``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{72}`` → ``\\frac{1}{72}``; a
    ``\\frac`` followed by fewer than two characters leaves the whole string unchanged."""
    head, *tails = s.split("\\frac")
    out = [head]
    for tail in tails:
        if tail.startswith("{"):
            out.append("\\frac" + tail)
            continue
        if len(tail) < 2:
            return s
        num, den, rest = tail[0], tail[1], tail[2:]
        out.append("\\frac{" + num + "}" + (den + rest if den == "{" else "{" + den + "}" + rest))
    return "".join(out)


def _slash_to_frac(s: str) -> str:
    """``_fix_a_slash_b`` (lines 69-83): ``3/4`` → ``\\frac{3}{4}`` when both sides are plain integers as written
    (or contain ``sqrt``)."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = (p if "sqrt" in p else str(int(p)) for p in parts)
    except ValueError:
        return s
    return "\\frac{" + a + "}{" + b + "}" if f"{a}/{b}" == s else s


def qwen_strip_string(text: str) -> str:
    """TTRL's ``strip_string`` (``qwen_math_parser.py`` lines 238-376, ``skip_unit=False``), step by step."""
    s = str(text).strip().replace("\n", "").rstrip(".").replace("\\!", "")
    s = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", s)
    s = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", s).replace("bmatrix", "pmatrix")
    for old, new in _LATEX_ALIASES:
        s = s.replace(old, new)
    unit_free = re.sub(r"\\text{.*?}$", "", s).strip()  # a trailing \text{...} unit, unless it is everything
    if unit_free:
        s = unit_free
    for _ in range(2):
        for pattern in _UNIT_PATTERNS:
            cut = pattern.sub(r"\1\2", s)
            if cut:
                s = cut
    for old, new in _DECORATIONS:
        s = s.replace(old, new)
    s = _word_number(s)
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    for prefix in _VARIABLE_PREFIXES:
        s = s.replace(prefix, "")
    s = s.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    # (lines 318-329 strip enclosing brackets only from an alphanumeric string, which has none: no step)
    s = s.replace("infinity", "\\infty")
    if "\\infty" not in s:
        s = s.replace("inf", "\\infty")
    s = s.replace("+\\inity", "\\infty").replace("and", "").replace("\\mathbf", "")
    s = re.sub(r"\\mbox{.*?}", "", s)
    if "j" in s and "i" not in s:
        s = s.replace("j", "i")
    s = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", s)
    s = re.sub(r"(\d+)\.0*$", r"\1", s)
    if not s:
        return s
    if s.startswith("."):
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", s).replace(" ", "")
    return _slash_to_frac(_brace_fracs(s))


def ttrl_answer(answer: str | None) -> str:
    """The string TTRL votes with for a rollout whose last ``\\boxed{}`` holds ``answer`` (``extract_answer``,
    ``qwen_math_parser.py`` lines 486-554: newlines dropped, a leading ``:`` and a trailing ``.`` or ``/``
    cut, then :func:`qwen_strip_string`). ``None`` (no answer) votes ``""``."""
    if answer is None:
        return ""
    if len(str(answer)) > MAX_ANSWER_CHARS:  # past the grader's cap the answer is wrong whatever its key; its own
        return str(answer)  # text keeps identical long answers together without the normaliser's backtracking regexes
    s = re.sub(r"\n\s*", "", str(answer).replace("\u043a\u0438", ""))
    s = s[1:] if s.startswith(":") else s
    s = s[:-1] if s.endswith(".") else s
    s = s[:-1] if s.endswith("/") else s
    return qwen_strip_string(s)


def _ask(payload: dict, timeout_s: float, grader: GraderPool | None) -> dict | None:
    """One request on a math grader, tried once more on a fresh one after a timeout or crash; None: no reply."""
    require("TTRL's and EMPO's math answer keys")
    pool = grader or default_grader()
    for _ in range(2):
        try:
            reply = pool.request(payload, timeout_s)
        except GraderError:
            continue
        if not reply.get("resource"):
            return reply
    return None


def ttrl_equal(answer: str, label: str, timeout_s: float = 5.0, grader: GraderPool | None = None) -> bool | None:
    """TTRL's check of a rollout's key against the voted label (``qwen_eval.py`` line 13: PRM800K's
    ``grade_answer(answer, label)``). Equal strings are equal, as that grader decides before any sympy work;
    anything else goes to a grader process, ``""`` included (the grader calls ``""`` equal to a label it
    normalises to nothing, such as ``\\cotx``). None: no verdict (timed out)."""
    if answer == label:
        return True
    reply = _ask({"op": "prm800k", "pred": answer, "golds": [label]}, timeout_s, grader)
    return None if reply is None or "ok" not in reply else bool(reply["ok"])


def empo_answer(answer: str | None, timeout_s: float = 5.0, grader: GraderPool | None = None) -> str | None:
    """The string EMPO clusters for a rollout whose last ``\\boxed{}`` holds ``answer``: math-verify's
    ``parse`` with EMPO's settings, its last element (the extracted LaTeX, normalised: ``\\dfrac`` → ``\\frac``,
    units and ``\\left``/``\\right`` dropped), then ``normalize_prediction``; ``""`` when there is no answer or
    math-verify extracts nothing. None: no key (the parse timed out twice)."""
    if answer is None or not str(answer).strip():
        return ""
    reply = _ask({"op": "empo_key", "pred": str(answer), "golds": []}, timeout_s, grader)
    return None if reply is None or "key" not in reply else str(reply["key"])
