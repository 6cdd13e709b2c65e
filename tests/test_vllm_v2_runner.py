"""vLLM's V2 model runner as RandKV changes it (run with RANDKV_TEST_RUNNER=v2, see
tests/v2_runner.py): what attention gets every step, read where a CUDA graph reads it.

V2 keeps its per-step inputs in persistent buffers (`input_buffers.positions`, `.seq_lens`,
`block_tables.slot_mappings`) that a full CUDA graph replays from. Checked against the spec
and the request's blocks on the device: the buffers keep their storage, RoPE positions stay
absolute, attention's slots and lengths are physical, and the sampler gets absolute lengths
back.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from v2_runner import v2_requested  # noqa: E402

pytestmark = pytest.mark.skipif(
    not v2_requested(), reason="V2 runner run only (RANDKV_TEST_RUNNER=v2)"
)

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, spec  # noqa: E402

CONFIG = RandKVConfig(budget=24, buffer_size=8, seed=1)
BLOCK = 32
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
