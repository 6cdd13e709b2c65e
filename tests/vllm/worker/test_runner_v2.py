"""vLLM's V2 model runner as RandKV changes it (run with RANDKV_TEST_RUNNER=v2, see
tests/support/v2_runner.py): what attention gets every step, read where a CUDA graph reads it.

V2 keeps its per-step inputs in persistent buffers (`input_buffers.positions`, `.seq_lens`,
`block_tables.slot_mappings`) that a full CUDA graph replays from. Checked against the spec
and the request's blocks on the device: the buffers keep their storage, RoPE positions stay
absolute, attention's slots and lengths are physical, and the sampler gets absolute lengths
back.
"""

from __future__ import annotations

import pytest
from engine_teardown import shut_down_beside_others

pytest.importorskip("vllm")

from v2_runner import v2_requested  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not v2_requested(), reason="V2 runner run only (RANDKV_TEST_RUNNER=v2)"),
    pytest.mark.vllm,
    pytest.mark.v2,
]

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, spec  # noqa: E402

CONFIG = RandKVConfig(budget=24, buffer_size=8, seed=1)
BLOCK = 32
PROMPTS = ["Buffers must stay put.", "Another runs beside."]  # prompts <= K (byte tokens)
ENGINE_ARGS = dict(
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


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    from randkv.vllm import LLM

    return LLM(model=tiny_model_path, randkv=CONFIG, **ENGINE_ARGS)


def _runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def test_attention_reads_physical_slots_and_lengths_from_vllms_buffers(llm):
    runner = _runner(llm)
    assert runner.randkv_runner_kind == "v2"
    steps: list[dict] = []
    sampled: list[tuple[list[int], list[int]]] = []  # (sampler's seq_lens, absolute ones)
    prepare = runner.model_state.prepare_attn
    sampler = runner.sampler

    def recording_prepare(input_batch, cudagraph_mode, block_tables, slot_mappings, *a, **k):
        n, total = input_batch.num_reqs, input_batch.num_tokens
        rows = [int(i) for i in input_batch.idx_mapping[:n]]
        steps.append(
            {
                "pointers": (
                    runner.input_buffers.seq_lens.data_ptr(),
                    runner.input_buffers.positions.data_ptr(),
                    runner.block_tables.slot_mappings.data_ptr(),
                ),
                "views": (
                    input_batch.seq_lens.data_ptr() == runner.input_buffers.seq_lens.data_ptr(),
                    slot_mappings.data_ptr() == runner.block_tables.slot_mappings.data_ptr(),
                ),
                "seen": [int(v) for v in input_batch.num_computed_tokens_np[:n]],
                "scheduled": [int(v) for v in input_batch.num_scheduled_tokens[:n]],
                "blocks": [
                    runner.block_tables.block_tables[0]
                    .gpu[row]
                    .tolist()[: int(runner.block_tables.num_blocks.np[0, row])]
                    for row in rows
                ],
                "positions": input_batch.positions[:total].tolist(),
                "seq_lens": input_batch.seq_lens[:n].tolist(),
                "slots": slot_mappings[0, :total].tolist(),
            }
        )
        return prepare(input_batch, cudagraph_mode, block_tables, slot_mappings, *a, **k)

    class RecordingSampler:
        """vLLM's sampler, recording the lengths each call sees."""

        def __getattr__(self, name):
            return getattr(sampler, name)

        def __call__(self, logits, input_batch, *args, **kwargs):
            n = input_batch.num_reqs
            seen, count = input_batch.num_computed_tokens_np[:n], input_batch.num_scheduled_tokens
            sampled.append((input_batch.seq_lens[:n].tolist(), (seen + count[:n]).tolist()))
            return sampler(logits, input_batch, *args, **kwargs)

    runner.model_state.prepare_attn = recording_prepare
    runner.sampler = RecordingSampler()
    try:
        params = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True)
        llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        del runner.model_state.prepare_attn
        runner.sampler = sampler
    assert len(steps) > 80
    assert len({step["pointers"] for step in steps}) == 1  # storage never reallocated
    assert all(step["views"] == (True, True) for step in steps)  # graphs read these buffers
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
        expected = [
            spec.physical_length(CONFIG, prompt_length=0, tokens_seen=s) + c
            for s, c in zip(step["seen"], step["scheduled"], strict=True)
        ]
        assert step["seq_lens"] == expected
    assert rounds_seen > 10  # the check covered steps well past several rounds
    # The sampler decides which rows emit a token from absolute lengths.
    assert len(sampled) == len(steps)
    assert all(lengths == absolute for lengths, absolute in sampled)
    assert any(
        max(absolute) > CONFIG.max_physical_length for _, absolute in sampled
    )  # past the physical cap: physical lengths would have differed here


