"""No import cycles between the modules of `src/randkv`, read statically with `ast`.

What counts as an edge A -> B: an import that runs when A is imported, i.e. one at module
scope (also inside module-level `if`/`try`/`with` blocks and class bodies), not one inside a
function: a lazy import in a function is how the project breaks a cycle on purpose. Imports
under `if TYPE_CHECKING:` never run and do not count for import-time cycles; a second test
counts them too, for the layering (which package knows about which: issue 20's
`randkv.hf.cache` -> `randkv.selectors` -> `selectors/hooks.py` -> `randkv.hf.cache` circle
ran only through such an import). Relative imports are resolved, and
`from pkg import name` points at `pkg.name` when that is a module, else at `pkg`. Importing
`a.b.c` also runs the `__init__` of the packages `a.b` and `a` unless the importer lives in
them (then they are already being imported), so those packages are edges too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Cycles known and accepted for now, each as the sorted tuple of its modules. Empty: there
#: are none. Add one only with a note on why it cannot be broken yet; the lead empties it.
ALLOWED_CYCLES: frozenset[tuple[str, ...]] = frozenset()


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `src` by its dotted name (a package by its own)."""
    modules = {}
    for path in sorted((src / package.replace(".", "/")).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(
    body: list[ast.stmt], type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `body` that run when the module is imported (and, with
    `type_checking`, those a type checker reads under `if TYPE_CHECKING:`)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue  # runs only when called
        elif isinstance(node, ast.If):
            if type_checking or not _is_type_checking(node.test):
                yield from _import_time_nodes(node.body, type_checking)
            yield from _import_time_nodes(node.orelse, type_checking)
        elif isinstance(node, ast.ClassDef | ast.With | ast.For | ast.While):
            yield from _import_time_nodes(node.body, type_checking)
            yield from _import_time_nodes(getattr(node, "orelse", []), type_checking)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_time_nodes(block, type_checking)
            for handler in node.handlers:
                yield from _import_time_nodes(handler.body, type_checking)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` names, or the nearest module above it (None outside `modules`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]
) -> Iterator[str]:
    """The modules of `modules` an import statement names: `from pkg import name` names
    `pkg.name` when that is a module, else `pkg`."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: up from the importer's package
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{alias.name}" for alias in node.names]
    for name in names:
        target = _resolve(name, modules)
        if target is not None:
            yield target


def _packages_above(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(src: Path, package: str, *, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of `package` that importing it runs (its import-time edges);
    with `type_checking`, also those it imports under `if TYPE_CHECKING:`."""
    modules = module_files(src, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        own = {*_packages_above(name), name}  # already being imported when `name` runs
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in _import_time_nodes(tree.body, type_checking):
            for target in _targets(node, name, is_package, modules):
                edges.add(target)
                edges.update(p for p in _packages_above(target) if p not in own)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module, as a path
    A -> B -> ... -> A (Tarjan's algorithm, then a walk inside the component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A closed path through part of a strongly connected component, from its first module."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nxt = min(n for n in graph[path[-1]] if n in component)
        if nxt in seen:
            return [*path[path.index(nxt) :], nxt]
        path.append(nxt)
        seen.add(nxt)


def _describe(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_randkv_has_no_import_cycles():
    cycles = find_cycles(import_graph(SRC, "randkv"))
    unexpected = [c for c in cycles if tuple(sorted(set(c))) not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles (module-scope imports):\n" + _describe(unexpected)


def test_randkv_has_no_cycles_through_type_checking_imports_either():
    cycles = find_cycles(import_graph(SRC, "randkv", type_checking=True))
    unexpected = [c for c in cycles if tuple(sorted(set(c))) not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles (TYPE_CHECKING imports included):\n" + _describe(
        unexpected
    )


def test_the_graph_sees_the_project_s_imports():
    graph = import_graph(SRC, "randkv")
    assert "randkv.selectors" in graph["randkv.hf.cache"]  # `from randkv.selectors import`
    evaluate = graph["randkv.quality.pointer.evaluate"]
    assert {"randkv.hf.cache", "randkv.hf"} <= evaluate  # randkv.hf's __init__ runs too
    assert "randkv.quality" not in evaluate  # already being imported: an ancestor
    assert "randkv.hf.hooks" in graph["randkv.hf.generate"]
    assert "randkv.hf" not in graph["randkv.selectors"]  # attention_hooks loads lazily
    assert "randkv.spec" in graph["randkv.planner"]  # `from randkv import spec`


def test_selectors_do_not_import_the_transformers_adapter():
    graph = import_graph(SRC, "randkv")
    reached, todo = set(), ["randkv.selectors"]
    while todo:
        for nxt in graph[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    assert not {m for m in reached if m.startswith("randkv.hf")}


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_cycle_is_reported(tmp_path):
    src = _plant(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/a.py": "from planted.b import helper\n",
            # Relative, through a package __init__ that imports c, which imports a.
            "planted/b/__init__.py": "from . import c\nhelper = 1\n",
            "planted/b/c.py": "import planted.a\n",
            "planted/lazy.py": "def f():\n    from planted import a\n",
        },
    )
    cycles = find_cycles(import_graph(src, "planted"))
    assert len(cycles) == 1
    assert cycles[0] == ["planted.a", "planted.b", "planted.b.c", "planted.a"]


def test_lazy_and_type_checking_imports_do_not_count(tmp_path):
    src = _plant(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/a.py": "from planted import b\n",
            "planted/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from planted import a\n"
                "def f():\n    import planted.a\n"
            ),
        },
    )
    assert find_cycles(import_graph(src, "planted")) == []
    cycles = find_cycles(import_graph(src, "planted", type_checking=True))
    assert cycles == [["planted.a", "planted.b", "planted.a"]]
