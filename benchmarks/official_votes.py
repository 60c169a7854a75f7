"""TTRL's and EMPO's official reward code beside turngym's ``ttrl`` and ``empo`` on generated math groups.

Usage: ``python benchmarks/official_votes.py --ttrl CHECKOUT --empo CHECKOUT [--groups 200] [--seeds 1 2 3]``
with clones of ``PRIME-RL/TTRL`` and ``QingyangZhang/EMPO``. Their modules are imported from the clones (nothing
of theirs is copied here); the imports they make that these functions never call (``latex2sympy2``, ``wandb``,
``rouge``) are given empty stand-ins. Each group is K = 8 responses ending in ``\\boxed{answer}`` (an unanswered
one has no box and no number), answers drawn from a MATH500 problem's answer and another problem's, each
written as is or with ``\\dfrac``, ``\\tfrac``, ``$…$``, a trailing ``.`` or ``\\text{ units}``, 15% unanswered.
Prints, per seed, how many groups get exactly the official rewards under turngym's defaults and each option.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import types
from pathlib import Path

from turngym.episode import Episode, RewardNeeds, Turn
from turngym.rewards import get_reward

K = 8
MATH = RewardNeeds(answer_kind="math", answer_cue="boxed")
OPTIONS = {
    "ttrl": {"default": {}, "unanswered=abstain": {"unanswered": "abstain"}, "equivalence=math": {"equivalence": "math"},
             "earlier default": {"normalise": "none", "unanswered": "abstain", "equivalence": "auto"}},
    "empo": {"default": {}, "normalise=none (earlier default)": {"normalise": "none"},
             "cluster_on=equivalence": {"cluster_on": "equivalence"}},
}


def stand_ins() -> Path:
    """Empty modules for imports the official functions never use here."""
    root = Path(tempfile.mkdtemp(prefix="official-stand-ins-"))
    for name, body in {"latex2sympy2": "def latex2sympy(*a, **k):\n    raise NotImplementedError\n",
                       "wandb": "", "rouge": "class Rouge:\n    pass\n"}.items():
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(body)
    return root


def response(answer: str | None) -> str:
    return "I could not finish." if answer is None else "So the answer is \\boxed{" + answer + "}."


def episodes(answers: list[str | None]) -> list[Episode]:
    return [Episode(id=f"m{i}", env_id="turngym/MathCode-v0", task={"question": "q", "answers": ["0"]},
                    turns=[Turn(index=0, action=response(a))], final_answer=a, reward_needs=MATH)
            for i, a in enumerate(answers)]


def groups(seed: int, n: int, pool: list[str]) -> list[list[str | None]]:
    rng = random.Random(seed)

    def written(a: str) -> str:
        return rng.choice([a, a, a.replace(r"\frac", r"\dfrac"), a.replace(r"\frac", r"\tfrac"), a + ".",
                           r"\left(" + a + r"\right)" if a.startswith("(") else a, "$" + a + "$", a + r"\text{ units}"])

    out = []
    for _ in range(n):
        right, wrong = rng.sample(pool, 2)
        out.append([None if rng.random() < 0.15 else written(right if rng.random() < 0.55 else wrong) for _ in range(K)])
    return out


def compare_keys(data: Path) -> None:
    """Each answer of turngym's math sets, written six ways, through TTRL's ``extract_answer`` and EMPO's key
    (math-verify's ``parse`` with the settings of EMPO's rewards.py lines 164-182, then its
    ``normalize_prediction``) beside turngym's :func:`ttrl_answer` and :func:`empo_answer`."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse
    from rewards import normalize_prediction
    from verl.utils.reward_score.ttrl.qwen.qwen_math_parser import extract_answer

    from turngym.grading.official_math import empo_answer, ttrl_answer

    config = [LatexExtractionConfig(normalization_config=NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, equations=True, boxed="all", units=True),
        boxed_match_priority=0, try_extract_without_anchor=False)]
    answers = [str(json.loads(line)["answer"]) for name in ("math500", "aime24", "aime25", "gsm8k")
               for line in (data / name / "test.jsonl").read_text().splitlines()]
    written = [w for a in answers for w in (a, a.replace(r"\frac", r"\dfrac"), "$" + a + "$", a + ".",
                                            a + r"\text{ units}", r"\left(" + a + r"\right)")]
    ttrl_same = sum(extract_answer("So the answer is \\boxed{" + w + "}", "math") == ttrl_answer(w) for w in written)
    print(f"TTRL keys: {ttrl_same} of {len(written)} equal")
    empo_same = 0
    for w in written:
        found = parse("So the answer is \\boxed{" + w + "}", extraction_config=config, extraction_mode="first_match")
        official = "" if not found else normalize_prediction(found[0] if len(found) == 1 else found[-1])
        empo_same += official == empo_answer(w)
    print(f"EMPO keys: {empo_same} of {len(written)} equal")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttrl", type=Path, required=True, help="a clone of PRIME-RL/TTRL")
    ap.add_argument("--empo", type=Path, required=True, help="a clone of QingyangZhang/EMPO")
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--keys", action="store_true", help="also compare the answer keys on every math answer")
    args = ap.parse_args()
    sys.path[:0] = [str(stand_ins()), str(args.empo / "trl" / "src" / "open_r1")]
    # TTRL's verl package, without running its __init__ modules (they import Ray and the trainer)
    for name, folder in (("verl", "verl"), ("verl.utils", "verl/utils"), ("verl.utils.reward_score", "verl/utils/reward_score")):
        package = types.ModuleType(name)
        package.__path__ = [str(args.ttrl / "verl" / folder)]
        sys.modules[name] = package
    from rewards import get_empo_math_reward  # EMPO's trl/src/open_r1/rewards.py
    from verl.utils.reward_score.ttrl.ttt_metrics import test_time_train_metrics

    data = Path(__file__).resolve().parents[1] / "turngym" / "data" / "math"
    pool = [json.loads(line)["answer"] for line in (data / "math500" / "test.jsonl").read_text().splitlines()]
    if args.keys:
        compare_keys(data)
    for seed in args.seeds:
        equal = {f"{m} {o}": 0 for m, opts in OPTIONS.items() for o in opts}
        for answers in groups(seed, args.groups, pool):
            with contextlib.redirect_stdout(io.StringIO()):  # both print every group
                ttrl, _ = test_time_train_metrics([response(a) for a in answers], ["0"] * K)
                empo = get_empo_math_reward(K)([[{"content": response(a)}] for a in answers], ["q"] * K)
            official = {"ttrl": [float(r) for r in ttrl], "empo": [float(r) for r in empo]}
            for method, opts in OPTIONS.items():
                for name, kwargs in opts.items():
                    ours = [r[-1] for r in get_reward(method, **kwargs).score_group(episodes(answers)).rewards]
                    equal[f"{method} {name}"] += all(abs(a - b) < 1e-9 for a, b in zip(ours, official[method], strict=True))
        print(f"seed {seed}: of {args.groups} groups, these give exactly the official rewards:")
        for key, n in equal.items():
            print(f"  {key:40s} {n}")


if __name__ == "__main__":
    main()
