"""SearchQA-v0: retrieval-augmented QA with the Search-R1 protocol over a BM25 Lucene index (the default), a
dense FAISS index (``retriever="dense:PATH"``, as Search-R1 trains) or both (``"hybrid:BM25_PATH,DENSE_PATH"``).

``<search>q</search>`` returns ``<information>Doc 1(Title: ...) ...</information>`` with the
top-k passages; ``<answer>a</answer>`` ends the episode (the last answer tag counts);
anything else gets Search-R1's invalid-action message. Outcome: EM and F1 with SQuAD
normalisation against every gold answer. Per-turn truth (``Turn.truth``, never a metric a
reward reads): did this search retrieve a passage that contains a gold answer (``retrieval_hit``).

``tool_format="native"`` offers search as a function tool through the chat template
(``Episode.tools``), as SIOP's official setup runs it: the model calls it with a Hermes
``<tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>`` block, the
passages come back as a ``tool`` message, and ``<answer>a</answer>`` still ends the episode.

``prompt="official"`` (default) is Search-R1's instruction (in native format the same words
as a system prompt); ``prompt="search_first"`` adds one instruction to search before
answering (a deviation, listed in docs/faithfulness.md): small instruct models otherwise
answer from memory without searching. ``prompt="one_shot"`` adds one worked example (a search,
its result, the answer) written in the episode's format. ``force_first_search=True`` starts the
first reply with an opened search call (``<search>``, or ``<tool_call>`` and the call's JSON up to
the query string), which the model completes: the token-level twin of a chat API's
``tool_choice="required"`` for the first turn (a deviation; the prefill is prompt, not trained).
That forced call may end with the reply instead of ``</tool_call>`` (read as vLLM's Hermes
parser reads an open call); every other call must be closed.

``tool_response_chars=N`` cuts the search tool's text (the passages) to N characters as verl's tool
agent loop does with ``max_tool_response_length`` (SIOP's launcher: 2,048, ``truncate_side=right``):
``"right"`` keeps the last N characters after ``"(truncated)..."``, ``"left"`` the first N before
``"...(truncated)"``, ``"middle"`` N // 2 of each end around ``"...(truncated)..."``. None (default): no cut.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from turngym.corpora.datasets import QA_DATASETS, Dataset, load_dataset
from turngym.corpora.lucene import Hit, RetrieverError
from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.parsing import MAX_INPUT_CHARS, parse_hermes_tool_calls, tag_spans
from turngym.envs.tools import EnvTool, ToolParam, hermes_action, tag_action
from turngym.episode import RewardNeeds
from turngym.grading.qa import any_contains_gold, contains_gold, exact_match, f1_score, normalized_golds

SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
_TAGS = ("search", "answer")
TOOL_FORMATS = ("tags", "native")
TRUNCATE_SIDES = ("right", "left", "middle")


def cut_tool_response(text: str, limit: int | None, side: str = "right") -> str:
    """A tool response over ``limit`` characters cut as verl's ``ToolAgentLoop`` does (its side names)."""
    if limit is None or len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]
NATIVE_SYSTEM_PROMPT = (
    "You are a helpful assistant that answers questions with the help of a search engine. Think step by step. "
    "If you lack some knowledge, call the search tool; it returns the top matching Wikipedia passages. You can "
    "search as many times as you want. When no further knowledge is needed, give the final answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>."
)
NATIVE_USER_TEMPLATE = "Question: {question}\n"
NATIVE_INVALID_ACTION = (
    "Your previous reply neither called the search tool nor gave an answer. To search, call the search tool; "
    "to answer, put the final answer between <answer> and </answer>."
)
PROMPTS = ("official", "search_first", "one_shot")
SEARCH_FIRST_INSTRUCTION = (
    "Always search before you answer: your first reply must be a search, and give the final answer only after "
    "you have read the search results."
)
# prompt="one_shot": one worked example (a search, its result, the answer) in the episode's own format
_EXAMPLE_QUESTION = "In which country is the city of Timbuktu?"
_EXAMPLE_QUERY = "Timbuktu city country"
_EXAMPLE_PASSAGE = ('Doc 1(Title: "Timbuktu") Timbuktu is a city in Mali, situated 20 km north of the Niger River. '
                    'The town is the capital of the Tombouctou Region.')
