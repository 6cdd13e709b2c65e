"""RandKV inside vLLM (the releases of `randkv.vllm.release.versions`), through vLLM's own
`scheduler_cls` / `worker_cls` hooks.

from randkv.vllm import LLM
llm = LLM(model=..., randkv=RandKVConfig(budget=1024))

The package's rooms (docs/architecture.md): `sched` (the engine core's side), `worker` (the
workers' side), `entrypoints` (LLM, serve, engine arguments, the HTTP front door), `release`
(supported releases, where they differ, the drift check); beside them the few modules both
sides read: `options`, `refusals`, `metrics`, `class_swap`, and `plugin`, vLLM's entry point.

Importing this package does not import vLLM: vLLM loads `randkv.vllm.plugin` in every one of
its processes, under any vLLM version, and the plugin must stay silent where it does not
apply. The names below check the vLLM version when first used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

__all__ = ["LLM", "randkv_engine_kwargs"]

#: Module paths an engine configuration may still name from before the package had rooms
#: (`scheduler_cls`, `worker_cls` strings written into saved configs); each imports as the
#: module it became.
#: (`randkv.vllm.worker.RandKVCPUWorker` resolves through the worker package's __getattr__.)
LEGACY_MODULES = {
    "randkv.vllm.scheduler": "randkv.vllm.sched.scheduler",
    "randkv.vllm.gpu_worker": "randkv.vllm.worker.gpu",
}


class _LegacyModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a `LEGACY_MODULES` name as its new module (the same module object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in LEGACY_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(LEGACY_MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


if not any(isinstance(finder, _LegacyModuleAlias) for finder in sys.meta_path):
    sys.meta_path.append(_LegacyModuleAlias())


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from randkv.vllm.release.support import check_vllm_version

    check_vllm_version()
    if name == "LLM":
        from randkv.vllm.entrypoints.llm import LLM

        return LLM
    from randkv.vllm.entrypoints.engine_args import randkv_engine_kwargs

    return randkv_engine_kwargs
