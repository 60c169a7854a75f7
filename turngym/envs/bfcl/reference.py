"""bfcl-eval's own evaluator on raw model outputs: the reference BFCL-v0 verdicts must equal.

The functions here hand the same raw step texts the env received to bfcl-eval's
``eval_runner`` helpers (``_evaluate_single_ast_entry``, ``_evaluate_single_relevance_entry``,
``_evaluate_single_multi_turn_entry``) with a handler that decodes exactly as bfcl-eval's
handlers do: the open-model prompting handler's decoders, or the OpenAI function-calling
handler's (``[{name: json_arguments}]``). Used by the parity tests and the replay
benchmark. Only for trusted or benign outputs: bfcl-eval's decoders evaluate parts of
what they decode (see :mod:`turngym.envs.bfcl.calls`).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import uuid
from typing import Any

from turngym.envs.bfcl.data import RELEVANCE, language_of
from turngym.envs.bfcl.upstream import CHECKER_MODEL_NAME, bfcl

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _runner() -> Any:
    bfcl()
    return importlib.import_module("bfcl_eval.eval_checker.eval_runner")


class PromptingHandler:
    """Decodes like bfcl-eval's open-model handlers in prompting mode."""

    def decode_ast(self, result: str, language: Any, has_tool_call_tag: bool = False) -> list[dict]:
        return bfcl()["handler_utils"].default_decode_ast_prompting(result, language, has_tool_call_tag)

    def decode_execute(self, result: str, has_tool_call_tag: bool = False) -> list[str]:
        return bfcl()["handler_utils"].default_decode_execute_prompting(result, has_tool_call_tag)


class FunctionCallingHandler:
    """Decodes like bfcl-eval's OpenAI handler in function-calling mode.

    The API returns structured calls; here they are read from Hermes ``<tool_call>``
    blocks. A reply without calls stays a string, which that handler cannot decode.
    """

    def __init__(self, name_map: dict[str, str] | None = None):
        self.name_map = name_map or {}

    def _structured(self, text: str) -> Any:
        blocks = _TOOL_CALL.findall(text)
        if not blocks:
            return text
        out = []
        for raw in blocks:
            obj = json.loads(raw)
            args = obj.get("arguments", {})
            out.append({self.name_map.get(obj["name"], obj["name"]): args if isinstance(args, str) else json.dumps(args)})
        return out

    def decode_ast(self, result: str, language: Any = None, has_tool_call_tag: bool = False) -> list[dict]:
        structured = self._structured(result)
        decoded = []
        for call in structured:  # a plain string fails here, as in bfcl-eval
            name = list(call.keys())[0]
            decoded.append({name: json.loads(call[name])})
        return decoded

    def decode_execute(self, result: str, has_tool_call_tag: bool = False) -> list[str]:
        structured = self._structured(result)
        if isinstance(structured, str):
            raise ValueError("no function call")
        return bfcl()["handler_utils"].convert_to_function_call(structured)


def handler_for(tool_format: str, name_map: dict[str, str] | None = None) -> Any:
    return FunctionCallingHandler(name_map) if tool_format == "native" else PromptingHandler()


def official_single_turn(category: str, raw: str, checker_entry: dict[str, Any], ground_truth: Any,
                         tool_format: str = "prompting", name_map: dict[str, str] | None = None) -> dict[str, Any]:
    """bfcl-eval's verdict on one single-turn output (``{"valid": bool, ...}``)."""
    runner = _runner()
    handler = handler_for(tool_format, name_map)
    entry = copy.deepcopy(checker_entry)
    if category in RELEVANCE:
        return runner._evaluate_single_relevance_entry(handler, entry["id"], raw, entry, CHECKER_MODEL_NAME, category)
    mods = bfcl()
    lang, fmt = mods["enums"].Language, mods["enums"].ReturnFormat
    language = language_of(category)
    return runner._evaluate_single_ast_entry(
        handler, entry["id"], raw, copy.deepcopy(ground_truth), entry, CHECKER_MODEL_NAME, category,
        language={"python": lang.PYTHON, "java": lang.JAVA, "javascript": lang.JAVASCRIPT}[language],
        return_format={"python": fmt.PYTHON, "java": fmt.JAVA, "javascript": fmt.JAVASCRIPT}[language])


def official_multi_turn(category: str, raw_steps: list[list[str]], checker_entry: dict[str, Any],
                        ground_truth: list[list[str]], tool_format: str = "prompting",
                        name_map: dict[str, str] | None = None) -> dict[str, Any]:
    """bfcl-eval's verdict on a multi-turn entry from the raw step texts of each user turn.

    A fresh model name keeps bfcl-eval's cached backend instances apart from any other
    run; they are deleted afterwards.
    """
    runner = _runner()
    model_name = f"turngymref_{uuid.uuid4().hex}"
    try:
        return runner._evaluate_single_multi_turn_entry(
            handler_for(tool_format, name_map), checker_entry["id"], [list(t) for t in raw_steps],
            copy.deepcopy(ground_truth), copy.deepcopy(checker_entry), model_name, category)
    finally:
        store = vars(bfcl()["multi_turn_utils"])
        for name in [n for n in list(store) if n.startswith(model_name)]:
            store.pop(name, None)


def official_agentic(category: str, raw_steps: list[str], entry: dict[str, Any], ground_truth: list[str],
                     tool_format: str = "prompting", name_map: dict[str, str] | None = None) -> dict[str, Any]:
    """bfcl-eval's verdict on a memory question from the raw step texts of its one user turn."""
    return _runner()._evaluate_single_agentic_entry(
        handler_for(tool_format, name_map), entry["id"], [list(raw_steps)], list(ground_truth), copy.deepcopy(entry),
        CHECKER_MODEL_NAME, category)
