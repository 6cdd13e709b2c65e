"""The GPU model runner's input code as RandKV changes it, run by vLLM's CPU engine.

vLLM's CPU model runner subclasses the GPU one, so the CPU engine runs the same
`_prepare_inputs` and persistent buffers a GPU (and a full CUDA graph) relies on: the
buffers must keep their storage across steps, RoPE positions stay absolute, and attention
gets physical slots and lengths, checked here against the spec and the request's blocks.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, spec  # noqa: E402

pytestmark = [pytest.mark.vllm]

CONFIG = RandKVConfig(budget=24, buffer_size=8, seed=1)
BLOCK = 32  # vLLM 0.32's CPU attention takes multiples of 32 only
PROMPTS = ["Buffers must stay put.", "A second, slightly longer request runs beside it."]


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    from randkv.vllm import LLM

    return LLM(
        model=tiny_model_path,
        randkv=CONFIG,
        dtype="float32",
        max_model_len=2048,
        block_size=BLOCK,
        gpu_memory_utilization=0.2,
        num_gpu_blocks_override=32,
        enforce_eager=True,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        seed=0,
    )


def _runner(llm):
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return executor.driver_worker.worker.model_runner


def _record_steps(runner) -> list[dict]:
    steps: list[dict] = []
    prepare = runner._prepare_inputs
    physical_inputs = runner.randkv_physical_inputs
    table = runner.input_batch.block_table[0]
    tails: list[tuple[list[int], list[int]]] = []

    def recording_physical_inputs(scheduler_output):
        total = scheduler_output.total_num_scheduled_tokens
        before = table.slot_mapping.gpu[total:].tolist()
        physical_inputs(scheduler_output)
        tails.append((before, table.slot_mapping.gpu[total:].tolist()))

    def recording(scheduler_output, num_scheduled_tokens):
        result = prepare(scheduler_output, num_scheduled_tokens)
        n = runner.input_batch.num_reqs
        total = scheduler_output.total_num_scheduled_tokens
        steps.append(
            {
                "pointers": (
                    runner.seq_lens.data_ptr(),
                    runner.positions.data_ptr(),
                    table.slot_mapping.gpu.data_ptr(),
                ),
                "req_ids": list(runner.input_batch.req_ids[:n]),
                "seen": [int(v) for v in runner.input_batch.num_computed_tokens_cpu[:n]],
                "scheduled": [int(v) for v in num_scheduled_tokens[:n]],
                "blocks": [list(runner.requests[r].block_ids[0]) for r in step_ids(n)],
                "positions": runner.positions[:total].tolist(),
                "seq_lens": runner.seq_lens[:n].tolist(),
                "slots": table.slot_mapping.gpu[:total].tolist(),
                "tail": tails[-1],
            }
        )
        return result

    def step_ids(n: int) -> list[str]:
        return list(runner.input_batch.req_ids[:n])

    runner._prepare_inputs = recording
    runner.randkv_physical_inputs = recording_physical_inputs
    return steps


def test_persistent_buffers_positions_and_physical_slots(llm):
    runner = _runner(llm)
    steps = _record_steps(runner)
    try:
        params = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True)
        llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        del runner._prepare_inputs, runner.randkv_physical_inputs
    assert len(steps) > 80
    assert len({step["pointers"] for step in steps}) == 1  # storage never reallocated
    rounds_seen = 0
    for step in steps:
        offset = 0
        requests = zip(step["seen"], step["scheduled"], step["blocks"], strict=True)
        for seen, count, blocks in requests:
            physical = spec.physical_length(CONFIG, prompt_length=0, tokens_seen=seen)
            rounds_seen += seen >= CONFIG.max_physical_length
            for i in range(count):
                # RoPE: absolute positions; attention: physical slots in the request's blocks.
                assert step["positions"][offset + i] == seen + i
                slot = physical + i
                assert step["slots"][offset + i] == blocks[slot // BLOCK] * BLOCK + slot % BLOCK
            offset += count
        expected_lens = [
            spec.physical_length(CONFIG, prompt_length=0, tokens_seen=s) + c
            for s, c in zip(step["seen"], step["scheduled"], strict=True)
        ]
        assert step["seq_lens"] == expected_lens
        # RandKV rewrites the real tokens' slots only: the padding vLLM's kernel wrote past
        # them (-1 on GPUs, for CUDA-graph padding) is left as it was.
        before, after = step["tail"]
        assert after == before
    assert rounds_seen > 10  # the check covered steps well past several rounds


def test_randkv_step_code_reads_nothing_back_from_tensors(llm):
    """RandKV's per-step worker code (the round directives, compaction, physical inputs)
    makes no host sync: on CPU, where host and device tensors look alike, that means no
    item/tolist/numpy/bool of any tensor and no data-dependent op. A step that fires rounds
    is no exception: the planner checks its draws with a device-side assert
    (randkv.kernels.planner)."""
    from randkv.kernels.hostsync import count_host_syncs

    runner = _runner(llm)
    counts: list[tuple[bool, int, dict]] = []
    before_step, physical_inputs = runner.randkv_before_step, runner.randkv_physical_inputs
    step: dict = {}

    def counted_before_step(scheduler_output):
        plan = getattr(scheduler_output, "randkv", None)
        step["rounds"] = bool(plan and plan.directives)
        with count_host_syncs() as counter:
            before_step(scheduler_output)
        step["counter"] = counter

    def counted_physical_inputs(scheduler_output):
        counter = step["counter"]
        with count_host_syncs() as inner:
            physical_inputs(scheduler_output)
        counts.append((step["rounds"], counter.total + inner.total, dict(counter.counts)))

    runner.randkv_before_step = counted_before_step
    runner.randkv_physical_inputs = counted_physical_inputs
    records = runner.randkv.records
    tracking, records.tracking = records.tracking, False  # a debug aid that reads back
    try:
        params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
        llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        del runner.randkv_before_step, runner.randkv_physical_inputs
        records.tracking = tracking
    plain = [total for fired, total, _ in counts if not fired]
    with_rounds = [(total, detail) for fired, total, detail in counts if fired]
    assert len(plain) > 50 and len(with_rounds) > 5
    assert set(plain) == {0}
    assert all(total == 0 for total, _ in with_rounds), with_rounds
