"""Tokens the support scorer forwards for SIOP then IGPO on saved episodes, without kept prefixes
(each reward runs each episode's longest prefix τ_T itself) and with them (once per episode), from
the tokenizer alone (no model forward: fast on a loaded machine). Branch tokens are bounded by one
and three SIOP references per point (IGPO: one, the gold answer), each the length of the episode's
own answer in the official pseudo-answer. Forward cost is close to linear in tokens at these lengths
for a 0.5B model, and branch tokens also attend to their prefix, so the real saving is somewhat
smaller than the token ratio.
Usage: python benchmarks/scoring_tokens.py PLANTED_EPISODES.jsonl [REAL_EPISODES.jsonl]
       (planted creditbench episodes are re-tokenised as text; real ones are read as the policy's ids)
"""

import sys

from transformers import AutoTokenizer

from turngym.agents.loading import resolve_model_dir
from turngym.episode.reader import read_episodes
from turngym.rewards.support import PseudoAnswer, continuation, end_of_turn_text, scoring_points

tok = AutoTokenizer.from_pretrained(resolve_model_dir("qwen2.5-coder-0.5b-instruct"))
eot = end_of_turn_text(tok)
for path, mode in [(sys.argv[1], "text")] + [(p, "ids") for p in sys.argv[2:3]]:
    eps = read_episodes(path).episodes
    main = br_lo = br_hi = 0
    n = 0
    for e in eps:
        if len(e.turns) < 2 or e.final_answer is None:
            continue
        n += 1
        ps = scoring_points(e, tok, "before_observation", mode)
        pi = scoring_points(e, tok, "after_observation", mode)
        assert ps[-1] == pi[-1]
        c = continuation(tok, PseudoAnswer(), str(e.final_answer), eot)
        cl = c.end - 1
        main += len(ps[-1])
        br_lo += (len(ps) + len(pi)) * cl
        br_hi += (3 * len(ps) + len(pi)) * cl
    before_lo, before_hi = 2 * main + br_lo, 2 * main + br_hi
    print(f"{path}: {n} scored episodes; longest-prefix tokens {main}; branch tokens {br_lo}..{br_hi}; "
          f"forwarded tokens before {before_lo}..{before_hi}, after {main + br_lo}..{main + br_hi}; "
          f"after/before {(main + br_hi) / before_hi:.2f}..{(main + br_lo) / before_lo:.2f}")
