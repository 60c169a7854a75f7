"""BFCL-v0: BFCL V4 function calling, single- and multi-turn, on bfcl-eval's own code.

Single-turn categories take one step, scored like bfcl-eval's evaluator: the AST checker
for ``simple_*`` / ``multiple`` / ``parallel*`` / ``live_*``; for irrelevance, correct
iff no call is decoded; for ``live_relevance``, iff one is.

Multi-turn categories follow bfcl-eval's inference loop. Each user turn lets the agent
take up to 20 steps of calls (bfcl-eval force-quits after step 21, failing the entry);
each call runs on bfcl-eval's stateful backend classes and the results come back as the
observation. A step with no decodable call (or ``[]``) ends the user turn: the turn is
checked (state and response checks, as in ``multi_turn_checker``) and the next user
message is the observation. ``miss_func`` turns bring the held-out functions back in
that message. The outcome ``bfcl_valid`` holds iff every checked user turn passed;
per-turn results are in the metrics of the step that closed each user turn.

Memory (``memory_kv``, ``memory_rec_sum``): the ``*_prereq`` categories are the prerequisite
conversations, played in file order with k=1; each one's memory is saved under
``memory_dir`` (bfcl-eval's snapshot layout) and loaded by the next, and the questions
start from the scenario's final memory. A question is valid iff a ground-truth answer
appears in its last reply without calls (bfcl-eval's agentic checker). Playing out of
order is refused (:class:`MemoryOrderError`).

Tool formats: ``prompting`` puts bfcl-eval's system prompt with the function docs in
the prompt and expects ``[func(arg=val)]``; ``native`` passes the docs as ``tools`` to
the chat template (``Episode.tools``) and expects Hermes ``<tool_call>`` JSON. In native
mode, held-out functions arrive in a user message (their docs as JSON), because
re-rendering the tool list would change tokens the model has already seen.

The env is a thin base over two strategy objects: its protocol (``modes``: single-turn,
multi-turn, memory), which owns the episode's backend session, and its tool format (``formats``:
prompting, native). Each episode's entry reaches the mode as one
:class:`~turngym.envs.bfcl.modes.EpisodeContext`, public as ``env.context``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.bfcl.calls import TOOL_FORMATS
from turngym.envs.bfcl.categories import CATEGORIES
from turngym.envs.bfcl.data import BFCLCategory, is_memory, is_multi_turn, language_of, load_category
from turngym.envs.bfcl.execution import BackendSession
from turngym.envs.bfcl.formats import FORMATS, ToolFormat
from turngym.envs.bfcl.modes import CALL_ANSWERS, BFCLSetup, EpisodeContext, Mode, mode_class
from turngym.envs.bfcl.upstream import bfcl_project_root
from turngym.episode import Episode, RewardNeeds

# bfcl-eval shows tool results uncut; a backend can return megabytes (e.g. ``cat`` of a file the agent
# wrote), so what the agent sees and the turn records is capped (None: uncut, as bfcl-eval)
MAX_OBSERVATION_CHARS = 32_000


def cap_text(text: str, cap: int) -> str:
    return f"{text[:cap]}\n... [truncated: {len(text) - cap:,} more characters]"


class BFCLEnv(TextEnv):
    """Data and the current episode's context; the protocol (which owns the backend session) is
    ``self.mode`` and the tool format ``self.format``."""

    env_name = "turngym/BFCL-v0"
    static_tools_absent = ("its functions differ from entry to entry (each brings its own), while a tool-calling stack "
                           "reads one fixed set of tools per environment, and its multi-turn entries send new user "
                           "messages between calls, which a tool loop cannot")
    observation_role = "user"
    outcome_metric = "bfcl_valid"  # bfcl-eval's verdict
    reward_needs = CALL_ANSWERS
    # the checker's verdict on the step that closes a user turn; also the checker the multi-turn modes declare
    # (RewardNeeds.checker_metric), which toolcall_dense reads (a reward input by design), so credit
    # against it is circular for that reward
    truth_keys = ("bfcl_turn_valid",)

    def __init__(self, category: str = "multi_turn_base", tool_format: str = "prompting",
                 data_dir: str | None = None, max_turns: int = 400, render_mode: str | None = None,
                 dataset: str | None = None, memory_dir: str | None = None,
                 max_observation_chars: int | None = MAX_OBSERVATION_CHARS):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if max_observation_chars is not None and max_observation_chars < 1:
            raise ValueError(f"max_observation_chars must be >= 1 or None, got {max_observation_chars}")
        self.max_observation_chars = max_observation_chars
        if dataset is not None:  # the harness's --dataset names the category
            category = dataset
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {TOOL_FORMATS}, got {tool_format!r}")
        self.tool_format = tool_format
        self.category = category
        self.data: BFCLCategory = load_category(category, data_dir)
        self.dataset_name = category
        self.manifest = self.data.manifest
        self.language = language_of(category)
        self.memory = is_memory(category)
        self.multi_turn = is_multi_turn(category) or self.memory  # memory entries use the multi-turn loop
        self.memory_dir = Path(memory_dir) if memory_dir else bfcl_project_root() / "memory"
        self.format: ToolFormat = FORMATS[tool_format]()
        setup = BFCLSetup(category, tool_format, self.format, self.data, self.memory_dir)
        self.mode: Mode = mode_class(category)(setup)
        self.reward_needs = self.mode.reward_needs
        self.context: EpisodeContext | None = None  # the current episode's entry, ground truth and name map

    @classmethod
    def declared_needs(cls, episode: Episode) -> RewardNeeds | None:
        """The declaration of the episode's category's protocol (its task's ``dataset``); None for another name."""
        category = episode.task.get("dataset")
        return mode_class(category).reward_needs if category in CATEGORIES else None

    # ------------------------------------------------------------------ dataset

    def num_items(self) -> int:
        return len(self.data)

    def get_item(self, index: int) -> dict[str, Any]:
        entry = self.data.entries[index]
        return {"id": entry["id"], "index": index, "dataset": self.category}

    def normalise_task(self, task: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(task, dict) or "id" not in task:
            raise ValueError("options['task'] for BFCL-v0 needs an 'id' of this category's entries")
        ids = self.data.manifest.item_ids
        if task["id"] not in ids:
            raise ValueError(f"BFCL entry {task['id']!r} is not in category {self.category!r}")
        return self.get_item(ids.index(task["id"]))

    # ------------------------------------------------------------------ prompt and tools

    @property
    def session(self) -> BackendSession | None:
        """The current episode's bfcl-eval backends (multi-turn and memory; owned by the mode)."""
        return self.mode.session

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        index = task["index"]
        entry = self.data.entries[index]
        self.context = EpisodeContext(entry=entry, index=index, checker_entry=self.data.checker_entries[index],
                                      ground_truth=self.data.answers.get(entry["id"]))
        return self.mode.begin(self.context)

    def make_tools(self, task: dict[str, Any]) -> list[dict[str, Any]] | None:
        if not self.format.gives_tools:
            return None
        assert self.context is not None  # make_prompt ran first (TextEnv.reset)
        index = task["index"]
        functions = self.data.entries[index]["function"]
        if index not in self.data.tools:  # bfcl-eval's conversion deep-copies every doc: once per item
            self.data.tools[index] = self.format.tools(functions, self.context.name_map)
        self.context.name_map.update({t["function"]["name"]: f["name"]
                                      for f, t in zip(functions, self.data.tools[index], strict=True)})
        return copy.deepcopy(self.data.tools[index])

    # ------------------------------------------------------------------ episode state

    def on_reset(self, task: dict[str, Any]) -> None:
        self.mode.on_reset()

    def on_close_episode(self) -> None:
        self.mode.on_close()

    # ------------------------------------------------------------------ acting and grading

    def act(self, action: str) -> ActionResult:
        result = self.mode.act(action)
        if result.metrics.get("bfcl_turn_valid") is not None:
            result.truth["bfcl_turn_valid"] = bool(result.metrics["bfcl_turn_valid"])
        cap = self.max_observation_chars
        if cap is None:
            return result
        # what the agent is shown and the turn records; the checker keeps the backend's full results
        if result.observation is not None and len(result.observation) > cap:
            result.observation = cap_text(result.observation, cap)
            result.metrics["observation_truncated"] = True
        for call in result.tool_calls:
            if isinstance(call.get("result"), str) and len(call["result"]) > cap:
                call["result"] = cap_text(call["result"], cap)
        return result

    def action_error(self, action: str, exc: Exception) -> ActionResult:
        return self.mode.action_error(action, exc) or super().action_error(action, exc)

    def failed_outcome(self, exc: Exception) -> dict[str, Any]:
        return {"category": self.category, "bfcl_valid": False, "error_type": "turngym:grading_error"}

    def grade(self, episode) -> dict[str, Any]:
        return self.mode.grade()
