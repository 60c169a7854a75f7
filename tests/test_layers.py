"""Imports follow the data: no module imports a later stage, and the import graph has no cycle;
no module reaches a private attribute of another module's object, nor imports a private module of another package.

Stages, in the order data flows (docs/ARCHITECTURE.md): grading, episode, corpora → envs →
agents (rollout) → rewards → the runner's env backends → training → run → outward adapters
(integrations) → credit, views → evals → cli. Every
import of a turngym module counts, including imports inside functions and type-only imports under
``if TYPE_CHECKING:`` (an annotation that names a later stage is still a dependency on it). The
graph has no cycle when it runs, and none through type-only imports either: those never run, yet a
type-only import back still ties two modules together.

Private reach: ``obj._name`` is allowed on ``self`` / ``cls`` and on a name the same module defines
(its own class's instances); anything else is a reach into another module's internals, except the
third-party seams listed in ``THIRD_PARTY_PRIVATE`` with the reason each has no public equivalent.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import turngym

PACKAGE = Path(turngym.__file__).resolve().parent

# The first dotted part under ``turngym`` names the stage (a two-part key, ``run.backends``, names a room that
# stands apart from its package); top-level modules are listed whole.
STAGES = {
    "_version": 0, "cache": 0, "registry": 0, "extras": 0, "progress": 0,
    "procs": 0, "grading": 0, "oracles": 0, "truth": 0, "corpora": 0,
    # the record, its store, reader and migrations; the reader finds an env's declarations as an
    # episode.migrations.EnvDeclarations (TextEnv is one), never by importing the envs
    "episode": 0,
    "sandbox": 0,  # code sandboxes: below the envs that run cells in them
    "envs": 1,
    "turngym": 1,  # the package itself: registers the envs on import
    "agents": 2,
    "rewards": 3,
    # the runner's env backends: env handles whose envs live elsewhere (an OpenEnv server, a Ray actor pool),
    # below the trainer, which plays its rollouts on them
    "run.backends": 4,
    "training": 5, "importers": 5,
    "run": 6,  # the run pipeline and the outputs it claims (locked, run.json); the runner writes the episodes
    # outward adapters: turngym envs and episodes in other stacks (TRL, SkyRL, verifiers, lm-eval, OpenEnv, verl),
    # above training, whose estimators they score with; nothing below reaches up to them
    "integrations": 7,
    "credit": 8,  # credit accuracy, ablation, creditbench, oracles: per-turn credit against truth
    "views": 8,  # reports, the episode viewer, trackers: what runs wrote, shown
    "evals": 9,  # the eval and main jobs
    "cli": 10, "__main__": 10,
}
STAGE_NAMES = ["grading/episode/corpora", "envs", "agents", "rewards", "backends", "training", "run", "adapters",
               "credit/views", "evals", "cli"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage(module: str) -> int:
    parts = module.split(".")
    if ".".join(parts[1:3]) in STAGES:
        return STAGES[".".join(parts[1:3])]
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


FILES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
TREES = {mod: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for mod, path in FILES.items()}


def imports_of(mod: str, tree: ast.AST, is_pkg: bool, known: set[str], runtime: bool = False) -> set[str]:
    """The ``known`` modules that ``mod`` imports (anywhere in its body; ``runtime``: when it runs)."""
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
            targets.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known)
    return {t for t in targets if t in known and t != mod}


def collect(runtime: bool = False) -> dict[str, set[str]]:
    """Module → the turngym modules it imports (anywhere in its body; ``runtime``: when it runs)."""
    return {mod: imports_of(mod, TREES[mod], FILES[mod].name == "__init__.py", set(FILES), runtime) for mod in FILES}


GRAPH = collect()
RUNTIME_GRAPH = collect(runtime=True)  # a type-only import back into a module is no cycle when it runs


def test_every_module_is_in_a_stage():
    for mod in GRAPH:
        stage(mod)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return [f"{mod} ({STAGE_NAMES[stage(mod)]}) imports {dep} ({STAGE_NAMES[stage(dep)]})"
            for mod, deps in sorted(graph.items()) for dep in sorted(deps) if stage(dep) > stage(mod)]


def test_no_module_imports_a_later_stage():
    bad = layer_violations(GRAPH)
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def private_module_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a ``_private`` module from outside the package that holds it (``turngym.cli._progress``
    from ``turngym.training``): a private module is its package's own; what others need belongs in a public one."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            parts = dep.split(".")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                if part.startswith("_") and not part.startswith("__") and not (mod == owner or mod.startswith(owner + ".")):
                    bad.append(f"{mod} imports {dep}, private to {owner}")
    return bad


def test_no_module_imports_another_packages_private_module():
    bad = private_module_imports(GRAPH)
    assert not bad, "private modules imported from outside their package:\n" + "\n".join(bad)


def test_the_private_module_check_can_fail():
    assert private_module_imports({"turngym.training.progress": {"turngym.cli._progress"}}) == [
        "turngym.training.progress imports turngym.cli._progress, private to turngym.cli"]
    assert private_module_imports({"turngym.cli.run": {"turngym.cli._progress", "turngym._version"},
                                   "turngym.cli._progress": {"turngym.progress"}}) == []


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


def test_no_cycle_through_type_only_imports_either():
    """A type-only import back into a module is no cycle when it runs, but the two modules still know each
    other (episode ↔ truth and the run pipeline ↔ its writers were such pairs): what both need belongs in one
    of them, or in a module both import."""
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle through a type-only import: " + " -> ".join(cycle)


def test_the_checks_catch_a_violation_and_a_cycle():
    """The checks themselves can fail: a planted backward import and a planted cycle are found."""
    assert stage("turngym.envs.search_qa") < stage("turngym.training.trainer")
    assert stage("turngym.run.backends.openenv") < stage("turngym.training.trainer") < stage("turngym.run.pipeline")
    assert stage("turngym.training.advantages") < stage("turngym.integrations.skyrl")
    assert layer_violations({"turngym.training.config": {"turngym.integrations.trl"}}) == [
        "turngym.training.config (training) imports turngym.integrations.trl (adapters)"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    with pytest.raises(AssertionError, match="no stage"):
        stage("turngym.nowhere.x")


def test_type_only_imports_count_for_layers_but_not_for_cycles():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import turngym.x\nimport turngym.y\n")
    names = lambda runtime: {a.name for n in walk(tree, runtime) if isinstance(n, ast.Import) for a in n.names}  # noqa: E731
    assert names(False) == {"turngym.x", "turngym.y"} and names(True) == {"turngym.y"}
    # the run pipeline names Episode only in annotations: layer-checked, yet no runtime edge
    assert "turngym.episode" in GRAPH["turngym.run.pipeline"] and "turngym.episode" not in RUNTIME_GRAPH["turngym.run.pipeline"]


def test_a_type_only_import_of_a_later_stage_is_a_violation():
    """A planted ``if TYPE_CHECKING:`` import of the trainer from an env module is reported like a real one."""
    planted = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from turngym.training.trainer import TurnGRPOTrainer\n")
    deps = imports_of("turngym.envs.planted", planted, False, set(FILES))
    assert deps == {"turngym.training.trainer"}
    assert imports_of("turngym.envs.planted", planted, False, set(FILES), runtime=True) == set()
    assert layer_violations({"turngym.envs.planted": deps}) == [
        "turngym.envs.planted (envs) imports turngym.training.trainer (training)"]


# Third-party private names turngym must touch, each with why no public one serves (keyed by the expression).
THIRD_PARTY_PRIVATE = {
    "os._exit": "the standard library's documented exit without cleanup, for a forked sandbox worker",
    "argparse._SubParsersAction": "argparse exposes its subparsers action type under this name only",
    "parser._actions": "HfArgumentParser (argparse) lists its options only here; TRL flags are read through it",
    "self.trainer._generate_single_turn": "TRL GRPOTrainer's generation step, the seam turngym's rollouts replace",
    "ray_worker._global_node": "Ray tells whether this process started its cluster (the driver's node is the head) "
                               "only on the driver's node object",
    "runner._evaluate_single_ast_entry": "bfcl-eval's own evaluator, the reference the tests compare against",
    "runner._evaluate_single_relevance_entry": "bfcl-eval's own evaluator (as above)",
    "runner._evaluate_single_multi_turn_entry": "bfcl-eval's own evaluator (as above)",
    "_runner()._evaluate_single_agentic_entry": "bfcl-eval's own evaluator (as above)",
    "next(iter(self.session.instances.values()))._flush_memory_to_local_file":
        "bfcl-eval's memory backend saves its snapshot only through this method (its own handler calls it)",
}


def own_private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines itself: functions, classes, assigned names and attributes."""
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    return {x for x in names if x.startswith("_")}


