"""The drift check: does a vLLM release still have everything RandKV relies on?

Run it before a user does, against any release whose Python modules import here:

    python -m randkv.vllm.release.drift                          # the installed vLLM
    python -m randkv.vllm.release.drift --release vllm==0.34.0   # a wheel, fetched with --no-deps

It imports every `randkv.vllm` module under that vLLM, then checks three things and lists
each difference (an empty list: no drift):

1. **Imports.** Every `from vllm... import name` in RandKV's source resolves (one
   alternative of a `try: ... except ImportError` is enough).
2. **Overrides.** Every method that RandKV's subclasses of vLLM classes define (its
   scheduler, KV cache manager, workers, KV spec, and the model runner mixins combined with
   each vLLM runner class RandKV uses there) still exists in vLLM, unless it is RandKV's own
   (`randkv_*`), and accepts every parameter vLLM's method has: a keyword vLLM adds to a
   method RandKV overrides fails here, not at a user's first request.
3. **Touch points** (`randkv.vllm.release.touchpoints`): attributes RandKV reads, calls it makes
   with keywords, dataclass fields, attributes vLLM sets on other objects.

Checks apply where RandKV uses them: runner-specific ones where the release runs that
runner, platform-specific ones on that platform (`randkv.vllm.release.versions`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from randkv.vllm.release.touchpoints import TOUCHPOINTS, Touch
from randkv.vllm.release.versions import SUPPORTED, base_version

RANDKV_VLLM = Path(__file__).resolve().parents[1]

#: RandKV modules that only one model runner uses: their vLLM imports and overrides are
#: checked where that runner is used.
RUNNER_MODULES = {
    "randkv.vllm.worker.runner_v1": "v1",
    "randkv.vllm.worker.runner_v2": "v2",
    "randkv.vllm.worker.drafters_v1": "v1",
    "randkv.vllm.worker.drafters_v2": "v2",
}


@dataclass(frozen=True)
class Scope:
    """Where the checked release runs RandKV: its platforms and model runners."""

    platforms: frozenset[str]
    runners: frozenset[str]

    def covers(self, runner: str | None = None, platform: str | None = None) -> bool:
        return (runner is None or runner in self.runners) and (
            platform is None or platform in self.platforms
        )


def scope_of(version: str, distribution: str | None = None) -> Scope:
    """The scope of a supported release (both platforms' rows when no distribution is
    named); for a release not in the table, whatever its modules offer."""
    rows = [
        r
        for r in SUPPORTED
        if r.version == base_version(version) and distribution in (None, r.distribution)
    ]
    if rows:
        return Scope(
            frozenset(r.platform for r in rows), frozenset(n for r in rows for n in r.runners)
        )
    runners = {
        kind
        for kind, module in (
            ("v1", "vllm.v1.worker.gpu_model_runner"),
            ("v2", "vllm.v1.worker.gpu.model_runner"),
        )  # fmt: skip
        if _importable(module)
    }
    return Scope(frozenset({"cpu", "cuda"}), frozenset(runners))


# --------------------------------------------------------------------------- resolving


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any failure means the module is not usable
        return False
    return True


def resolve(target: str) -> Any:
    """`"package.module:Class.attr"` -> the object (raises on a missing part)."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


# --------------------------------------------------------------------------- 1. imports


@dataclass(frozen=True)
class VllmImport:
    """`from module import name` (name None for `import module`) at a line of a file."""

    module: str
    name: str | None
    where: str


