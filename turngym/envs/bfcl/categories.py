"""BFCL V4 categories, defined once: which the env plays offline, how the leaderboard groups them,
and their entry counts. Plain names only (no bfcl-eval import), so scoring code can use them
without bfcl-eval installed.
"""

from __future__ import annotations

# single-turn categories scored by bfcl-eval's AST checker
SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE_AST = SIMPLE + ("multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
SINGLE_TURN_AST = NON_LIVE_AST + LIVE_AST
# single-turn categories scored on whether a call is decoded at all
IRRELEVANCE = ("irrelevance", "live_irrelevance")
RELEVANCE = IRRELEVANCE + ("live_relevance",)
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
WEB_SEARCH = ("web_search_base", "web_search_no_snippet")
# memory: the *_prereq conversations write the memory snapshots the questions then read
MEMORY = ("memory_kv", "memory_rec_sum")
MEMORY_PREREQ = tuple(c + "_prereq" for c in MEMORY)
MEMORY_V4 = ("memory_kv", "memory_vector", "memory_rec_sum")  # the leaderboard's memory group

# what BFCL-v0 plays offline
CATEGORIES = SINGLE_TURN_AST + RELEVANCE + MULTI_TURN + MEMORY + MEMORY_PREREQ
REFUSED = {
    "web_search_base": "needs a live web search API (bfcl-eval's WebSearchAPI calls SerpAPI over the network)",
    "web_search_no_snippet": "needs a live web search API (bfcl-eval's WebSearchAPI calls SerpAPI over the network)",
    "memory_vector": "loads SentenceTransformer('all-MiniLM-L6-v2') from the Hugging Face hub at import; not supported",
    "format_sensitivity": "is a prompt-format sweep over other categories, not a task; not supported",
}

# Entry counts of BFCL V4 (bfcl-eval 2026.3.23 data), in the leaderboard's order; the scorer uses
# them to weight a live category that was not evaluated, as bfcl-eval does.
V4_COUNTS = {
    "simple_python": 400, "simple_java": 100, "simple_javascript": 50, "multiple": 200, "parallel": 200,
    "parallel_multiple": 200, "irrelevance": 240, "live_simple": 258, "live_multiple": 1053, "live_parallel": 16,
    "live_parallel_multiple": 24, "live_irrelevance": 884, "live_relevance": 16, "multi_turn_base": 200,
    "multi_turn_miss_func": 200, "multi_turn_miss_param": 200, "multi_turn_long_context": 200,
    "web_search_base": 100, "web_search_no_snippet": 100, "memory_kv": 155, "memory_vector": 155,
    "memory_rec_sum": 155,
}
# single- and multi-turn categories (no memory or web search), in the leaderboard's order
CONVERSATION_CATEGORIES = tuple(c for c in V4_COUNTS if c in SINGLE_TURN_AST + RELEVANCE + MULTI_TURN)