ONE_SHOT_TAGS = (
    "Here is an example of how to answer a question.\n"
    f"Question: {_EXAMPLE_QUESTION}\n"
    "<think> I do not know where Timbuktu is, so I search for it. </think>\n"
    f"<search> {_EXAMPLE_QUERY} </search>\n\n<information>{_EXAMPLE_PASSAGE}</information>\n\n"
    "<think> The passage says Timbuktu is a city in Mali. </think>\n<answer> Mali </answer>"
)
ONE_SHOT_NATIVE = (
    "Here is an example of how to answer a question.\n"
    f"Question: {_EXAMPLE_QUESTION}\n"
    "You call the search tool:\n<tool_call>\n"
    '{"name": "search", "arguments": {"query": "' + _EXAMPLE_QUERY + '"}}\n</tool_call>\n'
    f"The tool returns:\n<information>{_EXAMPLE_PASSAGE}</information>\n"
    "You answer:\n<answer> Mali </answer>"
)
# force_first_search=True: the first reply starts with these (an opened search call the model completes)
FIRST_SEARCH_PREFILL = {"tags": "<search>", "native": '<tool_call>\n{"name": "search", "arguments": {"query": "'}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search Wikipedia and return the top passages for a query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up"}},
            "required": ["query"],
        },
    },
}


def last_answer(action: str) -> str | None:
    """The episode's answer in ``action``: the last ``<answer>`` tag, stripped (None: no tag)."""
    if len(action) > MAX_INPUT_CHARS:
        return None  # refused unread, as every parser refuses it
    return _last_body(tag_spans(action, _TAGS), "answer")


def _last_body(tags: list[tuple[str, str]], name: str) -> str | None:
    """The stripped body of the last ``name`` tag among ``tags`` (None: no such tag)."""
    for tag, body in reversed(tags):
        if tag == name:
            return body.strip()
    return None


def grade_answer(final_answer: str | None, golds: list[str]) -> dict[str, Any]:
    """SearchQA's outcome of a final answer: EM and F1 against every gold (shared with importers)."""
    golds = [str(a) for a in golds]
    return {"em": exact_match(final_answer, golds), "f1": f1_score(final_answer, golds),
            "answered": final_answer is not None}


def format_passages(hits: list[Hit]) -> str:
    """Search-R1's rendering: ``Doc i(Title: "T") text`` per passage."""
    return "".join(_passage_lines(hits))


def _passage_lines(hits: list[Hit]) -> list[str]:
    return [f"Doc {i}(Title: \"{h.title}\") {h.text}\n" for i, h in enumerate(hits, start=1)]


def information_block(hits: list[Hit], cut: Callable[[str], str] | None = None) -> str:
    """The search tool's observation: the passages, stripped and ``cut``, inside ``<information>`` (the
    passages are joined stripped, not stripped after: a search turn's passages were copied four times)."""
    lines = _passage_lines(hits)
    if lines:
        lines[-1] = lines[-1].rstrip()  # as .strip() of the whole: a passage line opens with "Doc i(", never a space
    text = "".join(lines)
    return f"\n\n<information>{text if cut is None else cut(text)}</information>\n\n"


def contains_answer(text: str, answers: list[str]) -> bool:
    """Whether a gold answer, normalised, is a run of whole words of the normalised ``text`` (Search-R1's test)."""
    return contains_gold(text, normalized_golds(answers))


