"""What users and saved configurations name keeps working after the package took rooms:
`from randkv.vllm import LLM`, the plugin entry point, and the scheduler and worker class
paths of engine configurations written before (vLLM resolves them by qualified name)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm]


def test_the_call_site_names():
    from randkv.vllm import LLM, randkv_engine_kwargs
    from randkv.vllm.entrypoints.engine_args import randkv_engine_kwargs as current
    from randkv.vllm.entrypoints.llm import LLM as current_llm

    assert LLM is current_llm and randkv_engine_kwargs is current


def test_the_plugin_entry_point_loads_the_register_function():
    (entry,) = [
        e for e in importlib.metadata.entry_points(group="vllm.general_plugins")
        if e.name == "randkv"
    ]  # fmt: skip
    from randkv.vllm.plugin import register

    assert entry.value == "randkv.vllm.plugin:register" and entry.load() is register


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("randkv.vllm.scheduler.RandKVScheduler", "randkv.vllm.sched.scheduler.RandKVScheduler"),
        ("randkv.vllm.worker.RandKVCPUWorker", "randkv.vllm.worker.cpu.RandKVCPUWorker"),
    ],
)
def test_engine_configs_written_before_the_rooms_still_resolve(old, new):
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(old) is resolve_obj_by_qualname(new)


def test_the_filled_in_class_paths_resolve():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from randkv.vllm.entrypoints.engine_args import CPU_WORKER_CLS, GPU_WORKER_CLS, SCHEDULER_CLS

    assert resolve_obj_by_qualname(SCHEDULER_CLS).__name__ == "RandKVScheduler"
    assert resolve_obj_by_qualname(CPU_WORKER_CLS).__name__ == "RandKVCPUWorker"
    assert GPU_WORKER_CLS == "randkv.vllm.worker.gpu.RandKVGPUWorker"  # never imported on CPU
    assert importlib.util.find_spec("randkv.vllm.gpu_worker") is not None  # the old path
