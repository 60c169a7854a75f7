"""One episode's bfcl-eval backend instances, isolated from every other episode.

bfcl-eval's ``execute_multi_turn_func_call`` keeps backend instances (file system,
trading bot, ...) in its module globals, keyed by model name and test id. Each
:class:`BackendSession` uses a fresh random key for its model-side and ground-truth-side
instances and deletes them on :meth:`close`, so concurrent episodes of the same test
id never share state and nothing leaks into the next run.
"""

from __future__ import annotations

import inspect
import json
import uuid
from typing import Any

from turngym.envs.bfcl.calls import guard_execution
from turngym.envs.bfcl.upstream import bfcl

ERROR_PREFIX = "Error during execution: "


def is_error_result(result: str) -> bool:
    """bfcl-eval's exception text, or a backend's own ``{"error": ...}`` reply."""
    if result.startswith(ERROR_PREFIX):
        return True
    if result.startswith("{") and '"error"' in result:
        try:
            return "error" in json.loads(result)
        except json.JSONDecodeError:
            return False
    return False


class BackendSession:
    """Model-side and ground-truth-side backend instances for one multi-turn entry."""

    def __init__(self, entry: dict[str, Any], category: str):
        self._utils = bfcl()["multi_turn_utils"]
        self.entry_id = str(entry["id"])
        self.initial_config = entry.get("initial_config", {})
        self.involved_classes = list(entry["involved_classes"])
        self.long_context = "long_context" in category or "composite" in category
        self.key = f"turngym_{uuid.uuid4().hex}"
        self._gt_key = self.key + "gt"
        _, self.instances = self._run([], self.key)
        self.gt_instances: dict[str, Any] = {}  # created by the first ground-truth call (memory entries have none)
        self.methods = frozenset(
            name for inst in self.instances.values() for name in dir(inst)
            if not name.startswith("_") and callable(getattr(inst, name, None)))
        self.closed = False

    def _run(self, calls: list[str], key: str) -> tuple[list[str], dict[str, Any]]:
        return self._utils.execute_multi_turn_func_call(
            calls, self.initial_config, self.involved_classes, key, self.entry_id,
            long_context=self.long_context, is_evaL_run=False)

    def execute(self, calls: list[str]) -> list[str]:
        """Run the model's calls in order; calls refused by the guard get an error result."""
        if self.closed:
            raise RuntimeError("backend session is closed")
        refused = {i: guard_execution(c, self.methods) for i, c in enumerate(calls)}
        allowed = [c for i, c in enumerate(calls) if refused[i] is None]
        results, self.instances = self._run(allowed, self.key)
        out, it = [], iter(results)
        for i in range(len(calls)):
            out.append(next(it) if refused[i] is None else ERROR_PREFIX + str(refused[i]))
        return out

    def parameters(self, method: str) -> list[str]:
        """The parameter names of a backend method, in order."""
        for inst in self.instances.values():
            fn = getattr(inst, method, None)
            if callable(fn):
                return list(inspect.signature(fn).parameters)
        raise KeyError(f"no backend method {method!r}")

    def execute_ground_truth(self, calls: list[str]) -> list[str]:
        results, self.gt_instances = self._run(list(calls), self._gt_key)
        return results

    def close(self) -> None:
        """Drop this session's instances from bfcl-eval's module globals."""
        if self.closed:
            return
        self.closed = True
        store = vars(self._utils)
        for prefix in (self.key + "_", self._gt_key + "_"):
            for name in [n for n in list(store) if n.startswith(prefix)]:
                store.pop(name, None)

    def __del__(self) -> None:  # an env dropped without close() must not leak its instances
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
