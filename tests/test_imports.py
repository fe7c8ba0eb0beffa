"""busd's modules import one way: down the layers of LAYERS, with no cycle, however indirect,
and no import hidden inside a function to dodge one (those count too). Only `if TYPE_CHECKING:`
imports are left out, since they never run."""

from __future__ import annotations

import ast
from pathlib import Path

import busd

PACKAGE = Path(busd.__file__).parent

# busd's packages from the top down (docs/development.md#layout). A module may import its own
# layer and the layers below it, never one above: the command line and the test plugin drive
# the server, which serves HTTP and AMQP; the broker's links (what a client attaches) sit on
# the broker (what a process serves), which sits on the rules, the AMQP codec, the entity
# model and the store. A module belongs to the longest prefix listed.
LAYERS: list[set[str]] = [
    {"busd.cli", "busd.testing", "busd.__main__"},
    {"busd.client", "busd.server"},
    {"busd.http"},
    {"busd.config", "busd.observability"},
    {"busd.broker.links"},
    {"busd.broker"},
    {"busd.rules"},
    {"busd.amqp"},
    {"busd.entities"},
    {"busd.storage", "busd.net"},
    {"busd.auth", "busd.errors", "busd.units", "busd.process", "busd"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from busd.broker import cbs` imports the submodule busd.broker.links.cbs
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, name, modules) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_of(module: str, layers: list[set[str]] = LAYERS) -> int:
    """The index of the module's layer in `layers` (0 the top): its longest listed prefix's."""
    best, found = "", -1
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, found = prefix, index
    if found < 0:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS")
    return found


def upward_imports(
    graph: dict[str, set[str]], layers: list[set[str]] = LAYERS
) -> list[tuple[str, str]]:
    """Every (importer, imported) pair where the imported module is in a layer above."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if layer_of(target, layers) < layer_of(module, layers)
    )


def test_busd_imports_run_down_the_layers():
    upward = upward_imports(import_graph())
    assert not upward, "imports that run up the layers:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in upward
    )


def test_the_layer_check_finds_an_upward_import():
    layers = [{"p.top"}, {"p.low"}]
    assert upward_imports({"p.low.a": {"p.top.b"}, "p.top.b": set()}, layers) == [
        ("p.low.a", "p.top.b")
    ]
    assert upward_imports({"p.top.b": {"p.low.a"}, "p.low.a": set()}, layers) == []


def test_busd_imports_have_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "busd.server.lifecycle" in graph["busd.cli.serve"]  # imported late, inside serve()
