"""Modes RandKV cannot serve are refused with a message saying what is unsupported."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from randkv import RandKVConfig  # noqa: E402
from randkv.vllm import randkv_engine_kwargs  # noqa: E402
from randkv.vllm.entrypoints.engine_args import UnsupportedModeError  # noqa: E402

pytestmark = [pytest.mark.vllm]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speculative_config": {"method": "deepseek_mtp"}}, "MTP speculation .* hybrid and MLA"),
        ({"speculative_config": {"method": "mtp"}}, "MTP speculation"),
        ({"speculative_config": {"method": "dflash"}}, "this speculation method"),
        ({"kv_transfer_config": {"kv_connector": "x"}}, "KV transfer"),
        ({"pipeline_parallel_size": 2}, "pipeline parallelism"),
        ({"scheduler_cls": "my.Scheduler"}, "RandKV installs its own scheduler_cls"),
    ],
)
def test_refused_engine_arguments(kwargs, message):
    with pytest.raises(UnsupportedModeError, match=message):
        randkv_engine_kwargs(RandKVConfig(), kwargs)


@pytest.mark.parametrize(
    "method", ["ngram", "ngram_gpu", "suffix", "medusa", "draft_model", "eagle", "eagle3"]
)
def test_speculation_methods_randkv_runs_pass_the_call_site(method):
    out = randkv_engine_kwargs(RandKVConfig(), {"speculative_config": {"method": method}})
    assert out["speculative_config"] == {"method": method}


def test_call_site_forms():
    assert randkv_engine_kwargs(None, {"dtype": "float32"}) == {"dtype": "float32"}
    out = randkv_engine_kwargs(True, {"dtype": "float32", "additional_config": {"a": 1}})
    assert out["additional_config"] == {"a": 1, "randkv": RandKVConfig()}
    assert out["scheduler_cls"].endswith("RandKVScheduler")
    assert out["dtype"] == "float32"
    with pytest.raises(ValueError, match="buffer_size must be in"):
        randkv_engine_kwargs({"buffer_size": 0}, {})


def test_a_model_whose_every_layer_slides_is_refused_at_start(tiny_model_path, tmp_path):
    """Mixed models are served (tests/vllm/test_gemma3.py); with no full-attention layer there is
    nothing for RandKV to bound."""
    import shutil

    from randkv.vllm import LLM

    model = tmp_path / "sliding"
    shutil.copytree(tiny_model_path, model)
    config = json.loads((model / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=32, max_window_layers=0)
    config["layer_types"] = ["sliding_attention"] * config["num_hidden_layers"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        Exception, match="every layer of this model slides.*serve it without RandKV"
    ):
        LLM(
            model=str(model),
            randkv=RandKVConfig(budget=64, buffer_size=8),
            dtype="float32",
            max_model_len=1024,
            block_size=32,
            gpu_memory_utilization=0.2,
            enforce_eager=True,
            num_gpu_blocks_override=32,
        )


# The engine of the ISA tests; the AMX test builds it in bfloat16.
SMALL_ENGINE = dict(
    randkv=RandKVConfig(budget=64, buffer_size=8),
    max_model_len=512,
    block_size=32,
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    num_gpu_blocks_override=16,
)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from randkv.vllm import LLM

    return LLM(model=tiny_model_path, dtype="float32", **SMALL_ENGINE)


def test_cpu_attention_kernels_that_pack_kv_otherwise_are_refused(engine):
    """The running engine's own attention layers, with the ISA set where the release keeps
    it (the layer from vLLM 0.32, its kernel object in 0.28): only vec/vec16 pass."""
    from randkv.kernels.compactor import KVLayout
    from randkv.vllm.release.compat.cpu_attention import attention_isa

    worker = engine.llm_engine.model_executor.driver_worker.worker
    context = worker.vllm_config.compilation_config.static_forward_context
    layers = [layer for layer in context.values() if hasattr(layer, "impl")]
    assert layers and {attention_isa(layer) for layer in layers} <= {"vec", "vec16"}
    assert worker.randkv_layout() is KVLayout.VLLM_CPU_VEC
    holder = [layer if hasattr(layer, "isa") else layer.impl for layer in layers]
    saved = [h.isa for h in holder]
    try:
        for isa in ("amx", "neon"):
            holder[-1].isa = isa
            with pytest.raises(UnsupportedModeError, match=f"uses \\['{isa}'"):
                worker.randkv_layout()
        for h in holder:  # a release that keeps the ISA somewhere RandKV does not look
            del h.isa
        with pytest.raises(UnsupportedModeError, match="cannot tell which CPU attention"):
            worker.randkv_layout()
    finally:
        for h, isa in zip(holder, saved, strict=True):
            h.isa = isa


@pytest.mark.skipif(
    not __import__("torch").cpu._is_amx_tile_supported(), reason="needs a CPU with AMX"
)
def test_an_amx_engine_is_refused_at_start(tiny_model_path):
    """On an AMX machine vLLM packs bf16 KV in 32-token blocks with its AMX kernel."""
    from randkv.vllm import LLM

    with pytest.raises(Exception, match="AMX/NEON pack KV differently"):
        LLM(model=tiny_model_path, dtype="bfloat16", **SMALL_ENGINE)