def test_randkv_step_code_reads_nothing_back_on_v2(llm, monkeypatch):
    """RandKV's own per-step code on V2 (the round directives, compaction, the physical
    inputs of `prepare_attn`) makes no host sync: no item/tolist/numpy of a tensor, no
    device-to-host copy, no data-dependent op. vLLM's own calls inside it (its kernels, run
    here by Triton's interpreter on numpy views) are not RandKV's and are not counted."""
    import vllm.v1.worker.gpu.input_batch as v2_inputs
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from randkv.kernels.hostsync import count_host_syncs

    runner = _runner(llm)
    active = []  # the counter of the RandKV call in progress

    def not_randkvs(function):
        def call(*args, **kwargs):
            if not active:
                return function(*args, **kwargs)
            active[-1]._inside_wrapped += 1
            try:
                return function(*args, **kwargs)
            finally:
                active[-1]._inside_wrapped -= 1

        return call

    monkeypatch.setattr(
        v2_inputs, "prepare_pos_seq_lens", not_randkvs(v2_inputs.prepare_pos_seq_lens)
    )
    monkeypatch.setattr(GPUModelRunner, "prepare_attn", not_randkvs(GPUModelRunner.prepare_attn))
    counts: list[tuple[str, bool, int, dict]] = []

    def counted(name, function, fired):
        def call(*args, **kwargs):
            with count_host_syncs() as counter:
                active.append(counter)
                try:
                    result = function(*args, **kwargs)
                finally:
                    active.pop()
            counts.append((name, fired(args), counter.total, dict(counter.counts)))
            return result

        return call

    before_step, prepare = runner.randkv_before_step, runner.prepare_attn
    runner.randkv_before_step = counted(
        "before_step",
        before_step,
        lambda a: bool(getattr(a[0], "randkv", None) and a[0].randkv.directives),
    )
    runner.prepare_attn = counted(
        "prepare_attn",
        prepare,
        lambda a: bool((a[0].num_computed_tokens_np >= CONFIG.max_physical_length).any()),
    )
    records = runner.randkv.records
    tracking, records.tracking = records.tracking, False  # a debug aid that reads back
    try:
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        del runner.randkv_before_step, runner.prepare_attn
        records.tracking = tracking
    rounds = [c for c in counts if c[0] == "before_step" and c[1]]
    physical = [c for c in counts if c[0] == "prepare_attn" and c[1]]
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    assert len(rounds) > 5 and len(physical) > 50
    assert all(total == 0 for _, _, total, _ in counts), [c for c in counts if c[2]]


def test_v2_gives_the_tokens_and_evictions_of_v1_on_the_same_release(llm, tiny_model_path):
    """The V1 runner of the same vLLM as the oracle: an engine built here with
    VLLM_USE_V2_MODEL_RUNNER=0 runs V1, on the same model, prompts and settings."""
    import os

    from vllm import envs

    from randkv.vllm import LLM

    params = SamplingParams(
        temperature=0, max_tokens=150, ignore_eos=True, extra_args={"randkv_key": "v1-v2"}
    )
    v2 = llm.generate(PROMPTS, params, use_tqdm=False)
    v2_slots = [llm.randkv_slot_positions(o.request_id) for o in v2]
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    envs.disable_envs_cache()
    try:
        v1_llm = LLM(model=tiny_model_path, randkv=CONFIG, **ENGINE_ARGS)  # as `llm`
    finally:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        envs.disable_envs_cache()
    runner = v1_llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert runner.randkv_runner_kind == "v1"
    v1 = v1_llm.generate(PROMPTS, params, use_tqdm=False)
    v1_slots = [v1_llm.randkv_slot_positions(o.request_id) for o in v1]
    shut_down_beside_others(v1_llm)
    assert [list(o.outputs[0].token_ids) for o in v2] == [list(o.outputs[0].token_ids) for o in v1]
    assert v2_slots == v1_slots
    assert v2_slots[0][0][0] != v2_slots[0][0][1]  # heads chose independently, rounds ran
