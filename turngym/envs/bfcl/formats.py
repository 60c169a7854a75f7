"""BFCL tool formats: how the function docs reach the model, how its calls are decoded, and how
results come back. ``prompting`` follows bfcl-eval's prompting handlers (docs in the system prompt,
``[func(arg=val)]`` calls, results in a user message); ``native`` its function-calling handlers
(docs as chat-template ``tools``, Hermes ``<tool_call>`` JSON, results in a tool message).
"""

from __future__ import annotations

import json
from typing import Any

from turngym.envs.bfcl.calls import Decoded, decode_native, decode_prompting, native_execution_strings
from turngym.envs.bfcl.upstream import bfcl


class ToolFormat:
    """What differs between the two formats; the env owns the name map (shown name -> BFCL name)."""

    name: str
    result_role: str  # the chat role tool results come back in during a multi-turn episode
    gives_tools: bool = False  # the docs go to the chat template as ``tools`` (else they are in the prompt)

    def with_function_docs(self, messages: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
        """The first user turn's messages as the model sees them."""
        return messages

    def tools(self, functions: list[dict[str, Any]], name_map: dict[str, str]) -> list[dict[str, Any]]:
        """Chat-template tool schemas for ``functions``, recording their shown names in ``name_map``."""
        raise NotImplementedError(f"the {self.name} format puts the function docs in the prompt")

    def decode(self, action: str, language: str, name_map: dict[str, str], execute: bool) -> Decoded:
        raise NotImplementedError

    def execution_strings(self, decoded: Decoded) -> list[str]:
        """The decoded calls as bfcl-eval's executable call strings (none if decoding failed)."""
        return list(decoded.calls) if decoded.error is None else []

    def render_results(self, calls: list[str], results: list[str]) -> str:
        raise NotImplementedError

    def held_out_functions(self, docs: list[dict[str, Any]], name_map: dict[str, str]) -> Any:
        """The ``functions`` that bfcl-eval's held-out-function user prompt lists."""
        return docs

    def map_backend_methods(self, methods: Any, name_map: dict[str, str]) -> None:
        """Record the names the model may call a multi-turn backend's methods by."""


class PromptingFormat(ToolFormat):
    name = "prompting"
    result_role = "user"

    def with_function_docs(self, messages, entry):
        return bfcl()["handler_utils"].system_prompt_pre_processing_chat_model(messages, entry["function"], entry["id"])

    def decode(self, action, language, name_map, execute):
        return decode_prompting(action, language, execute=execute)

    def render_results(self, calls, results):
        utils = bfcl()["handler_utils"]
        return utils.format_execution_results_prompting({}, results, {"model_responses_decoded": calls})


class NativeFormat(ToolFormat):
    name = "native"
    result_role = "tool"
    gives_tools = True

    def tools(self, functions, name_map):
        mods = bfcl()
        tools = mods["handler_utils"].convert_to_tool(
            functions, mods["type_mappings"].GORILLA_TO_OPENAPI, mods["enums"].ModelStyle.OPENAI_COMPLETIONS)
        for original, tool in zip(functions, tools, strict=True):
            name_map[tool["function"]["name"]] = original["name"]
        return tools

    def decode(self, action, language, name_map, execute):
        return decode_native(action, name_map)

    def execution_strings(self, decoded):
        return native_execution_strings(decoded.calls) if decoded.has_calls else super().execution_strings(decoded)

    def render_results(self, calls, results):
        return "\n".join(results) if len(results) == 1 else json.dumps(results, ensure_ascii=False)

    def held_out_functions(self, docs, name_map):
        # in a user message (as JSON): re-rendering the tool list would change tokens the model has seen
        return json.dumps(self.tools(docs, name_map))

    def map_backend_methods(self, methods, name_map):
        name_map.update({n.replace(".", "_"): n for n in methods})


FORMATS: dict[str, type[ToolFormat]] = {"prompting": PromptingFormat, "native": NativeFormat}
