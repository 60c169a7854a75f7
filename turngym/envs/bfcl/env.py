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
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.bfcl.calls import (TOOL_FORMATS, Decoded, decode_native, decode_prompting,
                                     native_execution_strings)
from turngym.envs.bfcl.data import (RELEVANCE, BFCLCategory, MemoryOrderError, is_memory, is_multi_turn,
                                    language_of, load_category)
from turngym.envs.bfcl.execution import BackendSession, is_error_result
from turngym.envs.bfcl.upstream import CHECKER_MODEL_NAME, bfcl, bfcl_project_root
from turngym.episode import RewardNeeds

CALL_ANSWERS = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",))
# memory questions are answered in the last reply's text (bfcl-eval's agentic checker)
TEXT_ANSWERS = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",))


class BFCLEnv(TextEnv):
    env_name = "turngym/BFCL-v0"
    observation_role = "user"
    reward_needs = CALL_ANSWERS

    def __init__(self, category: str = "multi_turn_base", tool_format: str = "prompting",
                 data_dir: str | None = None, max_turns: int = 400, render_mode: str | None = None,
                 dataset: str | None = None, memory_dir: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
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
        if self.memory:
            self.reward_needs = TEXT_ANSWERS
        self.multi_turn = is_multi_turn(category) or self.memory  # memory entries use the multi-turn loop
        self.memory_dir = Path(memory_dir) if memory_dir else bfcl_project_root() / "memory"
        self._last_reply: str | None = None
        mods = bfcl()
        self._prompts = mods["prompts"]
        self._handler_utils = mods["handler_utils"]
        self._checker = mods["multi_turn_checker"]
        self._enums = mods["enums"]
        self._session: BackendSession | None = None
        self._entry: dict[str, Any] = {}
        self._name_map: dict[str, str] = {}

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

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        entry = self.data.entries[task["index"]]
        self._entry = entry
        self._name_map = {}
        self._close_session()
        if self.memory:
            return self._memory_prompt(entry)
        key = (task["index"], self.tool_format)
        if key not in self.data.prompts:  # bfcl-eval's system prompt serialises every doc: render once
            first = copy.deepcopy(entry["question"][0])
            if self.tool_format == "prompting":
                first = self._handler_utils.system_prompt_pre_processing_chat_model(first, entry["function"],
                                                                                    entry["id"])
            self.data.prompts[key] = [{"role": m["role"], "content": m["content"]} for m in first]
        return [dict(m) for m in self.data.prompts[key]]

    def _memory_prompt(self, entry: dict[str, Any]) -> list[dict[str, str]]:
        """bfcl-eval's order: the memory instruction (with the core memory loaded from the snapshot)
        goes in first, then the function-doc system prompt in front of it."""
        backend = entry["involved_classes"][0]
        config = {backend: {"model_result_dir": self.memory_dir, "scenario": entry["scenario"], "test_id": entry["id"],
                            "test_category": self.category}}
        self._session = BackendSession({**entry, "initial_config": config}, self.category)
        instance = self._session.instances[backend]
        # the conversation this one follows must have been played (and saved) already; its own
        # checkpoint, not just the scenario's latest snapshot, so a run out of order cannot read stale memory
        before = entry.get("depends_on", [])[-1:]
        checkpoints = instance.latest_snapshot_file.parent / "prereq_checkpoints"
        if any(not (checkpoints / f"{dep}.json").is_file() for dep in before):
            self._close_session()
            base = self.category.removesuffix("_prereq")
            raise MemoryOrderError(
                f"no memory snapshot for scenario {entry['scenario']!r} under {self.memory_dir}: play the "
                f"{base}_prereq items first, in order with k=1, with the same memory_dir")
        question = self._handler_utils.add_memory_instruction_system_prompt(
            copy.deepcopy(entry["question"]), self.category, entry["scenario"], instance)
        first = question[0]
        if self.tool_format == "prompting":
            first = self._handler_utils.system_prompt_pre_processing_chat_model(first, entry["function"], entry["id"])
        return [{"role": m["role"], "content": m["content"]} for m in first]

    def make_tools(self, task: dict[str, Any]) -> list[dict[str, Any]] | None:
        if self.tool_format != "native":
            return None
        index = task["index"]
        if index not in self.data.tools:  # bfcl-eval's conversion deep-copies every doc: once per item
            self.data.tools[index] = self._tools(self.data.entries[index]["function"])
        functions = self.data.entries[index]["function"]
        self._name_map.update({t["function"]["name"]: f["name"] for f, t in zip(functions, self.data.tools[index])})
        return copy.deepcopy(self.data.tools[index])

    def _tools(self, functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        mods = bfcl()
        tools = self._handler_utils.convert_to_tool(
            functions, mods["type_mappings"].GORILLA_TO_OPENAPI, self._enums.ModelStyle.OPENAI_COMPLETIONS)
        for original, tool in zip(functions, tools):
            self._name_map[tool["function"]["name"]] = original["name"]
        return tools

    # ------------------------------------------------------------------ episode state

    def on_reset(self, task: dict[str, Any]) -> None:
        self._checker_entry = self.data.checker_entries[task["index"]]
        self._ground_truth = self.data.answers.get(self._entry["id"])
        self._user_turn = 0
        self._steps_in_turn = 0
        self._turn_calls: list[list[str]] = []
        self._calls_by_turn: list[list[str]] = []  # every executed call, per user turn: the episode's answer
        self._all_results: list[str] = []
        self._turn_checks: list[dict[str, Any]] = []
        self._force_quit = False
        self._single_decoded = Decoded(error="the episode ended before any action")
        self._last_reply = None
        if self.multi_turn and self._session is None:
            self._session = BackendSession(self._entry, self.category)
        if self.multi_turn:
            if self.tool_format == "native":
                self._name_map.update({n.replace(".", "_"): n for n in self._session.methods})

    def on_close_episode(self) -> None:
        if self.memory and self.category.endswith("_prereq") and self._session is not None:
            # bfcl-eval: a prerequisite conversation's memory is saved for the next one and the questions
            next(iter(self._session.instances.values()))._flush_memory_to_local_file()
        self._close_session()

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # ------------------------------------------------------------------ acting

    def _decode(self, action: str, execute: bool) -> Decoded:
        if self.tool_format == "native":
            return decode_native(action, self._name_map)
        return decode_prompting(action, self.language, execute=execute)

    def act(self, action: str) -> ActionResult:
        if self.multi_turn:
            return self._act_multi_turn(action)
        decoded = self._decode(action, execute=False)
        calls = [{"name": n, "arguments": a} for c in decoded.calls for n, a in c.items()] \
            if isinstance(decoded.calls, list) else []
        self._single_decoded = decoded
        return ActionResult(observation=None, tool_calls=calls, parse_error=decoded.error, terminated=True,
                            metrics={"tool_ok": decoded.has_calls}, final_answer=self._answer_json(
                                decoded.calls if decoded.error is None else []))

    def action_error(self, action: str, exc: Exception) -> ActionResult:
        """A single-turn entry gets one action: one that raised is a decoding failure and ends it."""
        if self.multi_turn:
            return super().action_error(action, exc)
        self._single_decoded = Decoded(error=f"{type(exc).__name__}: {str(exc)[:500]}")
        return ActionResult(observation=None, terminated=True, final_answer="[]", metrics={"tool_ok": False})

    def failed_outcome(self, exc: Exception) -> dict[str, Any]:
        return {"category": self.category, "bfcl_valid": False, "error_type": "turngym:grading_error"}

    @staticmethod
    def _answer_json(calls: Any) -> str:
        """The episode's answer for verifier-free rewards: its calls as canonical JSON ("[]": no call)."""
        return json.dumps(calls, sort_keys=True, ensure_ascii=False, default=str)

    def _act_multi_turn(self, action: str) -> ActionResult:
        assert self._session is not None
        start = time.perf_counter()
        decoded = self._decode(action, execute=True)
        metrics: dict[str, Any] = {"bfcl_user_turn": self._user_turn, "bfcl_step": self._steps_in_turn}
        if self.tool_format == "native" and decoded.has_calls:
            calls = native_execution_strings(decoded.calls)
        else:
            calls = list(decoded.calls) if decoded.error is None else []
        if decoded.error is not None or not calls or (len(calls) == 1 and not calls[0]):
            # bfcl-eval: an undecodable or empty step ends the user turn
            self._last_reply = action
            metrics.update(self._close_user_turn())
            metrics["tool_ok"] = None
            return self._next_user_turn(decoded.error, metrics, start)
        results = self._session.execute(calls)
        self._turn_calls.append(calls)
        self._all_results.extend(results)
        self._steps_in_turn += 1
        metrics["tool_ok"] = not any(is_error_result(r) for r in results)
        tool_calls = [{"call": c, "result": r} for c, r in zip(calls, results)]
        if self._steps_in_turn > self._prompts.MAXIMUM_STEP_LIMIT:
            # bfcl-eval stops the conversation here; the turn's calls still count, so on the
            # last user turn the entry is checked as usual, on an earlier one it fails
            self._force_quit = True
            metrics["force_quit"] = True
            metrics.update(self._close_user_turn())
            return ActionResult(observation=None, tool_calls=tool_calls, metrics=metrics, terminated=True,
                                final_answer=self._answer_json(self._calls_by_turn),
                                tool_ms=(time.perf_counter() - start) * 1000.0)
        return ActionResult(observation=self._render_results(calls, results), tool_calls=tool_calls,
                            metrics=metrics, observation_role="tool" if self.tool_format == "native" else "user",
                            tool_ms=(time.perf_counter() - start) * 1000.0)

    def _render_results(self, calls: list[str], results: list[str]) -> str:
        if self.tool_format == "native":
            return "\n".join(results) if len(results) == 1 else json.dumps(results, ensure_ascii=False)
        return self._handler_utils.format_execution_results_prompting({}, results, {"model_responses_decoded": calls})

    def _next_user_turn(self, error: str | None, metrics: dict[str, Any], start: float) -> ActionResult:
        self._user_turn += 1
        self._steps_in_turn = 0
        self._turn_calls = []
        done = self._user_turn >= len(self._entry["question"])
        observation = None if done else self._user_message(self._user_turn)
        return ActionResult(observation=observation, parse_error=error, metrics=metrics, terminated=done,
                            observation_role="user", tool_ms=(time.perf_counter() - start) * 1000.0,
                            final_answer=(self._last_reply if self.memory else self._answer_json(self._calls_by_turn))
                            if done else None)

    def _user_message(self, turn: int) -> str:
        holdout = self._entry.get("missed_function", {})
        if str(turn) in holdout:
            docs = holdout[str(turn)]
            if self.tool_format == "native":
                return self._prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                    functions=json.dumps(self._tools(docs)))
            return self._prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)
        return "\n\n".join(m["content"] for m in self._entry["question"][turn])

    def _close_user_turn(self) -> dict[str, Any]:
        """bfcl-eval's per-turn checks (``multi_turn_checker``) for the user turn just ended."""
        assert self._session is not None
        u = self._user_turn
        self._calls_by_turn.append([c for step in self._turn_calls for c in step])
        if self.memory:  # memory is graded on the final reply only (bfcl-eval's agentic checker)
            self._turn_checks.append({"turn": u, "checked": False, "valid": True})
            return {"bfcl_checked": False}
        ground_truth = list(self._ground_truth[u])
        gt_results = self._session.execute_ground_truth(ground_truth)
        check: dict[str, Any] = {"bfcl_checked": bool(ground_truth)}
        if not ground_truth:  # bfcl-eval checks nothing on a turn meant to go unanswered
            self._turn_checks.append({"turn": u, "checked": False, "valid": True})
            return check
        if not self._turn_calls:
            check.update(bfcl_state_ok=False, bfcl_response_ok=False, bfcl_turn_valid=False,
                         bfcl_error_type="multi_turn:empty_turn_model_response")
        else:
            state = self._checker.state_checker(self._session.instances, self._session.gt_instances)
            response = self._checker.response_checker(self._all_results, gt_results, u)
            check.update(bfcl_state_ok=bool(state["valid"]), bfcl_response_ok=bool(response["valid"]),
                         bfcl_turn_valid=bool(state["valid"] and response["valid"]))
            if not state["valid"]:
                check["bfcl_error_type"] = state["error_type"]
            elif not response["valid"]:
                check["bfcl_error_type"] = response["error_type"]
        self._turn_checks.append({"turn": u, "checked": True, "valid": check["bfcl_turn_valid"],
                                  "error_type": check.get("bfcl_error_type")})
        return check

    # ------------------------------------------------------------------ grading

    def grade(self, episode) -> dict[str, Any]:
        if self.memory:
            return self._grade_memory()
        if self.multi_turn:
            return self._grade_multi_turn()
        return self._grade_single_turn()

    def _grade_multi_turn(self) -> dict[str, Any]:
        n_turns = len(self._entry["question"])
        out: dict[str, Any] = {"category": self.category, "user_turns": n_turns,
                               "user_turns_done": len(self._turn_checks)}
        if len(self._turn_checks) < n_turns:
            out.update(bfcl_valid=False, error_type="multi_turn:force_terminated")
            return out
        failed = [c for c in self._turn_checks if c["checked"] and not c["valid"]]
        out["bfcl_valid"] = not failed
        if failed:
            out.update(error_type=failed[0]["error_type"], failed_turn=failed[0]["turn"])
        return out

    def _grade_memory(self) -> dict[str, Any]:
        """bfcl-eval's agentic verdict: a ground-truth answer appears in the last reply without calls."""
        out: dict[str, Any] = {"category": self.category}
        if self.category.endswith("_prereq"):
            return {**out, "prereq": True}  # writes memory; not scored
        if self._last_reply is None:
            return {**out, "bfcl_valid": False, "error_type": "agentic:no_last_message"}
        result = bfcl()["agentic_checker"].agentic_checker(self._last_reply, list(self._ground_truth))
        out["bfcl_valid"] = bool(result["valid"])
        if not result["valid"]:
            out["error_type"] = result.get("error_type")
        return out

    def _grade_single_turn(self) -> dict[str, Any]:
        decoded: Decoded = self._single_decoded
        out: dict[str, Any] = {"category": self.category}
        if self.category in RELEVANCE:
            has_call = decoded.error is None and not bfcl()["utils"].is_empty_output(decoded.calls)
            valid = has_call if self.category == "live_relevance" else not has_call
            out["bfcl_valid"] = valid
            if not valid:
                out["error_type"] = "relevance_error:decoder_failed" if self.category == "live_relevance" \
                    else "irrelevance_error:decoder_success"
            return out
        out.update(ast_verdict(self.category, self._checker_entry["function"], decoded, self._ground_truth))
        return out


def ast_verdict(category: str, functions: list[dict[str, Any]], decoded: Decoded,
                ground_truth: list[dict[str, Any]]) -> dict[str, Any]:
    """bfcl-eval's ``_evaluate_single_ast_entry`` verdict on already-decoded calls."""
    mods = bfcl()
    if decoded.error is not None:
        return {"bfcl_valid": False, "error_type": "ast_decoder:decoder_failed", "error": decoded.error}
    if not mods["utils"].is_function_calling_format_output(decoded.calls):
        return {"bfcl_valid": False, "error_type": "ast_decoder:decoder_wrong_output_format"}
    lang = mods["enums"].Language
    language = {"python": lang.PYTHON, "java": lang.JAVA, "javascript": lang.JAVASCRIPT}[language_of(category)]
    result = mods["ast_checker"].ast_checker(copy.deepcopy(functions), copy.deepcopy(decoded.calls),
                                             copy.deepcopy(ground_truth), language, category, CHECKER_MODEL_NAME)
    out: dict[str, Any] = {"bfcl_valid": bool(result["valid"])}
    if not result["valid"]:
        out["error_type"] = result.get("error_type")
        out["error"] = [str(e) for e in result.get("error", [])][:3]
    return out
