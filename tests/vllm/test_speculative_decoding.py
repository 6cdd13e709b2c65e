"""RandKV under vLLM's speculative decoding, on the real CPU engine (tiny random model).

The oracle is RandKV without speculation (same tokens, same rounds, the same slot maps on
the target's layers: a round evicts verified tokens only, at the spec's positions) and
`randkv.spec`. A drafter's own layers are compacted with their own draws (layer indices
after the target's); with a draft model that is the target itself and draws mirrored from
the target's layers, the drafter's KV is the target's slot for slot, so every draft must be
accepted: any slot a drafter wrote or read in the wrong place would show as a rejection.
"""

from __future__ import annotations

import dataclasses

import pytest
import speculative_runs
from async_scheduling import cpu_async_scheduling
from engine_teardown import shut_down_beside_others
from v2_runner import v2_requested

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, request_key_from_text, slot_positions  # noqa: E402
from randkv.kernels.planner import RoundPlanner  # noqa: E402
from randkv.models import build_tiny_checkpoint  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.v2]

CONFIG = RandKVConfig(budget=64, buffer_size=16, seed=3)  # rounds at 96, 112, 128, ...
COMMON = dict(
    dtype="float32",
    max_model_len=2048,
    block_size=32,  # vLLM 0.32's CPU attention takes multiples of 32 only
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    disable_log_stats=False,  # vLLM's acceptance counters
    max_num_seqs=4,
    num_gpu_blocks_override=64,
    seed=0,
)
PROMPTS = [
    "one two three four one two three four one two three four",  # repeats: ngram drafts
    "The quick brown fox jumps over the lazy dog.",
]
NEW_TOKENS = 120 if v2_requested() else 160
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
DRAFTS = 3


def _llm(model: str, speculative_config: dict | None = None, **overrides):
    from randkv.vllm import LLM

    return LLM(
        model=model,
        randkv=CONFIG,
        speculative_config=speculative_config,
        **{**COMMON, **overrides},
    )


def _draft_model(path: str) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": DRAFTS}


def _runner(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def _scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _run(llm, prompts=PROMPTS, params=GREEDY) -> dict:
    return speculative_runs.run(llm, CONFIG, prompts, params)


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return tiny_model_path


@pytest.fixture(scope="module")
def reference(model):
    """RandKV without speculation: the oracle."""
    llm = _llm(model)
    result = _run(llm)
    shut_down_beside_others(llm)
    assert min(result["rounds"]) >= 3
    return result


def _assert_same_decisions(result, reference):
    assert result["tokens"] == reference["tokens"]
    assert result["rounds"] == reference["rounds"]
    assert result["maps"] == reference["maps"]


def _assert_spec_maps(result, keys):
    """The target's slot maps are `randkv.spec`'s."""
    for maps, (prompt, seen), key in zip(result["maps"], result["lengths"], keys, strict=True):
        for layer, heads in enumerate(maps):
            for head, got in enumerate(heads):
                want = slot_positions(
                    CONFIG,
                    prompt_length=prompt,
                    tokens_seen=seen,
                    request_key=key,
                    layer=layer,
                    kv_head=head,
                )
                assert tuple(got) == want


def test_a_draft_model_that_is_the_target_drafts_with_its_own_draws(model, reference):
    """Same tokens, rounds and target slot maps; every draft accepted before the first round
    (the drafter then keeps its own random sample: the acceptance below is what that costs)."""
    llm = _llm(model, _draft_model(model))
    short = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    before_rounds = _run(llm, ["A short prompt.", "Another one."], short)
    result = _run(llm)
    shut_down_beside_others(llm)
    assert before_rounds["rounds"] == [0, 0]
    assert before_rounds["accepted"] == before_rounds["drafted"] > 0
    _assert_same_decisions(result, reference)
    assert 0 < result["accepted"] < result["drafted"]
    print(f"draft = target, own draws: {result['accepted']}/{result['drafted']} accepted")


def _watch_verification(llm) -> list[tuple[bool, int, int]]:
    """(the step fired a round, drafts verified, drafts accepted) for every request's
    speculative step, read where vLLM's scheduler learns them."""
    scheduler = _scheduler(llm)
    update, seen = scheduler.update_from_output, []

    def watched(scheduler_output, runner_output):
        for row, req_id in enumerate(runner_output.req_ids):
            drafts = len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()))
            if drafts:
                accepted = len(runner_output.sampled_token_ids[row]) - 1
                seen.append((req_id in scheduler_output.randkv.directives, drafts, accepted))
        return update(scheduler_output, runner_output)

    scheduler.update_from_output = watched
    return seen


