"""The project's modules import one another one way: no module imports, even inside a function or only
for type checking, a module that imports it back; and each package imports only the packages below it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "stacks", "lambdas", "localrun", "tools", "training")

LAYERS: dict[str, frozenset[str]] = {
    # The shared contract, at the bottom: the layout, the execution state, configs, the catalog, records.
    "contract": frozenset(),
    # The image's runtime and the handlers, each on the contract alone, never on each other.
    "training": frozenset({"contract"}),
    "lambdas": frozenset({"contract"}),
    # The stacks deploy the handlers; the tools read the stacks' templates and the handlers' rules.
    "stacks": frozenset({"contract", "lambdas"}),
    "tools": frozenset({"contract", "lambdas", "stacks"}),
    # The local platform, on top: it runs everything.
    "localrun": frozenset({"contract", "lambdas", "stacks", "tools", "training"}),
}
"""Package -> the other packages of ours it may import."""


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the packages (a package is its ``__init__.py``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The project modules one import statement names (``from a import b`` names ``a.b`` when it is a module)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    found = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in modules:
            found.add(submodule)
        elif base in modules:
            found.add(base)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (top level, functions, TYPE_CHECKING)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= _imported(node, name, is_package, modules)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (first module repeated at the end) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest way from the group's first module back to itself, through the group."""
    start = min(group)
    paths = {target: [start, target] for target in sorted(graph[start] & group)}
    frontier = list(paths)
    while start not in paths:
        next_frontier = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    next_frontier.append(target)
        frontier = next_frontier
    return paths[start]


def test_the_graph_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    graph = import_graph()
    # localrun.aws.engine imports tools.tp inside a method; handler modules import their package's parts.
    assert "tools.tp" in graph["localrun.aws.engine"]
    assert "lambdas.validate.request" in graph["lambdas.validate.handler"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """`module -> imported module` for every import that reaches a package its own may not import."""
    found = []
    for module, targets in sorted(graph.items()):
        package = module.split(".")[0]
        for target in sorted(targets):
            other = target.split(".")[0]
            if other != package and other not in LAYERS[package]:
                found.append(f"{module} -> {target}")
    return found


def test_every_package_has_a_layer() -> None:
    assert set(LAYERS) == set(PACKAGES)


def test_each_package_imports_only_the_layers_below_it() -> None:
    found = layer_violations(import_graph())
    assert not found, "imports across the layers (tests/test_imports.py: LAYERS):\n" + "\n".join(found)


def test_the_layer_check_sees_a_handler_importing_the_runtime() -> None:
    assert layer_violations({"lambdas.x": {"training.trainer"}, "training.trainer": {"contract.layout"}}) == [
        "lambdas.x -> training.trainer"
    ]
