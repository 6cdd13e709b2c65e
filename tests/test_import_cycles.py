"""No import cycles between the modules of `src/randkv`, read statically with `ast`.

Two graphs, each an edge A -> B where a module A imports B:
- import time: the imports that run when A is imported, i.e. at module scope (also inside
  module-level `if`/`try`/`with` blocks and class bodies) but not under
  `if TYPE_CHECKING:`. A cycle here can fail at import.
- every import: also those inside functions (run when called) and under `if TYPE_CHECKING:`
  (read by type checkers). A cycle here ties two rooms that should stand one on the other:
  a lazy import in a function only hides it (issue 20's `randkv.vllm.engine_args` <->
  `randkv.vllm.kv_spec` circle ran through one, and `randkv.hf.cache` -> `randkv.selectors`
  -> `selectors/hooks.py` -> `randkv.hf.cache` through a TYPE_CHECKING import).

The same graphs check the layering (docs/architecture.md): each layer imports only the
layers below it, and nothing in `randkv` imports the studies of the checkout.

Relative imports are resolved, and `from pkg import name` points at `pkg.name` when that is
a module, else at `pkg`. Importing `a.b.c` also runs the `__init__` of the packages `a.b`
and `a` unless the importer lives in them (then they are already being imported), so those
packages are edges too.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"

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


def _import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `body` that run when the module is imported."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue  # runs only when called
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(node.orelse)
        elif isinstance(node, ast.ClassDef | ast.With | ast.For | ast.While):
            yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_time_nodes(block)
            for handler in node.handlers:
                yield from _import_time_nodes(handler.body)


def _every_import_node(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth (functions, TYPE_CHECKING blocks)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


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


def import_graph(
    src: Path,
    package: str,
    *,
    every_import: bool = False,
    ignore: Collection[tuple[str, str]] = (),
) -> dict[str, set[str]]:
    """Module -> the modules of `package` that importing it runs (its import-time edges);
    with `every_import`, also those its functions and TYPE_CHECKING blocks import. The
    (importer, imported) pairs in `ignore` are left out, with the packages they pass."""
    modules = module_files(src, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        own = {*_packages_above(name), name}  # already being imported when `name` runs
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        nodes = _every_import_node(tree) if every_import else _import_time_nodes(tree.body)
        for node in nodes:
            for target in _targets(node, name, is_package, modules):
                if (name, target) in ignore:
                    continue
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


def _unexpected(cycles: list[list[str]]) -> list[list[str]]:
    return [c for c in cycles if tuple(sorted(set(c))) not in ALLOWED_CYCLES]


def test_randkv_has_no_import_cycles():
    cycles = _unexpected(find_cycles(import_graph(SRC, "randkv")))
    assert not cycles, "import cycles (module-scope imports):\n" + _describe(cycles)


def test_randkv_has_no_cycles_through_lazy_or_type_checking_imports_either():
    cycles = _unexpected(find_cycles(import_graph(SRC, "randkv", every_import=True)))
    assert not cycles, "import cycles (imports in functions and TYPE_CHECKING too):\n" + (
        _describe(cycles)
    )


def test_the_studies_have_no_import_cycles_either():
    for every_import in (False, True):
        cycles = find_cycles(import_graph(REPO, "studies", every_import=every_import))
        assert not cycles, _describe(cycles)


def test_the_graph_sees_the_project_s_imports():
    graph = import_graph(SRC, "randkv")
    assert "randkv.selectors" in graph["randkv.hf.cache"]  # `from randkv.selectors import`
    planner = graph["randkv.kernels.planner"]
    # `from randkv.spec.config import`: the package above it runs too
    assert {"randkv.spec.config", "randkv.spec"} <= planner
    assert not {"randkv.kernels", "randkv"} & planner  # already being imported: ancestors
    assert "randkv.hf.hooks" in graph["randkv.hf.generate"]
    assert "randkv.spec" in graph["randkv.kernels.triton_planner"]  # `from randkv import spec`
    # The plugin imports the rest of randkv.vllm inside its functions (vLLM loads it in
    # every process): seen by the every-import graph only.
    every = import_graph(SRC, "randkv", every_import=True)
    assert "randkv.vllm.entrypoints.engine_args" not in graph["randkv.vllm.plugin"]
    assert "randkv.vllm.entrypoints.engine_args" in every["randkv.vllm.plugin"]


#: Each part of `randkv` and the parts it may import (besides itself and the `randkv` root,
#: which re-exports the spec), bottom up: a part imports only parts above it in this table.
LAYERS: dict[str, set[str]] = {
    # 1. the executable spec, standard library only
    "randkv.spec": set(),
    # 1. the user cache and the shipped models (a leaf used by every layer above)
    "randkv.models": set(),
    # 2. torch and Triton kernels
    "randkv.kernels": {"randkv.spec"},
    # 3. engine integration and adapters
    "randkv.selectors": {"randkv.spec", "randkv.kernels"},
    "randkv.hf": {"randkv.spec", "randkv.kernels", "randkv.selectors"},
    "randkv.vllm": {"randkv.spec", "randkv.kernels", "randkv.models"},
    # 4. what users run
    **{
        top: {
            "randkv.spec",
            "randkv.kernels",
            "randkv.models",
            "randkv.selectors",
            "randkv.hf",
            "randkv.vllm",
            "randkv.bench",
            "randkv.demo",
        }  # fmt: skip
        for top in ("randkv.bench", "randkv.check", "randkv.demo")
    },
    # 4. per-request memory from a config.json: plain arithmetic over the spec
    "randkv.memory": {"randkv.spec"},
    "randkv.cli": {
        "randkv.spec",
        "randkv.memory",
        "randkv.models",
        "randkv.vllm",
        "randkv.bench",
        "randkv.check",
        "randkv.demo",
    },  # fmt: skip
    "randkv.__main__": {"randkv.cli"},
}


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_each_layer_imports_only_the_layers_below_it():
    graph = import_graph(SRC, "randkv", every_import=True)
    assert {_part(m) for m in graph} - {"randkv"} == set(LAYERS)  # every part has its row
    crossings = sorted(
        f"{importer} -> {imported}"
        for importer, targets in graph.items()
        for imported in targets
        if importer != "randkv"
        and _part(imported) not in {_part(importer), "randkv", *LAYERS[_part(importer)]}
    )
    assert not crossings, "imports across the layers:\n" + "\n".join(crossings)
    assert graph["randkv"] <= {"randkv.spec"} | {m for m in graph if m.startswith("randkv.spec")}
    assert graph["randkv.spec"] and graph["randkv.kernels.planner"]  # the graph is not empty


#: The rooms of `randkv.vllm` (docs/architecture.md), bottom up, and the rooms each may import
#: besides its own. The workers read three of the scheduler's modules, as vLLM's workers read
#: its scheduler output: what a step sends them, the KV cache groups, the block arithmetic.
VLLM_ROOMS: dict[str, set[str]] = {
    "common": set(),  # options, refusals, metrics, class_swap: read by every room
    "release": {"common"},  # versions, compat, touchpoints, wheels
    "sched": {"common", "release", "sched data"},
    "worker": {"common", "release", "sched data"},
    "sched data": {"common", "release"},
    "front": {"common", "release", "sched", "sched data", "worker"},  # entry points, checks
}
_SCHED_DATA = {"output", "kv_groups", "allocation"}
_FRONT = {"randkv.vllm", "randkv.vllm.plugin", "randkv.vllm.release.support",
          "randkv.vllm.release.drift"}  # fmt: skip


def _vllm_room(module: str) -> str:
    if module in _FRONT or module.startswith("randkv.vllm.entrypoints"):
        return "front"
    parts = module.split(".")
    if len(parts) == 3 and parts[2] not in ("sched", "worker", "release"):
        return "common"
    if parts[2] == "sched":  # the package itself imports nothing: the workers pass it
        return "sched data" if len(parts) == 3 or parts[3] in _SCHED_DATA else "sched"
    return parts[2]  # release, worker


def test_the_vllm_rooms_import_only_the_rooms_below_them():
    graph = import_graph(SRC, "randkv", every_import=True)
    modules = [m for m in graph if m.startswith("randkv.vllm")]
    assert {_vllm_room(m) for m in modules} == set(VLLM_ROOMS)  # every room is populated
    crossings = sorted(
        f"{importer} ({_vllm_room(importer)}) -> {imported} ({_vllm_room(imported)})"
        for importer in modules
        for imported in graph[importer]
        if imported.startswith("randkv.vllm")
        and _vllm_room(imported) not in {_vllm_room(importer), *VLLM_ROOMS[_vllm_room(importer)]}
    )
    assert not crossings, "imports across randkv.vllm's rooms:\n" + "\n".join(crossings)


def test_randkv_vllm_keeps_a_small_top_level():
    """At most six modules beside the rooms (sched, worker, entrypoints, release)."""
    top = SRC / "randkv" / "vllm"
    assert len(list(top.glob("*.py"))) <= 6
    rooms = {p.name for p in top.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {"sched", "worker", "entrypoints", "release"}


def test_the_spec_imports_only_the_standard_library():
    import sys

    for name, path in module_files(SRC, "randkv.spec").items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {  # read by type checkers only
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and _is_type_checking(block.test)
            for statement in block.body
            for node in ast.walk(statement)
        }
        for node in _every_import_node(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__"):
                continue
            roots = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for root in (r.split(".")[0] for r in roots):
                assert root in sys.stdlib_module_names or root == "randkv", (name, root)


def test_the_library_never_imports_the_studies():
    for name, path in module_files(SRC, "randkv").items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _every_import_node(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            assert not any(n.split(".")[0] == "studies" for n in names), name


def test_selectors_do_not_import_the_transformers_adapter():
    graph = import_graph(SRC, "randkv", every_import=True)
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
    for every_import in (False, True):
        cycles = find_cycles(import_graph(src, "planted", every_import=every_import))
        assert cycles == [["planted.a", "planted.b", "planted.b.c", "planted.a"]]


def test_a_planted_lazy_or_type_checking_cycle_is_reported_as_such(tmp_path):
    src = _plant(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/a.py": "from planted import b\n",
            "planted/b.py": "def f():\n    import planted.a\n",
            "planted/c.py": "import planted.d\n",
            "planted/d.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted import c\n"
            ),
        },
    )
    assert find_cycles(import_graph(src, "planted")) == []  # nothing fails at import
    assert find_cycles(import_graph(src, "planted", every_import=True)) == [
        ["planted.a", "planted.b", "planted.a"],
        ["planted.c", "planted.d", "planted.c"],
    ]
    ignored = import_graph(src, "planted", every_import=True, ignore={("planted.b", "planted.a")})
    assert find_cycles(ignored) == [["planted.c", "planted.d", "planted.c"]]


def test_the_kv_spec_circle_of_issue_20_would_be_reported(tmp_path):
    """The shape the real tree had: a module-level import one way, a lazy one back."""
    src = _plant(
        tmp_path,
        {
            "randkv/__init__.py": "",
            "randkv/vllm/__init__.py": "",
            "randkv/vllm/engine_args.py": (
                "def check_kv_cache_groups():\n"
                "    from randkv.vllm.kv_spec import RandKVFullAttentionSpec\n"
            ),
            "randkv/vllm/kv_spec.py": "from randkv.vllm.engine_args import config_from_vllm\n",
        },
    )
    assert find_cycles(import_graph(src, "randkv")) == []
    assert find_cycles(import_graph(src, "randkv", every_import=True)) == [
        ["randkv.vllm.engine_args", "randkv.vllm.kv_spec", "randkv.vllm.engine_args"]
    ]