class SearchQAEnv(TextEnv):
    prompt_styles = ("chat", "base")
    env_name = "turngym/SearchQA-v0"
    observation_role = None
    stop = ("</search>", "</answer>")
    outcome_metric = "em"  # Search-R1's reward: exact match
    # search_ok: the search ran (a query, no retrieval error); recorded on search turns only, not on the answer call
    reward_needs = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag", tool_ok_metrics=("search_ok",),
                               tool_error_metrics=("retrieval_error",))
    truth_keys = ("retrieval_hit",)

    def __init__(self, dataset: str = "nq", split: str | None = None, retriever: Any = None, topk: int = 3,
                 max_turns: int = 4, prompt_style: str = "chat", max_query_chars: int = 2000,
                 tool_format: str = "tags", prompt: str = "official", force_first_search: bool = False,
                 tool_response_chars: int | None = None, tool_response_truncate_side: str = "right",
                 render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if tool_response_chars is not None and int(tool_response_chars) < 1:
            raise ValueError(f"tool_response_chars must be >= 1 or None, got {tool_response_chars!r}")
        if tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"tool_response_truncate_side must be one of {TRUNCATE_SIDES}, "
                             f"got {tool_response_truncate_side!r}")
        self.tool_response_chars = None if tool_response_chars is None else int(tool_response_chars)
        self.tool_response_truncate_side = tool_response_truncate_side
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
        if tool_format == "native" and prompt_style == "base":
            raise ValueError("tool_format='native' needs a chat model (prompt_style='chat'): tools go through the chat template")
        self.tool_format = tool_format
        if prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
        self.prompt = prompt
        if not isinstance(force_first_search, bool):
            raise ValueError(f"force_first_search must be true or false, got {force_first_search!r}")
        self.force_first_search = self.prefills = force_first_search
        if tool_format == "native":
            self.stop = ("</tool_call>", "</answer>")
        if prompt_style not in self.prompt_styles:
            raise ValueError(f"prompt_style must be 'chat' or 'base', got {prompt_style!r}")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.data: Dataset = load_dataset(dataset, split)
        self.dataset_name = self.data.manifest.dataset
        self.prompt_style, self.topk, self.max_query_chars = prompt_style, int(topk), int(max_query_chars)
        self._retriever_spec = retriever
        self._retriever: Any = None
        self._golds = normalized_golds([])
        from turngym.corpora.service import check_retriever, require_retriever

        require_retriever(retriever)  # a local index needs its extra (search, dense): said now, not at the first search
        try:
            check_retriever(retriever)  # and must exist (a server must answer): no env whose every search is an error
        except RetrieverError as exc:
            raise RetrieverError(f"{self.env_name}: {exc}") from None

    @property
    def manifest(self):
        return self.data.manifest

    @property
    def retriever(self) -> Any:
        """Created on first search, in the process that searches (never before a fork)."""
        if self._retriever is None:
            from turngym.corpora.service import make_retriever

            self._retriever = make_retriever(self._retriever_spec)
        return self._retriever

    def check_ready(self) -> None:
        """The index opens (or the retrieval server answers ``/health``); raises RetrieverError if not."""
        check = getattr(self.retriever, "check", None)
        if check is not None:
            check()

    def num_items(self) -> int:
        return len(self.data)

    def get_item(self, index: int) -> dict[str, Any]:
        return dict(self.data[index])

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        question = task["question"].strip()
        if question and question[-1] != "?":
            question += "?"
        extra = " " + SEARCH_FIRST_INSTRUCTION if self.prompt == "search_first" else ""
        if self.prompt == "one_shot":
            extra = "\n\n" + (ONE_SHOT_NATIVE if self.tool_format == "native" else ONE_SHOT_TAGS)
        if self.tool_format == "native":
            return [{"role": "system", "content": NATIVE_SYSTEM_PROMPT + extra},
                    {"role": "user", "content": NATIVE_USER_TEMPLATE.format(question=question)}]
        if extra:  # the official template is one user message; the instruction goes in a system turn before it
            return [{"role": "system", "content": extra.strip()},
                    {"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=question)}]
        return [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=question)}]

    def on_reset(self, task: dict[str, Any]) -> None:
        # the gold check of every search turn reads the answers normalised: once an episode, not once a turn
        self._golds = normalized_golds(str(a) for a in task.get("answers", []))

    def make_tools(self, task: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [copy.deepcopy(SEARCH_TOOL)] if self.tool_format == "native" else None

    def declared_tools(self) -> tuple[EnvTool, ...]:
        search = hermes_action("search") if self.tool_format == "native" else tag_action("search", "query")
        return (EnvTool("search", SEARCH_TOOL["function"]["description"],
                        (ToolParam("query", str, "The search query."),), search),
                EnvTool("answer", "Give the final answer to the question; this ends the episode.",
                        (ToolParam("answer", str, "The final answer, a short phrase."),), tag_action("answer", "answer"),
                        ends_episode=True))

    def reply_prefill(self) -> str:
        """With ``force_first_search``, the first reply starts as an opened search call."""
        if self.force_first_search and self.episode is not None and not self.episode.turns:
            return FIRST_SEARCH_PREFILL[self.tool_format]
        return ""

    def _queries(self, action: str) -> tuple[list[str], str | None]:
        """The search queries an action issues (native: Hermes tool calls; tags: ``<search>``) and any parse error."""
        if self.tool_format == "tags":
            return [body.strip() for name, body in tag_spans(action, _TAGS) if name == "search"], None
        if "<tool_call>" not in action:
            return [], None
        # the call the env opened with force_first_search may be left open at the end, as vLLM's parser reads it
        forced = self.force_first_search and self.episode is not None and not self.episode.turns
        parsed = parse_hermes_tool_calls(action, open_at_end=forced)
        queries, errors = [], [parsed.error] if parsed.error else []
        for call in parsed.calls:
            query = call["arguments"].get("query")
            if call["name"] != "search":
                errors.append(f"unknown tool {call['name']!r}; the only tool is 'search'")
            elif not isinstance(query, str):
                errors.append("search takes one string argument 'query'")
            else:
                queries.append(query.strip())
        return queries, "; ".join(errors) or None

    def act(self, action: str) -> ActionResult:
        if len(action) > MAX_INPUT_CHARS:  # refused unread: no parse of it can cost more than a linear pass
            error = f"action is {len(action)} characters; the limit is {MAX_INPUT_CHARS}"
            return ActionResult(observation=INVALID_ACTION if self.tool_format == "tags" else NATIVE_INVALID_ACTION,
                                parse_error=error, metrics={"action": "invalid"},
                                observation_role=None if self.tool_format == "tags" else "user")
        if self.tool_format == "native":
            return self._act_native(action)
        tags = tag_spans(action, _TAGS)  # read once: the answer, else the last search
        answer = _last_body(tags, "answer")
        if answer is not None:
            return ActionResult(observation=None, terminated=True, final_answer=answer,
                                tool_calls=[{"name": "answer", "arguments": {"answer": answer}}],
                                metrics={"action": "answer"})
        query = _last_body(tags, "search")
        if query is None:
            return ActionResult(observation=INVALID_ACTION, parse_error="no <search> or <answer> tag",
                                metrics={"action": "invalid"})
        return self._search(query)

    def _act_native(self, action: str) -> ActionResult:
        queries, error = self._queries(action)
        if queries:  # the last call counts, as with tags; the passages come back as a tool message
            result = self._search(queries[-1])
            result.parse_error = result.parse_error or error
            result.observation = result.observation.strip() + "\n" if result.observation else result.observation
            result.observation_role = "tool"
            return result
        answer = last_answer(action)
        if answer is not None:
            return ActionResult(observation=None, terminated=True, final_answer=answer, parse_error=error,
                                tool_calls=[{"name": "answer", "arguments": {"answer": answer}}],
                                metrics={"action": "answer"})
        message = f"{error}. {NATIVE_INVALID_ACTION}" if error else NATIVE_INVALID_ACTION
        return ActionResult(observation=message, parse_error=error or "no search call and no <answer> tag",
                            metrics={"action": "invalid"}, observation_role="user")

    def _cut(self, text: str) -> str:
        """verl's ``ToolAgentLoop`` cut of a tool response longer than ``tool_response_chars``."""
        return cut_tool_response(text, self.tool_response_chars, self.tool_response_truncate_side)

    def _search(self, query: str) -> ActionResult:
        call = {"name": "search", "arguments": {"query": query}}
        if not query:
            return ActionResult(observation="\n\n<information>Error: the search query is empty.</information>\n\n",
                                tool_calls=[call], parse_error="empty search query",
                                metrics={"action": "search", "search_ok": False}, truth={"retrieval_hit": False})
        if len(query) > self.max_query_chars:
            query = query[: self.max_query_chars]
        start = time.perf_counter()
        try:
            hits = self.retriever.search(query, self.topk)
        except (RetrieverError, ValueError) as exc:
            return ActionResult(observation=f"\n\n<information>Error: search failed: {exc}</information>\n\n",
                                tool_calls=[call],
                                metrics={"action": "search", "search_ok": False, "retrieval_error": str(exc)},
                                truth={"retrieval_hit": False},
                                tool_ms=(time.perf_counter() - start) * 1000.0)
        return ActionResult(
            observation=information_block(hits, None if self.tool_response_chars is None else self._cut),
            tool_calls=[call],
            metrics={"action": "search", "search_ok": True, "n_docs": len(hits), "doc_ids": [h.docid for h in hits]},
            truth={"retrieval_hit": any_contains_gold([h.contents for h in hits], self._golds)},
            tool_ms=(time.perf_counter() - start) * 1000.0,
        )

    def failed_outcome(self, exc: Exception) -> dict[str, Any]:
        return {"em": 0.0, "f1": 0.0, "answered": self.episode is not None and self.episode.final_answer is not None}

    def grade(self, episode) -> dict[str, Any]:
        return grade_answer(episode.final_answer, episode.task.get("answers", []))


__all__ = ["SearchQAEnv", "QA_DATASETS", "PROMPTS", "SEARCH_TOOL", "TOOL_FORMATS", "format_passages", "grade_answer",
           "last_answer"]