def vllm_imports(path: Path) -> list[list[VllmImport]]:
    """The vLLM imports of a source file, grouped: a group is one import, or the
    alternatives of one `try: ... except ImportError`, of which one must resolve."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    groups: list[list[VllmImport]] = []
    in_try: set[int] = set()

    def collect(nodes: Iterable[ast.AST]) -> list[VllmImport]:
        found = []
        for node in nodes:
            for sub in ast.walk(node):
                found.extend(_imports_of(sub, path))
                in_try.add(id(sub))
        return found

    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            options = collect(node.body) + collect(node.handlers)
            if options:
                groups.append(options)
    for node in ast.walk(tree):
        if id(node) not in in_try:
            groups.extend([one] for one in _imports_of(node, path))
    return groups


def _imports_of(node: ast.AST, path: Path) -> list[VllmImport]:
    where = f"{path.name}:{getattr(node, 'lineno', 0)}"
    if (
        isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module
        and (node.module == "vllm" or node.module.startswith("vllm."))
    ):
        return [VllmImport(node.module, alias.name, where) for alias in node.names]
    if isinstance(node, ast.Import):
        return [
            VllmImport(alias.name, None, where)
            for alias in node.names
            if alias.name == "vllm" or alias.name.startswith("vllm.")
        ]
    return []


def _import_problem(item: VllmImport) -> str | None:
    try:
        module = importlib.import_module(item.module)
        if item.name is not None and not hasattr(module, item.name):
            importlib.import_module(f"{item.module}.{item.name}")  # a submodule
    except Exception as error:  # noqa: BLE001
        name = f"{item.module}.{item.name}" if item.name else item.module
        return f"{item.where}: import {name}: {_describe(error)}"
    return None


def _module_name(path: Path) -> str:
    root = RANDKV_VLLM.parent.parent
    if not path.resolve().is_relative_to(root):
        return path.stem
    relative = path.resolve().relative_to(root).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def import_problems(scope: Scope, sources: Iterable[Path] | None = None) -> list[str]:
    problems = []
    for path in sources if sources is not None else _randkv_sources():
        runner = RUNNER_MODULES.get(_module_name(path))
        if not scope.covers(runner=runner):
            continue
        for group in vllm_imports(path):
            failures = [_import_problem(item) for item in group]
            if all(failures):
                problems.append(" | ".join(f for f in failures if f))
    return problems


def _randkv_sources() -> list[Path]:
    """RandKV's source files that talk to vLLM."""
    package = RANDKV_VLLM.parent
    files = sorted(RANDKV_VLLM.rglob("*.py"))
    files += sorted((package / "check").glob("*.py"))
    files += [package / "demo.py", *sorted((package / "bench").glob("*.py"))]
    return files


# --------------------------------------------------------------------------- 2. overrides


def _is_randkv_own(name: str) -> bool:
    return name.startswith(("randkv", "_randkv")) or (name.startswith("__") and name.endswith("__"))


def signature_problem(vllm_fn: Any, randkv_fn: Any) -> str | None:
    """Why RandKV's override cannot take every call vLLM makes to its method, or None."""
    try:
        theirs = inspect.signature(vllm_fn).parameters
        ours = inspect.signature(randkv_fn).parameters
    except (TypeError, ValueError):
        return None  # a builtin or a property: nothing to compare
    var_kw = any(p.kind is p.VAR_KEYWORD for p in ours.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in ours.values())
    missing = []
    for name, param in theirs.items():
        if param.kind is param.VAR_POSITIONAL and not var_pos:
            missing.append(f"*{name}")
        elif param.kind is param.VAR_KEYWORD and not var_kw:
            missing.append(f"**{name}")
        elif param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            if name in ours:
                continue
            if param.kind is param.POSITIONAL_ONLY and var_pos:
                continue
            if param.kind is not param.POSITIONAL_ONLY and var_kw:
                continue
            missing.append(name)
    extra = [
        name
        for name, param in ours.items()
        if name not in theirs
        and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        and param.default is param.empty
    ]
    if missing:
        return f"does not accept vLLM's parameter(s) {missing}"
    if extra:
        return f"requires parameter(s) {extra} that vLLM's method does not have"
    return None


def override_problems(randkv_cls: type, vllm_cls: type, own: Iterable[type] = ()) -> list[str]:
    """Problems of the methods defined by `randkv_cls` (or by the classes `own`, when
    RandKV's methods come from mixins) against `vllm_cls`."""
    problems = []
    definers = list(own) or [randkv_cls]
    for definer in definers:
        for name, value in vars(definer).items():
            if not callable(value) and not isinstance(value, (classmethod, staticmethod)):
                continue
            if _is_randkv_own(name):
                continue
            label = f"{definer.__qualname__}.{name} over {vllm_cls.__qualname__}"
            vllm_fn = getattr(vllm_cls, name, None)
            if vllm_fn is None:
                problems.append(f"{label}: vLLM's class has no {name} (RandKV's override is dead)")
                continue
            problem = signature_problem(vllm_fn, getattr(randkv_cls, name))
            if problem:
                problems.append(f"{label}: {problem}")
    return problems


def _vllm_base(cls: type) -> type | None:
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] == "vllm":
            return base
    return None