def private_reaches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, expression) of every ``obj._name`` on an object other than self/cls whose private name this
    module does not define (dunders are public protocol)."""
    own = own_private_names(tree)
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Attribute) and n.attr.startswith("_")) or (n.attr.startswith("__") and n.attr.endswith("__")):
            continue
        if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
            continue
        if n.attr not in own:
            out.append((n.lineno, ast.unparse(n)))
    return out


def test_no_module_reaches_into_another_modules_private_attributes():
    bad = [f"{FILES[mod].relative_to(PACKAGE.parent)}:{line}: {expr}" for mod, tree in sorted(TREES.items())
           for line, expr in private_reaches(tree) if expr not in THIRD_PARTY_PRIVATE]
    assert not bad, "private attributes reached from another module (add a public method, or a declared seam):\n" \
        + "\n".join(bad)


def test_the_private_reach_check_can_fail():
    planted = ast.parse("import other\n"
                        "other.thing._secret\n"
                        "class Box:\n"
                        "    def __init__(self):\n"
                        "        self._mine = 1\n"
                        "    def same(self, other_box):\n"
                        "        return other_box._mine + self._mine + len(self.__dict__)\n"
                        "    @classmethod\n"
                        "    def make(cls):\n"
                        "        return cls._factory\n")
    assert private_reaches(planted) == [(2, "other.thing._secret")]


def test_the_graph_sees_imports_inside_functions():
    assert "turngym.rewards.nli" in GRAPH["turngym.rewards.equivalence"]  # NLIEquivalence.load imports it lazily


def test_registry_entry_points_honour_the_order_too():
    """Registries import their parts by path at run time; those paths must not reach a later stage either."""
    from turngym.envs import ENTRY_POINTS
    from turngym.rewards.base import JOINED, REWARDS
    from turngym.training.advantages import ESTIMATORS

    tables = {"turngym.envs": ENTRY_POINTS.values(), "turngym.rewards.base": [*REWARDS.values(), JOINED],
              # entry points only: an estimator registered at run time as a function (an --external one) has none
              "turngym.training.advantages": [s.function for s in ESTIMATORS.values() if isinstance(s.function, str)]}
    for owner, entries in tables.items():
        for entry in entries:
            module = entry.partition(":")[0]
            assert module in GRAPH, f"{owner}: entry point {entry} names no turngym module"
            assert stage(module) <= stage(owner), f"{owner}: entry point {entry} is in a later stage"
