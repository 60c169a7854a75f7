"""An env's tools, declared: what another stack's tool calling can offer a model for this env.

turngym envs take free text in their own protocol (``<calc>…</calc>``, a ```` ```python ```` block). A stack
that calls tools by name with typed arguments (TRL's ``environment_factory``, SkyRL, verifiers, OpenEnv) needs
each tool's name, parameters and description, how one call becomes the env's action text, and which call
ends the episode. The env declares them (``TextEnv.declared_tools``), in the same module that parses its
protocol, so a tag renamed in the env is renamed for every adapter at once. An env whose tools differ from
item to item (BFCL: each entry brings its own functions) declares none and says why
(``TextEnv.static_tools_absent``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# a parameter's Python type -> its JSON-schema type
JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolCallError(ValueError):
    """A tool call whose name or arguments the declaration does not take; the message says which."""


@dataclass(frozen=True)
class ToolParam:
    """One parameter of a tool: its name, Python type (str, int, float or bool) and what it is."""

    name: str
    type: type
    description: str

    def __post_init__(self) -> None:
        if self.type not in JSON_TYPES:
            raise TypeError(f"tool parameter {self.name!r}: type must be one of str, int, float, bool; got {self.type!r}")


@dataclass(frozen=True)
class EnvTool:
    """One tool of an env. ``action`` turns a call's arguments (checked first) into the env's action text;
    ``ends_episode``: the call answers, and the episode ends with it."""

    name: str
    description: str
    params: tuple[ToolParam, ...]
    action: Callable[[Mapping[str, Any]], str]
    ends_episode: bool = False

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI-style function schema (what chat templates and tool-calling APIs take)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object",
                           "properties": {p.name: {"type": JSON_TYPES[p.type], "description": p.description}
                                          for p in self.params},
                           "required": [p.name for p in self.params]}}}

    def to_action(self, arguments: Mapping[str, Any]) -> str:
        """The env's action text for a call with ``arguments``; a missing, unknown or mistyped one is refused."""
        names = [p.name for p in self.params]
        if unknown := sorted(set(arguments) - set(names)):
            raise ToolCallError(f"tool {self.name!r} takes {', '.join(names)}; got unknown {', '.join(unknown)}")
        for p in self.params:
            if p.name not in arguments:
                raise ToolCallError(f"tool {self.name!r} needs {p.name!r}")
            value = arguments[p.name]
            ok = isinstance(value, p.type) and not (p.type is not bool and isinstance(value, bool))
            if p.type is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise ToolCallError(f"tool {self.name!r}: {p.name} must be {JSON_TYPES[p.type]}, got {value!r}")
        return self.action(arguments)


def tag_action(tag: str, param: str) -> Callable[[Mapping[str, Any]], str]:
    """A call written as ``<tag>value</tag>``."""
    return lambda args: f"<{tag}>{args[param]}</{tag}>"


def hermes_action(name: str) -> Callable[[Mapping[str, Any]], str]:
    """A call written as a Hermes ``<tool_call>`` JSON block (what chat templates render for native tools)."""
    return lambda args: "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(args)}) + "\n</tool_call>"


def find_tool(tools: tuple[EnvTool, ...], name: str) -> EnvTool:
    """The declared tool called ``name``; an unknown name is one error listing the declared ones."""
    for tool in tools:
        if tool.name == name:
            return tool
    raise ToolCallError(f"no tool {name!r}; the env declares {', '.join(t.name for t in tools) or 'none'}")
