"""RandKV's model runner for whichever vLLM runner an engine built.

vLLM builds its model runner inside the worker's `init_device`; which class depends on the
release, the platform and `VLLM_USE_V2_MODEL_RUNNER`. RandKV knows four, by qualified name
(so this module imports none of them: each release lacks some), and gives the built runner
the methods of a class assembled from the platform's mixins, the runner kind's mixin and
vLLM's class. A runner class it does not know (another plugin's, a future release's) is
refused rather than half-hooked.
"""

from __future__ import annotations

import functools
from typing import Any

from randkv.vllm.class_swap import swap_class
from randkv.vllm.refusals import UnsupportedModeError

#: vLLM's model runner classes RandKV hooks, and their kind.
VLLM_RUNNERS: dict[str, str] = {
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner": "v1",
    "vllm.v1.worker.cpu_model_runner.CPUModelRunner": "v1",
    "vllm.v1.worker.gpu.model_runner.GPUModelRunner": "v2",
    "vllm.v1.worker.cpu.model_runner.CPUModelRunner": "v2",
}


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def runner_kind(runner_cls: type) -> str | None:
    """ "v1" or "v2" for a vLLM runner class RandKV hooks, else None."""
    return VLLM_RUNNERS.get(qualified_name(runner_cls))


def _runner_mixin(kind: str) -> type:
    if kind == "v1":
        from randkv.vllm.worker.runner_v1 import V1RunnerMixin

        return V1RunnerMixin
    from randkv.vllm.worker.runner_v2 import V2RunnerMixin

    return V2RunnerMixin


@functools.cache
def randkv_runner_class(vllm_runner_cls: type, platform_mixins: tuple[type, ...] = ()) -> type:
    """RandKV's subclass of `vllm_runner_cls` (one class per combination)."""
    kind = runner_kind(vllm_runner_cls)
    if kind is None:
        raise UnsupportedModeError(_unknown(vllm_runner_cls))
    bases = (*platform_mixins, _runner_mixin(kind), vllm_runner_cls)
    name = "RandKV" + "".join(b.__name__.replace("Mixin", "") for b in platform_mixins)
    name += f"{kind.upper()}{vllm_runner_cls.__name__}"
    return type(name, bases, {"__module__": __name__, "randkv_runner_kind": kind})


def adopt_model_runner(runner: Any, platform_mixins: tuple[type, ...] = ()) -> str:
    """Give a runner vLLM built RandKV's methods; returns its kind ("v1" or "v2")."""
    from randkv.vllm.release.compat.runner import check_runner_supported

    vllm_cls: type = type(runner)
    adopted = getattr(vllm_cls, "randkv_runner_kind", None)
    if adopted:  # already adopted (worker re-init)
        return str(adopted)
    kind = runner_kind(vllm_cls)
    if kind is None:
        raise UnsupportedModeError(_unknown(vllm_cls))
    check_runner_supported(kind)
    swap_class(runner, vllm_cls, randkv_runner_class(vllm_cls, platform_mixins))
    return runner.randkv_runner_kind


def _unknown(cls: type) -> str:
    return (
        f"RandKV hooks vLLM's own model runners ({', '.join(sorted(VLLM_RUNNERS))}); this "
        f"engine built a {qualified_name(cls)} (another plugin's runner, or a vLLM release "
        "RandKV does not support)"
    )
