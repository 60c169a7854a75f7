"""TTRL's and EMPO's math answer keys and TTRL's grader (turngym.grading.official_math) on the cases where
they differ from the raw strings. Expected values are what the official code returns, line by line:

- TTRL: ``PRIME-RL/TTRL`` at 3e2cc9376dc7486256f6021b37c4353d0e1abe2b,
  ``verl/verl/utils/reward_score/ttrl/qwen/qwen_math_parser.py`` (``strip_string`` lines 238-376,
  ``extract_answer`` lines 486-554) and ``qwen/math_grade.py`` (``grade_answer`` lines 234-286).
- EMPO: ``QingyangZhang/EMPO`` at c5eccd400ba7a7a1685dedf25eab03780aad855f, ``trl/src/open_r1/rewards.py``
  (the parse settings lines 164-182, the last element lines 184-190, ``normalize_prediction`` lines 265-274).

``benchmarks/official_votes.py --keys`` runs the official code on every math answer turngym ships, written six
ways (11,274 strings): every TTRL key and every EMPO key is the same (docs/faithfulness.md).
"""

import pytest

from turngym.grading.official_math import empo_answer, qwen_strip_string, ttrl_answer, ttrl_equal


@pytest.mark.parametrize(("answer", "key", "line"), [
    (r"\dfrac{1}{2}", r"\frac{1}{2}", "258-259: dfrac and tfrac become frac"),
    (r"\tfrac{1}{2}", r"\frac{1}{2}", "258-259"),
    (r"\frac12", r"\frac{1}{2}", "371 (_fix_fracs, 37-66)"),
    ("1/2", r"\frac{1}{2}", "374 (_fix_a_slash_b, 69-83)"),
    ("03/4", "03/4", "79: the assert fails when int() changes the text"),
    (r"3\text{ cm}", "3", "273-276: a trailing \\text{} unit"),
    ("12 inches", "12", "280-286: unit words"),
    ("x=3", "3", "302-303: x= removed"),
    ("k = 4", "4", "363-365: a short left side of one = dropped"),
    (r"\left( 1,2 \right)", "(1,2)", "267-268 and 368: \\left, \\right and spaces"),
    (r"\{1,2\}", "{1,2}", "269-270"),
    ("5%", "5", "308-310"),
    (r"10^\circ", "10", "289-290"),
    (r"\$5.00", "5", "293-294 and 353-354: dollars, then a.000 → a"),
    ("seven", "7", "298: convert_word_number"),
    ("one half", "1", "298: word2number reads the first number word"),
    (".5", "0.5", "359-360"),
    ("infinity", r"\infty", "332"),
    ("3 and 4", "34", "338: 'and' removed, then the spaces"),
    (r"\sqrt2", r"\sqrt{2}", "367 (_fix_sqrt, 86-88)"),
    ("2j+1", "2i+1", "349-350: j is i when there is no i"),
    ("2,000", "2,000", "commas stay"),
    (r"\emptyset", "{}", "304"),
])
def test_ttrl_key_is_strip_string(answer, key, line):
    assert ttrl_answer(answer) == key, line


def test_ttrl_key_of_extract_answer_and_no_answer():
    # extract_answer (lines 546-553): newlines dropped, a leading ':' and trailing '.' and '/' cut
    assert ttrl_answer("\n3\n") == "3" and ttrl_answer(":5") == "5" and ttrl_answer("4/") == "4"
    assert ttrl_answer("3.") == "3"
    # a rollout without an answer votes "" (extract_answer's fallback returns "", line 532)
    assert ttrl_answer(None) == "" and ttrl_answer("") == ""
    assert qwen_strip_string("  7 \n") == "7"


def test_ttrl_grader_is_prm800k():
    """qwen_eval.py line 13: ``grade_answer(extract_answer(output), label)``, PRM800K's grader."""
    assert ttrl_equal("0.5", r"\frac{1}{2}") is True        # sympy: (1/2) - (0.5) = 0 (math_grade.py 283)
    assert ttrl_equal(r"\frac{2}{4}", r"\frac{1}{2}") is False  # unreduced fractions must match (275-278)
    assert ttrl_equal("3", "3.5") is False
    assert ttrl_equal("", "") is True                        # both normalise to "" (248-249): "" votes win too
    assert ttrl_equal("3", "") is False and ttrl_equal("", "3") is False
    # "\\cotx" normalises to "" (latex2text drops the unknown macro, math_grade.py 37 and 155): an
    # unanswered rollout is graded equal to it, as in the official code
    assert ttrl_equal("", r"\cotx") is True


@pytest.mark.parametrize(("answer", "key"), [
    (r"\dfrac{1}{2}", r"\frac{1}{2}"),      # math-verify's basic_latex normalisation
    (r"\tfrac{1}{2}", r"\frac{1}{2}"),
    (r"3\text{ cm}", "3"),                  # units=True
    (r"\left( 1,2 \right)", "( 1,2 )"),     # \left, \right dropped, spaces kept
    ("(1,2)", "(1,2)"),
    (r"\text{Paris}", "Paris"),             # normalize_prediction strips \text{} (line 271)
    (r"\frac12", r"\frac12"),
    ("1/2", "1/2"),
    ("5%", "5%"),
    ("", ""),
    (None, ""),
])
def test_empo_key_is_math_verify_parse(answer, key):
    assert empo_answer(answer) == key
