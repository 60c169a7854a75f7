"""Model outputs built from BFCL ground truths, correct and mutated, for the parity tests.

Mutations follow the ways calls go wrong: a changed value, a missing parameter, a wrong
function, an extra or a missing call, a wrong order, a user turn left unanswered.
"""

from __future__ import annotations

import json
import re
from typing import Any

from turngym.envs.bfcl.calls import calls_from_strings, render_prompting

END_TURN = "I have finished this request."


def render_native(calls: list[dict[str, dict[str, Any]]], name_map: dict[str, str] | None = None) -> str:
    """Calls as Hermes ``<tool_call>`` blocks (``name_map``: original -> tool name)."""
    return "\n".join(
        "<tool_call>" + json.dumps({"name": (name_map or {}).get(name, name), "arguments": args}) + "</tool_call>"
        for c in calls for name, args in c.items())


# ------------------------------------------------------------------ multi-turn


def _mutate_value(v: Any) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + 7
    if isinstance(v, str):
        return v + "_x"
    if isinstance(v, list):
        return v[:-1] if v else ["x"]
    return "x"


def multi_turn_mutations(ground_truth: list[list[str]], params, methods: list[str],
                         seed: int) -> dict[str, list[list[list[dict]]]]:
    """name -> per user turn, per step, the decoded calls of that step."""
    turns = [calls_from_strings(t, params) for t in ground_truth]
    nonempty = [i for i, t in enumerate(turns) if t]
    out: dict[str, list[list[list[dict]]]] = {"correct": [[t] if t else [] for t in turns],
                                              "one_call_per_step": [[[c] for c in t] for t in turns]}
    if not nonempty:
        return out
    u = nonempty[seed % len(nonempty)]

    def with_turn(new_calls: list[dict]) -> list[list[list[dict]]]:
        steps = [[t] if t else [] for t in turns]
        steps[u] = [new_calls] if new_calls else []
        return steps

    calls = turns[u]
    with_args = [k for k, c in enumerate(calls) if next(iter(c.values()))]
    if with_args:
        k = with_args[seed % len(with_args)]
        name, args = next(iter(calls[k].items()))
        key = sorted(args)[0]
        changed = [dict(c) for c in calls]
        changed[k] = {name: {**args, key: _mutate_value(args[key])}}
        out["changed_value"] = with_turn(changed)
        dropped = [dict(c) for c in calls]
        dropped[k] = {name: {a: v for a, v in args.items() if a != key}}
        out["missing_parameter"] = with_turn(dropped)
    name, args = next(iter(calls[-1].items()))
    others = [m for m in methods if m != name]
    wrong = others[seed % len(others)]
    out["wrong_function"] = with_turn(calls[:-1] + [{wrong: args}])
    out["unknown_function"] = with_turn(calls[:-1] + [{name + "_v2": args}])
    out["extra_call"] = with_turn(calls + [calls[-1]])
    out["missing_call"] = with_turn(calls[:-1])
    if len(calls) >= 2:
        out["wrong_order"] = with_turn(list(reversed(calls)))
    out["unanswered_turn"] = with_turn([])
    return out


def render_steps(steps: list[list[dict]], tool_format: str, name_map: dict[str, str] | None = None) -> list[str]:
    """One user turn's step texts, ending the turn the way a model does: a reply without calls."""
    render = (lambda c: render_native(c, name_map)) if tool_format == "native" else render_prompting
    return [render(s) for s in steps] + [END_TURN]


# ------------------------------------------------------------------ single-turn


def _pick(options: Any) -> tuple[bool, Any]:
    """(include?, value) from a ground-truth option list; '' marks an optional parameter."""
    if isinstance(options, list) and options:
        first = options[0]
        if first == "":
            return False, None
        if isinstance(first, dict):
            return True, {k: _pick(v)[1] for k, v in first.items() if _pick(v)[0]}
        return True, first
    return True, options


def gt_calls(ground_truth: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    calls = []
    for call in ground_truth:
        name, params = next(iter(call.items()))
        args = {}
        for p, options in params.items():
            keep, value = _pick(options)
            if keep:
                args[p] = value
        calls.append({name: args})
    return calls


def _source_value(v: Any) -> str:
    """A Java / JavaScript literal as a model would write it (bfcl-eval's checker reads strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v if re.fullmatch(r"[A-Za-z_][\w.]*|new .*|\[.*\]|\{.*\}", v) else json.dumps(v)
    return json.dumps(v)


def render_single(calls: list[dict], tool_format: str, language: str, name_map: dict[str, str] | None = None) -> str:
    if tool_format == "native":
        if language != "python":
            calls = [{n: {k: v if isinstance(v, str) else _source_value(v) for k, v in a.items()}}
                     for c in calls for n, a in c.items()]
        return render_native(calls, name_map)
    if language == "python":
        return render_prompting(calls)
    parts = [f"{n}({', '.join(f'{k}={_source_value(v)}' for k, v in a.items())})" for c in calls for n, a in c.items()]
    return "[" + ", ".join(parts) + "]"


def single_turn_outputs(calls: list[dict], functions: list[dict]) -> dict[str, list[dict]]:
    """name -> decoded calls (before rendering)."""
    out: dict[str, list[dict]] = {"correct": calls}
    name, args = next(iter(calls[0].items()))
    if args:
        key = sorted(args)[0]
        out["changed_value"] = [{name: {**args, key: _mutate_value(args[key])}}] + calls[1:]
        out["missing_parameter"] = [{name: {k: v for k, v in args.items() if k != key}}] + calls[1:]
        out["wrong_type"] = [{name: {**args, key: [args[key]]}}] + calls[1:]
    other = [f["name"] for f in functions if f["name"] != name]
    out["wrong_function"] = [{(other[0] if other else name + "_v2"): args}] + calls[1:]
    out["extra_call"] = calls + [calls[-1]]
    if len(calls) >= 2:
        out["missing_call"] = calls[:-1]
        out["reordered"] = list(reversed(calls))
    return out
