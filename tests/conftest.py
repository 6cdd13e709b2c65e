"""Shared fixtures: the tiny checkpoint and in-process vLLM engines (one start each)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from v2_runner import enable_v2_runner, v2_requested

# RANDKV_TEST_RUNNER=v2: the engine tests run on vLLM's V2 model runner (v2_runner.py).
# Before anything imports vLLM, which decides once whether it has Triton.
if v2_requested():
    enable_v2_runner()

# Engines run in this process so tests can read the scheduler; positions are tracked so
# tests can compare the engine's slot maps with the spec.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RANDKV_TRACK_POSITIONS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# vLLM's CPU backend binds its OpenMP threads only in worker processes; with the engine
# in-process, any other torch op in the process (RandKV's rounds, Transformers references)
# makes every later vLLM kernel ~30x slower on a 2-thread OpenMP pool. One thread avoids it.
# Must be set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_model_path():
    from randkv.models import build_tiny_checkpoint

    return str(build_tiny_checkpoint())


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls: extra threads only add contention (and run-to-run noise) on shared CPUs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def shut_down_engines_between_modules() -> Iterator[None]:
    """Shut down the in-process vLLM engines a module leaves behind.

    An in-process engine tears down the process's distributed groups when its client is
    collected, and vLLM freezes the objects its start-up allocates (`gc.freeze()`), so that
    happens at an arbitrary later collection: in the middle of the next module's engine
    start-up ("tensor model parallel group is not initialized"). Shutting them down here,
    once the module is done, keeps it out of other modules' engines.
    """
    yield
    import gc
    import sys

    if "vllm.v1.engine.core_client" not in sys.modules:
        return
    from vllm.v1.engine.core_client import InprocClient

    # vLLM `gc.freeze()`s what an engine start allocates, the client included, and
    # gc.get_objects() does not list frozen objects.
    gc.unfreeze()
    for client in [obj for obj in gc.get_objects() if isinstance(obj, InprocClient)]:
        client.shutdown()
    # Engines shut down beside others left the process's groups up (engine_teardown.py).
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
