"""Imports follow the data: no module imports a later stage, and the import graph has no cycle.

Stages, in the order data flows (docs/ARCHITECTURE.md): grading, episode, corpora → envs →
agents (rollout) → rewards → training, evals → cli. Every import of a turngym module counts,
including imports inside functions: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import turngym

PACKAGE = Path(turngym.__file__).resolve().parent

# The first dotted part under ``turngym`` names the stage; top-level modules are listed whole.
STAGES = {
    "_version": 0, "cache": 0, "registry": 0, "extras": 0,
    "procs": 0, "grading": 0, "oracles": 0, "truth": 0, "episode": 0, "corpora": 0,
    "envs": 1,
    "turngym": 1,  # the package itself: registers the envs on import
    "agents": 2,
    "rewards": 3,
    "training": 4, "evals": 4, "importers": 4,
    "cli": 5, "__main__": 5,
}
STAGE_NAMES = ["grading/episode/corpora", "envs", "agents", "rewards", "training/evals", "cli"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "turngym"
    if key not in STAGES:
        raise AssertionError(f"module {module} is in no stage; add turngym.{key} to STAGES in tests/test_layers.py")
    return STAGES[key]


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def walk(tree: ast.AST, runtime: bool):
    """Every node; with ``runtime``, none under ``if TYPE_CHECKING:`` (annotations only, never imported)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not (runtime and is_type_checking_block(c)))


def collect(runtime: bool = False) -> dict[str, set[str]]:
    """Module → the turngym modules it imports (anywhere in its body; ``runtime``: when it runs)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: set[str] = set()
        for node in walk(tree, runtime):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets.add(source)
                targets.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in files)
        graph[mod] = {t for t in targets if t in files and t != mod}
    return graph


GRAPH = collect()
RUNTIME_GRAPH = collect(runtime=True)  # a type-only import back into a module is no cycle when it runs


def test_every_module_is_in_a_stage():
    for mod in GRAPH:
        stage(mod)


def test_no_module_imports_a_later_stage():
    bad = [f"{mod} ({STAGE_NAMES[stage(mod)]}) imports {dep} ({STAGE_NAMES[stage(dep)]})"
           for mod, deps in sorted(GRAPH.items()) for dep in sorted(deps) if stage(dep) > stage(mod)]
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    colour: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if colour.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in colour:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if node not in colour:
            found = visit(node)
            if found:
                return found
    return None


def test_import_graph_has_no_cycle():
    cycle = find_cycle(RUNTIME_GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_catch_a_violation_and_a_cycle():
    """The checks themselves can fail: a planted backward import and a planted cycle are found."""
    assert stage("turngym.envs.search_qa") < stage("turngym.training.trainer")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    with pytest.raises(AssertionError, match="no stage"):
        stage("turngym.nowhere.x")


def test_type_only_imports_count_for_layers_but_not_for_cycles():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import turngym.x\nimport turngym.y\n")
    names = lambda runtime: {a.name for n in walk(tree, runtime) if isinstance(n, ast.Import) for a in n.names}  # noqa: E731
    assert names(False) == {"turngym.x", "turngym.y"} and names(True) == {"turngym.y"}
    assert "turngym.envs.bfcl.env" in GRAPH["turngym.envs.bfcl.modes"]  # annotations name the env: layer-checked


def test_the_graph_sees_imports_inside_functions():
    assert "turngym.rewards.nli" in GRAPH["turngym.rewards.equivalence"]  # NLIEquivalence.load imports it lazily


def test_registry_entry_points_honour_the_order_too():
    """Registries import their parts by path at run time; those paths must not reach a later stage either."""
    from turngym.envs import ENTRY_POINTS
    from turngym.rewards.base import JOINED, REWARDS
    from turngym.training.advantages import ESTIMATORS

    tables = {"turngym.envs": ENTRY_POINTS.values(), "turngym.rewards.base": [*REWARDS.values(), JOINED],
              "turngym.training.advantages": ESTIMATORS.values()}
    for owner, entries in tables.items():
        for entry in entries:
            module = entry.partition(":")[0]
            assert module in GRAPH, f"{owner}: entry point {entry} names no turngym module"
            assert stage(module) <= stage(owner), f"{owner}: entry point {entry} is in a later stage"
