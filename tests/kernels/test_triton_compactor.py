"""The one-launch Triton compactor, run by Triton's interpreter on CPU, against torch's."""

from __future__ import annotations

import os
from collections import Counter

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest  # noqa: E402
import torch  # noqa: E402

from randkv import RandKVConfig, slot_positions  # noqa: E402
from randkv.kernels.compactor import KVLayout, PagedCompactor  # noqa: E402
from randkv.kernels.hostsync import count_host_syncs  # noqa: E402
from randkv.kernels.planner import RoundPlanner  # noqa: E402
from randkv.kernels.reference import kv_layout, poisoned_caches, same_bits  # noqa: E402
from randkv.kernels.triton_jit import Kernel  # noqa: E402

triton_compactor = pytest.importorskip("randkv.kernels.triton_compactor")
TritonCompactor = triton_compactor.TritonCompactor

SPLIT = KVLayout.KV_BLOCK_SLOT_HEAD
FLASH = KVLayout.BLOCK_HEAD_SLOT


def seeded(seed):
    return torch.Generator().manual_seed(seed)


CASES = [
    # cache layout, dtype, block_size, heads, requests, layers, budget, buffer
    ("NHD", torch.bfloat16, 4, 1, 3, 2, 13, 3),
    ("NHD", torch.float16, 16, 3, 2, 3, 20, 5),
    ("HND", torch.bfloat16, 5, 2, 3, 2, 17, 4),
    ("HND", torch.float32, 3, 1, 1, 1, 6, 2),
    ("split", torch.bfloat16, 4, 2, 3, 2, 13, 3),
    ("split", torch.float32, 6, 1, 2, 3, 9, 4),
    ("split", torch.float16, 16, 3, 1, 2, 30, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-b{c[2]}")
def test_triton_equals_torch_bit_for_bit(case, monkeypatch):
    name, dtype, block_size, heads, requests, layers, budget, buffer = case
    layout = kv_layout(name)
    config = RandKVConfig(budget=budget, buffer_size=buffer, seed=block_size)
    per_request = -(-config.max_physical_length // block_size)  # partial last block
    num_blocks = requests * per_request + 3  # three blocks nobody owns
    generator = torch.Generator().manual_seed(budget)
    tables = torch.randperm(num_blocks, generator=generator)[: requests * per_request]
    tables = tables.view(requests, per_request)
    prompts = [budget, 0, budget // 2][:requests]  # a prompt of exactly K included
    plan = RoundPlanner(config, range(layers), range(heads)).plan(
        prompts, list(range(requests)), [0, 2**31 + 1, 5][:requests]
    )
    caches = poisoned_caches(
        name, layers, num_blocks, block_size, heads, 4, dtype, "cpu", generator=seeded(1)
    )
    expected = [c.clone() for c in caches]
    PagedCompactor(layout, block_size).apply(plan, expected, tables)
    monkeypatch.setattr(Kernel, "tracking", True)
    monkeypatch.setattr(triton_compactor.KERNEL, "launched", Counter())
    compactor = TritonCompactor(layout, block_size)
    with count_host_syncs() as syncs:
        compactor.apply(plan, caches, tables)
    # Every request, layer and head in one launch.
    assert sum(triton_compactor.KERNEL.launched.values()) == 1
    assert syncs.total == 0, dict(syncs.counts)
    for got, want in zip(caches, expected, strict=True):
        assert same_bits(got, want)
    assert compactor.moved_bytes(plan, caches) == PagedCompactor(layout, block_size).moved_bytes(
        plan, caches
    )


def test_multi_round_replay_matches_the_spec():
    """Caches whose values are positions, compacted round after round by the kernel."""
    config = RandKVConfig(budget=11, buffer_size=3, seed=9)
    prompt, key, heads, layers, block_size = 4, 123, 2, 2, 4
    blocks = -(-config.max_physical_length // block_size)
    table = torch.tensor([list(range(blocks, 2 * blocks))[::-1]])
    caches = [torch.full((2, 2 * blocks, block_size, heads, 2), -1.0) for _ in range(layers)]
    planner = RoundPlanner(config, range(layers), range(heads))
    compactor = TritonCompactor(SPLIT, block_size)
    length = 0
    for position in range(config.max_physical_length + 3 * config.buffer_size):
        for cache in caches:
            cache[:, int(table[0, length // block_size]), length % block_size] = float(position)
        length += 1
        if length == config.max_physical_length:
            index = (position + 1 - config.max_physical_length) // config.buffer_size
            compactor.apply(planner.plan([prompt], [key], [index]), caches, table)
            length = config.compacted_length
    for layer in range(layers):
        for head in range(heads):
            slots = torch.arange(length)
            got = caches[layer][0, table[0, slots // block_size], slots % block_size, head, 0]
            want = slot_positions(
                config,
                prompt_length=prompt,
                tokens_seen=config.max_physical_length + 3 * config.buffer_size,
                request_key=key,
                layer=layer,
                kv_head=head,
            )
            assert tuple(int(v) for v in got.tolist()) == want


def test_requests_with_their_own_budgets_in_one_launch():
    """Rows with different K (a long prompt under min_generated beside short ones): each
    moves its tokens from its own source slots, bit for bit like the torch compactor."""
    config = RandKVConfig(budget=8, buffer_size=3, seed=4, min_generated=5)
    prompts, block_size, heads, layers = [2, 14, 6], 4, 2, 2
    budgets = [config.request_budget(p) for p in prompts]
    assert budgets == [8, 19, 11]
    per_request = -(-(max(budgets) + 2 * config.buffer_size) // block_size)
    num_blocks = len(prompts) * per_request + 1
    tables = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1))
    tables = tables[: len(prompts) * per_request].view(len(prompts), per_request)
    plan = RoundPlanner(config, range(layers), range(heads)).plan(prompts, [1, 2, 3], [0, 4, 9])
    assert plan.sources.shape == (3, config.buffer_size)
    caches = poisoned_caches(
        "NHD", layers, num_blocks, block_size, heads, 4, torch.half, "cpu", generator=seeded(2)
    )
    before = [c.clone() for c in caches]
    expected = [c.clone() for c in caches]
    PagedCompactor(FLASH, block_size).apply(plan, expected, tables)
    TritonCompactor(FLASH, block_size).apply(plan, caches, tables)
    for got, want, old in zip(caches, expected, before, strict=True):
        assert same_bits(got, want)
        assert not same_bits(got, old)  # the round moved something


def test_triton_compactor_refusals():
    config = RandKVConfig(budget=16, buffer_size=4)
    plan = RoundPlanner(config, [0], [0]).plan([2], [1], [0])
    tables = torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="use PagedCompactor"):
        TritonCompactor(KVLayout.VLLM_CPU_VEC, 16)
    with pytest.raises(ValueError, match=r"holds 8 slots per block .* block size is 16"):
        TritonCompactor(FLASH, 16).apply(plan, [torch.zeros(8, 1, 8, 8)], tables)
    with pytest.raises(ValueError, match=r"holds 8 slots per block .* block size is 16"):
        TritonCompactor(SPLIT, 16).apply(plan, [torch.zeros(2, 8, 8, 1, 4)], tables)
    assert isinstance(
        triton_compactor.make_compactor(FLASH, 16, "cpu"), PagedCompactor
    )  # the torch path stays the CPU path
    assert isinstance(triton_compactor.make_compactor(SPLIT, 16, "cuda"), TritonCompactor)


@pytest.mark.filterwarnings("ignore::UserWarning")  # Triton's note on an fp-fusion default
@pytest.mark.parametrize("name", ["NHD", "split"])
def test_kernel_compiles_for_hopper_with_vectorized_row_copies(name):
    """No GPU needed: Triton's NVIDIA backend compiles the kernel to PTX for sm_90."""
    compiler = pytest.importorskip("triton.compiler")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    caches = poisoned_caches(name, 2, 8, 16, 8, 128, torch.bfloat16, "cpu", generator=seeded(0))
    geo = triton_compactor._geometry(kv_layout(name), caches)
    kernel = JITFunction(triton_compactor._fill_holes)  # compiled, whatever TRITON_INTERPRET says
    pointers = ("layer_addrs", "evicted", "sources", "tables")
    constants = {
        "ROW": geo.row,
        "ROW_BLOCK": geo.row,
        "HALVES": geo.halves,
        "BLOCK_M": 32,
        "WORD": triton_compactor._WORDS[geo.word],
        "ALIGN": geo.align,
    }
    signature = {
        name: "constexpr" if name in constants else "*i64" if name in pointers else "i32"
        for name in kernel.arg_names
    }
    aligned = [i for i, name in enumerate(kernel.arg_names) if name in pointers]
    aligned += [kernel.arg_names.index(f"stride_{s}") for s in ("block", "head", "slot")]
    source = compiler.ASTSource(
        kernel, signature, constants, {(i,): [["tt.divisibility", 16]] for i in aligned}
    )
    try:
        compiled = compiler.compile(source, target=GPUTarget("cuda", 90, 32))
    except RuntimeError as error:  # e.g. no ptxas shipped with this Triton
        pytest.skip(f"no NVIDIA toolchain: {error}")
    ptx = compiled.asm["ptx"]
    assert geo.word == 8 and geo.align == 16
    assert "ld.global.v2.b64" in ptx and "st.global.v2.b64" in ptx  # 16-byte row accesses


def test_warmup_compiles_the_only_variant_serving_meets(monkeypatch):
    """After `warmup`, rounds with any batch, table width (1, a multiple of 16, other) and
    fresh plan tensors launch under the warmed specialisation key: no compile in a step."""
    config = RandKVConfig(budget=40, buffer_size=4, seed=2)
    layers, heads, block_size = 2, 2, 4
    caches = poisoned_caches(
        "NHD", layers, 80, block_size, heads, 4, torch.bfloat16, "cpu", generator=seeded(3)
    )
    kernel = triton_compactor.KERNEL
    monkeypatch.setattr(Kernel, "tracking", True)
    monkeypatch.setattr(kernel, "launched", Counter())
    monkeypatch.setattr(kernel, "warmed", set())
    compactor = TritonCompactor(FLASH, block_size)
    compactor.warmup(caches, config.buffer_size)
    assert len(kernel.warmed) == 1
    planner = RoundPlanner(config, range(layers), range(heads))
    blocks = -(-config.max_physical_length // block_size)  # 12
    for batch, width in ((1, blocks), (2, 16), (1, 17), (3, 32)):
        tables = torch.arange(batch * width).view(batch, width) % 80
        plan = planner.plan([0] * batch, list(range(batch)), [width] * batch)
        compactor.apply(plan, caches, tables)
    assert set(kernel.launched) == kernel.warmed, "a serving step met an unwarmed variant"
    # The check can fail: with the width specialised, widths 16 and 17 are two variants.
    plain = Kernel(triton_compactor._fill_holes)
    width_16, width_17 = [None] * 4 + [16], [None] * 4 + [17]  # table_width is argument 5
    assert plain.specialization(width_16, {}) != plain.specialization(width_17, {})
    assert kernel.specialization(width_16, {}) == kernel.specialization(width_17, {})