def test_mirrored_draws_make_a_self_drafter_accept_every_draft_between_rounds(model, reference):
    """The drafter's layers planned with the target's layer indices: its KV is then the
    target's, slot for slot, through every round, so every draft is accepted except those a
    round step verifies (the drafter proposed them on the context before the round; the
    target verifies them on the compacted one). A drafter slot written or read at an
    absolute position, or a missed compaction, shows as a rejection between rounds."""
    llm = _llm(model, _draft_model(model))
    rounds = _runner(llm).randkv.rounds
    target_layers = len(rounds.layers) // 2
    mirrored = [layer % target_layers for layer in rounds.layers]
    rounds.planner = RoundPlanner(
        CONFIG, mirrored, rounds.planner.kv_heads, device=rounds.planner.device
    )
    steps = _watch_verification(llm)
    result = _run(llm)
    shut_down_beside_others(llm)
    _assert_same_decisions(result, reference)
    between = [(drafts, accepted) for fired, drafts, accepted in steps if not fired]
    at_rounds = [(drafts, accepted) for fired, drafts, accepted in steps if fired]
    assert len(between) > 40 and all(drafts == accepted for drafts, accepted in between)
    assert len(at_rounds) >= 3  # rounds fell on speculative steps


def test_a_draft_model_with_other_weights(model, reference):
    other = str(build_tiny_checkpoint(seed=1))
    llm = _llm(model, _draft_model(other))
    result = _run(llm)
    shut_down_beside_others(llm)
    _assert_same_decisions(result, reference)
    assert result["accepted"] < result["drafted"] / 2  # its guesses are mostly wrong


def test_preemption_and_cancellation_mid_speculation_return_every_block(model, reference):
    llm = _llm(model, _draft_model(model))
    engine = llm.llm_engine
    scheduler = _scheduler(llm)
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"kept-{index}", prompt, GREEDY)
    engine.add_request("cancelled", "A request cancelled mid-speculation.", GREEDY)
    finished, interrupted = {}, False
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
        running = [r.num_computed_tokens for r in scheduler.running]
        if not interrupted and len(running) == 3 and min(running) > CONFIG.max_physical_length:
            # Past the first round, drafts in flight: cancel one, preempt the others.
            engine.abort_request(["cancelled"])
            scheduler.reset_prefix_cache(reset_running_requests=True)
            interrupted = True
    assert interrupted
    preempted = scheduler.counters["preemptions"]
    pool = scheduler.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()
    shut_down_beside_others(llm)
    assert preempted >= 2
    assert [finished[f"kept-{i}"] for i in range(len(PROMPTS))] == reference["tokens"]
    assert "cancelled" not in finished
    assert free == COMMON["num_gpu_blocks_override"] - 1  # every block back


def test_async_scheduling_with_speculation_waits_for_verification_at_rounds(model, reference):
    with cpu_async_scheduling():
        llm = _llm(model, _draft_model(model), async_scheduling=True)
    result = _run(llm)
    counters = _scheduler(llm).counters
    shut_down_beside_others(llm)
    _assert_same_decisions(result, reference)
    assert counters["round_waits"] > 0  # a round waited for the step before it to verify
    assert result["accepted"] > 0


def test_seeded_sampling_with_speculation_keeps_the_spec_s_slot_maps(model):
    """Sampled tokens may differ from a run without speculation (vLLM's rejection sampler
    draws differently); the slot maps must still be the spec's for the tokens seen."""
    llm = _llm(model, _draft_model(str(build_tiny_checkpoint(seed=1))))
    params = SamplingParams(
        temperature=0.8, seed=11, max_tokens=NEW_TOKENS, ignore_eos=True,
        extra_args={"randkv_key": "seeded"},
    )  # fmt: skip
    result = _run(llm, params=params)
    shut_down_beside_others(llm)
    key = request_key_from_text("seeded")
    assert min(result["rounds"]) >= 3
    _assert_spec_maps(result, [key, key])


@pytest.mark.skipif(
    v2_requested(),
    reason="vLLM's V2 ngram kernel does not run in Triton's interpreter ('mask has "
    "unsupported dtype', plain vLLM too); the V1 run proves the scheduler's cut",
)
# In a process of its own: once vLLM's ngram proposer has imported numba, vLLM's kernel
# registry fails every later engine start in the process (tests/support/speculative_runs.py).
def test_ngram_gives_the_tokens_rounds_and_slot_maps_of_randkv_without_it(model, reference):
    spec = {"method": "ngram", "num_speculative_tokens": DRAFTS, "prompt_lookup_max": 3,
            "prompt_lookup_min": 1}  # fmt: skip
    greedy = {"temperature": 0, "max_tokens": NEW_TOKENS, "ignore_eos": True}
    keyed = {**greedy, "extra_args": {"randkv_key": "k"}}
    ran = speculative_runs.run_in_subprocess(
        {
            "model": model,
            "randkv": dataclasses.asdict(CONFIG),
            "engine": COMMON,
            "speculative_config": spec,
            "prompts": PROMPTS,
            "params": [greedy, keyed],
        }
    )
    result, keyed_result = ran["runs"]
    _assert_same_decisions(result, reference)
    assert result["accepted"] > 0, "no draft was accepted: nothing to prove"
    assert ran["counters"]["draft_steps_shortened"] > 0  # round boundaries fell inside steps
    key = request_key_from_text("k")
    _assert_spec_maps(keyed_result, [key, key])