def _randkv_subclasses() -> Iterator[tuple[type, type]]:
    """(RandKV class, the vLLM class it extends) for every class in randkv.vllm."""
    for module in imported_randkv_modules():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and (base := _vllm_base(value)) is not None
            ):
                yield value, base


def runner_problems(scope: Scope) -> list[str]:
    """RandKV's runner mixins against every vLLM runner class they are combined with."""
    from randkv.vllm.worker.runner_class import VLLM_RUNNERS, _runner_mixin, randkv_runner_class

    problems = []
    for qualified, kind in VLLM_RUNNERS.items():
        module, _, name = qualified.rpartition(".")
        platform = "cpu" if ".cpu" in module else None
        if not scope.covers(runner=kind, platform=platform):
            continue
        try:
            vllm_cls = resolve(f"{module}:{name}")
        except Exception as error:  # noqa: BLE001
            problems.append(f"{qualified}: the runner RandKV uses here is gone: {_describe(error)}")
            continue
        mixin = _runner_mixin(kind)
        own = [c for c in mixin.__mro__ if c.__module__.startswith("randkv.")]
        combined = randkv_runner_class(vllm_cls)
        problems += override_problems(combined, vllm_cls, own)
    return problems


# --------------------------------------------------------------------------- 3. touch points


def _assigned_self_attributes(cls: type) -> set[str]:
    """Names assigned as `self.<name>` anywhere in the source of `cls` and its bases."""
    names: set[str] = set()
    for klass in cls.__mro__:
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(source)):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                    ):
                        names.add(sub.attr)
        names.update(getattr(klass, "__annotations__", {}))
    return names


def _has_attribute(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    if not isinstance(cls, type):  # a module: its attributes are all it has
        return False
    if is_dataclass(cls) and name in {f.name for f in fields(cls)}:
        return True
    pydantic_fields = getattr(cls, "__pydantic_fields__", None) or {}
    return name in pydantic_fields or name in _assigned_self_attributes(cls)


def _module_assigns(module: Any, name: str) -> bool:
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Attribute) and t.attr == name for t in targets):
            return True
    return False


def touch_problem(touch: Touch) -> str | None:
    """Why `touch` fails on the running vLLM, or None."""
    if touch.kind == "either":
        failures = [touch_problem(option) for option in touch.either]
        if all(failures):
            return f"{touch.why}: none of the alternatives holds: " + " | ".join(
                f for f in failures if f
            )
        return None
    if touch.kind == "absent":
        return f"{touch.target} is present" if _importable(touch.target) else None
    try:
        target = resolve(touch.target)
    except Exception as error:  # noqa: BLE001
        return f"{touch.target}: {_describe(error)}"
    if touch.kind == "attributes":
        missing = [n for n in touch.names if not _has_attribute(target, n)]
        return f"{touch.target} has no {missing}" if missing else None
    if touch.kind == "fields":
        have = {f.name for f in fields(target)} if is_dataclass(target) else set()
        missing = [n for n in touch.names if n not in have]
        return f"{touch.target} (dataclass) has no field(s) {missing}" if missing else None
    if touch.kind == "call":
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return None
        positional = touch.positional + _takes_self(touch.target)
        try:
            signature.bind(*[None] * positional, **dict.fromkeys(touch.names))
        except TypeError as error:
            return f"{touch.target}({touch.positional} positional, {list(touch.names)}): {error}"
        return None
    if touch.kind == "parameters":
        try:
            have = set(inspect.signature(target).parameters)
        except (TypeError, ValueError):
            return None
        missing = [n for n in touch.names if n not in have]
        return f"{touch.target} takes no parameter(s) {missing}" if missing else None
    if touch.kind == "assigns":
        missing = [n for n in touch.names if not _module_assigns(target, n)]
        return f"{touch.target} sets no attribute {missing}" if missing else None
    raise ValueError(f"unknown touch point kind {touch.kind!r}")


def _takes_self(target: str) -> int:
    """1 when `target` names a plain method through its class (called on an instance)."""
    module_name, _, qualname = target.partition(":")
    owner_path, _, name = qualname.rpartition(".")
    if not owner_path:
        return 0
    owner = resolve(f"{module_name}:{owner_path}")
    if not isinstance(owner, type):
        return 0
    static = inspect.getattr_static(owner, name)
    return int(inspect.isfunction(static))


