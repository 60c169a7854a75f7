"""BFCL protocols, one class per mode: a single-turn entry (one action, scored by bfcl-eval's AST or
relevance check), a multi-turn conversation (calls executed on bfcl-eval's backends, each user
turn checked by ``multi_turn_checker``), and memory (a multi-turn conversation graded on its last
reply). Each mode owns its episode's progress and its backend session; it is built once per env from
a :class:`BFCLSetup` (category, data, tool format) and handed each episode's :class:`EpisodeContext`
(entry, checker entry, ground truth, name map) by :meth:`Mode.begin`. The env
(:class:`~turngym.envs.bfcl.env.BFCLEnv`) builds both and never reaches inside a mode; a mode never
sees the env.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.envs.base import ActionResult
from turngym.envs.bfcl.calls import Decoded
from turngym.envs.bfcl.categories import RELEVANCE
from turngym.envs.bfcl.data import BFCLCategory, MemoryOrderError, is_memory, is_multi_turn, language_of
from turngym.envs.bfcl.execution import BackendSession, is_error_result
from turngym.envs.bfcl.formats import ToolFormat
from turngym.envs.bfcl.upstream import CHECKER_MODEL_NAME, bfcl
from turngym.episode import RewardNeeds

# a single-turn entry: one action, its calls checked as a whole (the outcome's bfcl-eval verdict)
CALL_ANSWERS = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",),
                           checker_outcome="bfcl_valid")
# a multi-turn conversation: each step records its user turn; the step that closes one records its check
TURN_CALL_ANSWERS = RewardNeeds(answer_kind="calls", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",),
                                checker_metric="bfcl_turn_valid", user_turn_metric="bfcl_user_turn")
# memory questions are answered in the last reply's text (bfcl-eval's agentic checker): no per-turn check
TEXT_ANSWERS = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag", tool_ok_metrics=("tool_ok",),
                           user_turn_metric="bfcl_user_turn")


def answer_json(calls: Any) -> str:
    """The episode's answer for verifier-free rewards: its calls as canonical JSON ("[]": no call)."""
    return json.dumps(calls, sort_keys=True, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class BFCLSetup:
    """What every episode of one env shares: the category, its data, the tool format and the memory folder."""

    category: str
    tool_format: str
    format: ToolFormat
    data: BFCLCategory
    memory_dir: Path

    @property
    def language(self) -> str:
        return language_of(self.category)


@dataclass
class EpisodeContext:
    """One episode's entry as the modes see it. ``name_map`` (name shown to the model → bfcl-eval's name)
    is filled by the tool format as the tools are rendered and read when calls are decoded."""

    entry: dict[str, Any]
    index: int
    checker_entry: dict[str, Any]
    ground_truth: Any
    name_map: dict[str, str] = field(default_factory=dict)


class Mode:
    """The thin base: the first prompt as bfcl-eval renders it, the backend session it owns, and the hooks
    each mode fills."""

    reward_needs: RewardNeeds = CALL_ANSWERS

    def __init__(self, setup: BFCLSetup):
        self.setup = setup
        self.session: BackendSession | None = None
        self._context: EpisodeContext | None = None

    @property
    def ctx(self) -> EpisodeContext:
        if self._context is None:
            raise RuntimeError("the BFCL mode has no episode: reset the env first")
        return self._context

    def begin(self, context: EpisodeContext) -> list[dict[str, str]]:
        """Start an episode on ``context`` (the previous episode's session closed): its first prompt."""
        self.close_session()
        self._context = context
        return self.prompt()

    def close_session(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def prompt(self) -> list[dict[str, str]]:
        setup, ctx = self.setup, self.ctx
        key = (ctx.index, setup.tool_format)
        if key not in setup.data.prompts:  # bfcl-eval's system prompt serialises every doc: render once
            first = setup.format.with_function_docs(copy.deepcopy(ctx.entry["question"][0]), ctx.entry)
            setup.data.prompts[key] = [{"role": m["role"], "content": m["content"]} for m in first]
        return [dict(m) for m in setup.data.prompts[key]]

    def on_reset(self) -> None:
        """Start the episode's progress."""

    def act(self, action: str) -> ActionResult:
        raise NotImplementedError

    def action_error(self, action: str, exc: Exception) -> ActionResult | None:
        """What the agent sees when its action raised; None: the env's default (an error observation)."""
        return None

    def grade(self) -> dict[str, Any]:
        raise NotImplementedError

    def on_close(self) -> None:
        """Release or save per-episode state, then close the backend session."""
        self.close_session()


class SingleTurn(Mode):
    """One action, decoded and scored like bfcl-eval's evaluator (AST checker; relevance: a call or none)."""

    def on_reset(self) -> None:
        self.decoded = Decoded(error="the episode ended before any action")

    def act(self, action: str) -> ActionResult:
        setup = self.setup
        decoded = setup.format.decode(action, setup.language, self.ctx.name_map, execute=False)
        calls = [{"name": n, "arguments": a} for c in decoded.calls for n, a in c.items()] \
            if isinstance(decoded.calls, list) else []
        self.decoded = decoded
        return ActionResult(observation=None, tool_calls=calls, parse_error=decoded.error, terminated=True,
                            metrics={"tool_ok": decoded.has_calls}, final_answer=answer_json(
                                decoded.calls if decoded.error is None else []))

    def action_error(self, action: str, exc: Exception) -> ActionResult:
        """A single-turn entry gets one action: one that raised is a decoding failure and ends it."""
        self.decoded = Decoded(error=f"{type(exc).__name__}: {str(exc)[:500]}")
        return ActionResult(observation=None, terminated=True, final_answer="[]", metrics={"tool_ok": False})

    def grade(self) -> dict[str, Any]:
        category, decoded, ctx = self.setup.category, self.decoded, self.ctx
        out: dict[str, Any] = {"category": category}
        if category in RELEVANCE:
            has_call = decoded.error is None and not bfcl()["utils"].is_empty_output(decoded.calls)
            valid = has_call if category == "live_relevance" else not has_call
            out["bfcl_valid"] = valid
            if not valid:
                out["error_type"] = "relevance_error:decoder_failed" if category == "live_relevance" \
                    else "irrelevance_error:decoder_success"
            return out
        out.update(ast_verdict(category, ctx.checker_entry["function"], decoded, ctx.ground_truth))
        return out


class MultiTurn(Mode):
    """bfcl-eval's inference loop: up to 20 steps of calls per user turn; a step without a decodable
    call ends the user turn, which is then checked (state and response)."""

    reward_needs = TURN_CALL_ANSWERS

    def on_reset(self) -> None:
        setup, ctx = self.setup, self.ctx
        self.user_turn = 0
        self.steps_in_turn = 0
        self.turn_calls: list[list[str]] = []
        self.calls_by_turn: list[list[str]] = []  # every executed call, per user turn: the episode's answer
        self.all_results: list[str] = []
        self.turn_checks: list[dict[str, Any]] = []
        self.last_reply: str | None = None
        if self.session is None:
            self.session = BackendSession(ctx.entry, setup.category)
        setup.format.map_backend_methods(self.session.methods, ctx.name_map)

    def act(self, action: str) -> ActionResult:
        setup = self.setup
        assert self.session is not None
        start = time.perf_counter()
        decoded = setup.format.decode(action, setup.language, self.ctx.name_map, execute=True)
        metrics: dict[str, Any] = {"bfcl_user_turn": self.user_turn, "bfcl_step": self.steps_in_turn}
        calls = setup.format.execution_strings(decoded)
        if decoded.error is not None or not calls or (len(calls) == 1 and not calls[0]):
            # bfcl-eval: an undecodable or empty step ends the user turn
            self.last_reply = action
            metrics.update(self.close_user_turn())
            metrics["tool_ok"] = None
            return self.next_user_turn(decoded.error, metrics, start)
        results = self.session.execute(calls)
        self.turn_calls.append(calls)
        self.all_results.extend(results)
        self.steps_in_turn += 1
        metrics["tool_ok"] = not any(is_error_result(r) for r in results)
        tool_calls = [{"call": c, "result": r} for c, r in zip(calls, results, strict=True)]
        if self.steps_in_turn > bfcl()["prompts"].MAXIMUM_STEP_LIMIT:
            # bfcl-eval stops the conversation here; the turn's calls still count, so on the
            # last user turn the entry is checked as usual, on an earlier one it fails
            metrics["force_quit"] = True
            metrics.update(self.close_user_turn())
            return ActionResult(observation=None, tool_calls=tool_calls, metrics=metrics, terminated=True,
                                final_answer=answer_json(self.calls_by_turn),
                                tool_ms=(time.perf_counter() - start) * 1000.0)
        return ActionResult(observation=setup.format.render_results(calls, results), tool_calls=tool_calls,
                            metrics=metrics, observation_role=setup.format.result_role,
                            tool_ms=(time.perf_counter() - start) * 1000.0)

    def final_answer(self) -> str:
        return answer_json(self.calls_by_turn)

    def next_user_turn(self, error: str | None, metrics: dict[str, Any], start: float) -> ActionResult:
        self.user_turn += 1
        self.steps_in_turn = 0
        self.turn_calls = []
        done = self.user_turn >= len(self.ctx.entry["question"])
        observation = None if done else self.user_message(self.user_turn)
        return ActionResult(observation=observation, parse_error=error, metrics=metrics, terminated=done,
                            observation_role="user", tool_ms=(time.perf_counter() - start) * 1000.0,
                            final_answer=self.final_answer() if done else None)

    def user_message(self, turn: int) -> str:
        ctx = self.ctx
        holdout = ctx.entry.get("missed_function", {})
        if str(turn) in holdout:
            functions = self.setup.format.held_out_functions(holdout[str(turn)], ctx.name_map)
            return bfcl()["prompts"].DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=functions)
        return "\n\n".join(m["content"] for m in ctx.entry["question"][turn])

    def close_user_turn(self) -> dict[str, Any]:
        """bfcl-eval's per-turn checks (``multi_turn_checker``) for the user turn just ended."""
        session = self.session
        assert session is not None
        u = self.user_turn
        self.calls_by_turn.append([c for step in self.turn_calls for c in step])
        ground_truth = list(self.ctx.ground_truth[u])
        gt_results = session.execute_ground_truth(ground_truth)
        check: dict[str, Any] = {"bfcl_checked": bool(ground_truth)}
        if not ground_truth:  # bfcl-eval checks nothing on a turn meant to go unanswered
            self.turn_checks.append({"turn": u, "checked": False, "valid": True})
            return check
        if not self.turn_calls:
            check.update(bfcl_state_ok=False, bfcl_response_ok=False, bfcl_turn_valid=False,
                         bfcl_error_type="multi_turn:empty_turn_model_response")
        else:
            checker = bfcl()["multi_turn_checker"]
            state = checker.state_checker(session.instances, session.gt_instances)
            response = checker.response_checker(self.all_results, gt_results, u)
            check.update(bfcl_state_ok=bool(state["valid"]), bfcl_response_ok=bool(response["valid"]),
                         bfcl_turn_valid=bool(state["valid"] and response["valid"]))
            if not state["valid"]:
                check["bfcl_error_type"] = state["error_type"]
            elif not response["valid"]:
                check["bfcl_error_type"] = response["error_type"]
        self.turn_checks.append({"turn": u, "checked": True, "valid": check["bfcl_turn_valid"],
                                 "error_type": check.get("bfcl_error_type")})
        return check

    def grade(self) -> dict[str, Any]:
        n_turns = len(self.ctx.entry["question"])
        out: dict[str, Any] = {"category": self.setup.category, "user_turns": n_turns,
                               "user_turns_done": len(self.turn_checks)}
        if len(self.turn_checks) < n_turns:
            out.update(bfcl_valid=False, error_type="multi_turn:force_terminated")
            return out
        failed = [c for c in self.turn_checks if c["checked"] and not c["valid"]]
        out["bfcl_valid"] = not failed
        if failed:
            out.update(error_type=failed[0]["error_type"], failed_turn=failed[0]["turn"])
        return out


class Memory(MultiTurn):
    """Memory categories: the multi-turn loop on a memory backend whose snapshot the ``*_prereq``
    conversations write and the questions read; a question is graded on its last reply."""

    reward_needs = TEXT_ANSWERS

    def prompt(self) -> list[dict[str, str]]:
        """bfcl-eval's order: the memory instruction (with the core memory loaded from the snapshot)
        goes in first, then the function-doc system prompt in front of it."""
        setup, entry = self.setup, self.ctx.entry
        backend = entry["involved_classes"][0]
        config = {backend: {"model_result_dir": setup.memory_dir, "scenario": entry["scenario"], "test_id": entry["id"],
                            "test_category": setup.category}}
        self.session = BackendSession({**entry, "initial_config": config}, setup.category)
        instance = self.session.instances[backend]
        # the conversation this one follows must have been played (and saved) already; its own
        # checkpoint, not just the scenario's latest snapshot, so a run out of order cannot read stale memory
        before = entry.get("depends_on", [])[-1:]
        checkpoints = instance.latest_snapshot_file.parent / "prereq_checkpoints"
        if any(not (checkpoints / f"{dep}.json").is_file() for dep in before):
            self.close_session()
            base = setup.category.removesuffix("_prereq")
            raise MemoryOrderError(
                f"no memory snapshot for scenario {entry['scenario']!r} under {setup.memory_dir}: play the "
                f"{base}_prereq items first, in order with k=1, with the same memory_dir")
        question = bfcl()["handler_utils"].add_memory_instruction_system_prompt(
            copy.deepcopy(entry["question"]), setup.category, entry["scenario"], instance)
        first = setup.format.with_function_docs(question[0], entry)
        return [{"role": m["role"], "content": m["content"]} for m in first]

    def final_answer(self) -> str:
        return self.last_reply  # type: ignore[return-value] - set by the step that ended the conversation

    def close_user_turn(self) -> dict[str, Any]:
        """Memory is graded on the final reply only (bfcl-eval's agentic checker): no per-turn check."""
        self.calls_by_turn.append([c for step in self.turn_calls for c in step])
        self.turn_checks.append({"turn": self.user_turn, "checked": False, "valid": True})
        return {"bfcl_checked": False}

    def grade(self) -> dict[str, Any]:
        """bfcl-eval's agentic verdict: a ground-truth answer appears in the last reply without calls."""
        category = self.setup.category
        out: dict[str, Any] = {"category": category}
        if category.endswith("_prereq"):
            return {**out, "prereq": True}  # writes memory; not scored
        if self.last_reply is None:
            return {**out, "bfcl_valid": False, "error_type": "agentic:no_last_message"}
        result = bfcl()["agentic_checker"].agentic_checker(self.last_reply, list(self.ctx.ground_truth))
        out["bfcl_valid"] = bool(result["valid"])
        if not result["valid"]:
            out["error_type"] = result.get("error_type")
        return out

    def on_close(self) -> None:
        if self.setup.category.endswith("_prereq") and self.session is not None:
            # bfcl-eval: a prerequisite conversation's memory is saved for the next one and the questions
            # (bfcl-eval's own handler calls this private method; the backend has no public one)
            next(iter(self.session.instances.values()))._flush_memory_to_local_file()
        self.close_session()


def mode_class(category: str) -> type[Mode]:
    """The protocol of a category: memory, a multi-turn conversation, or a single-turn entry."""
    return Memory if is_memory(category) else MultiTurn if is_multi_turn(category) else SingleTurn


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