def touchpoint_problems(scope: Scope) -> list[str]:
    return [
        problem
        for touch in TOUCHPOINTS
        if scope.covers(runner=touch.runner, platform=touch.platform)
        and (problem := touch_problem(touch))
    ]


def additional_config_problem() -> str | None:
    """vLLM's `additional_config` must take RandKV's typed value: it is declared as a union
    of dict and a protocol (SupportsHash up to 0.32, SupportsCompileFactors in 0.34)."""
    import typing

    from vllm.config import VllmConfig

    from randkv.spec.config import RandKVConfig
    from randkv.vllm.options import RandKVAdditionalConfig

    declared = typing.get_type_hints(VllmConfig).get("additional_config")
    value = RandKVAdditionalConfig.of({}, RandKVConfig())
    protocols = [t for t in typing.get_args(declared) if t is not dict]
    for protocol in protocols:
        members = [n for n in vars(protocol) if not n.startswith("_")]
        if all(callable(getattr(value, n, None)) for n in members):
            return None
    return f"VllmConfig.additional_config is {declared}; RandKVAdditionalConfig fits none of it"


def environment_problem() -> str | None:
    """What RandKV sets in the environment must pass vLLM's own check of it (vLLM 0.34
    refuses VLLM_USE_V2_MODEL_RUNNER set to anything but 1 at every engine start)."""
    import os

    from vllm.platforms import current_platform

    from randkv.spec.config import RandKVConfig
    from randkv.vllm.entrypoints.engine_args import randkv_engine_kwargs

    validate = getattr(current_platform, "validate_environ", None)
    if validate is None:
        return None
    saved = dict(os.environ)
    try:
        randkv_engine_kwargs(RandKVConfig(), {})
        validate(hard_fail=False)
    except Exception as error:  # noqa: BLE001
        return f"RandKV's engine arguments fail vLLM's environment check: {_describe(error)}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return None


# --------------------------------------------------------------------------- all together


def _randkv_vllm_module_names() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(RANDKV_VLLM)], "randkv.vllm."))


@functools.cache
def imported_randkv_modules() -> tuple[Any, ...]:
    """Every module of randkv.vllm, imported (raises on the first that fails)."""
    return tuple(importlib.import_module(name) for name in _randkv_vllm_module_names())


def module_import_problems() -> list[str]:
    problems = []
    for name in _randkv_vllm_module_names():
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001
            problems.append(f"import {name}: {_describe(error)}")
    return problems


def drift_problems(scope: Scope | None = None) -> list[str]:
    """Every difference between what RandKV relies on and the running vLLM."""
    import vllm

    scope = scope or scope_of(vllm.__version__)
    problems = module_import_problems()
    if problems:
        return problems  # the checks below need every module
    problems += import_problems(scope)
    for randkv_cls, vllm_cls in _randkv_subclasses():
        problems += override_problems(randkv_cls, vllm_cls)
    problems += runner_problems(scope)
    problems += touchpoint_problems(scope)
    for check in (additional_config_problem, environment_problem):
        if problem := check():
            problems.append(problem)
    return problems


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import subprocess
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m randkv.vllm.release.drift", description=__doc__
    )
    parser.add_argument(
        "--release",
        metavar="DIST==VERSION",
        help="check a release's wheel (fetched with --no-deps into the RandKV cache) instead "
        "of the installed vLLM, e.g. vllm==0.34.0",
    )
    parser.add_argument("--distribution", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.release:
        from randkv.vllm.release.wheels import release_sources

        distribution, _, version = args.release.partition("==")
        path = release_sources(distribution, version)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(path), os.environ.get("PYTHONPATH")])
        )}  # fmt: skip
        module = "randkv.vllm.release.drift"
        command = [sys.executable, "-m", module, "--distribution", distribution]
        return subprocess.run(command, env=env, check=False).returncode
    import vllm

    scope = scope_of(vllm.__version__, args.distribution)
    problems = drift_problems(scope)
    where = f"vLLM {vllm.__version__} ({vllm.__file__})"
    if problems:
        print(f"{len(problems)} difference(s) on {where}:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    runners = ", ".join(sorted(scope.runners)) or "none"
    print(f"no drift on {where}: platforms {sorted(scope.platforms)}, runners {runners}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
