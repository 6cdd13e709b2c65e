"""The round planner as one Triton kernel: every (request, layer, KV head) row of a step.

Bit-identical to `randkv.spec.evicted_slots`: each program hashes its row's stream key and
draws BLOCK_D 32-bit values at a time (draw i is the high half of word i // 2 when i is even,
the low half otherwise), maps them into [0, n) with Lemire's rejection, and keeps the first
r distinct accepted values in draw order. A row stops as soon as it has r values; it gives
up after `caps[b]` draws (sized by `randkv.kernels.planner._safe_draws`, so that happens with
probability < 2**-100) and then clears the `ok` flag, which the planner asserts on the
device. A step is therefore one host-to-device copy, this kernel and one assert.

Hash arithmetic is uint64 with wrap-around, as in the spec; torch hands the bit patterns
over as int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from randkv import spec
from randkv.kernels.triton_jit import Kernel

#: Above this r the picks no longer fit one program's registers: the torch planner plans.
MAX_BUFFER = 512

_GAMMA = tl.constexpr(spec.GOLDEN_GAMMA)
_MULT_1 = tl.constexpr(spec.MIX_MULTIPLIER_1)
_MULT_2 = tl.constexpr(spec.MIX_MULTIPLIER_2)
_LOW32 = tl.constexpr(0xFFFFFFFF)
_TWO32 = tl.constexpr(1 << 32)


@triton.jit
def _mix64(x):
    x = (x ^ (x >> 30)) * _MULT_1
    x = (x ^ (x >> 27)) * _MULT_2
    return x ^ (x >> 31)


@triton.jit
def _fold(state, field):
    return _mix64((state ^ field) + _GAMMA)


def _plan_rows(
    keys,  # (B,) int64 request keys (read when HASH_KEYS)
    states,  # (B,) int64: request states, or round indices when HASH_KEYS
    sites,  # (S,) int64 site states of the planned (layer, head) pairs
    prompts,  # (B,) int64 prompt lengths
    caps,  # (B,) int64 draws after which a row gives up
    compacted,  # (B,) int64 K + r of each request (its own budget K)
    ok,  # (1,) int64 flag, cleared by a row that gave up
    out,  # (B, S, r) int64 evicted slots
    num_sites,
    r,
    seed_state,  # int64 bit pattern of spec.seed_state(seed)
    HASH_KEYS: tl.constexpr,
    BLOCK_R: tl.constexpr,  # r rounded up to a power of two
    BLOCK_D: tl.constexpr,  # draws per iteration
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // num_sites
    state = tl.load(states + b).to(tl.uint64, bitcast=True)
    if HASH_KEYS:
        key = tl.load(keys + b).to(tl.uint64, bitcast=True)
        seed = seed_state.to(tl.int64).to(tl.uint64, bitcast=True)
        state = _fold(_fold(seed, key), state)
    stream = _fold(state, tl.load(sites + pid % num_sites).to(tl.uint64, bitcast=True))
    prompt = tl.load(prompts + b)
    n = (tl.load(compacted + b) - prompt).to(tl.uint64)
    threshold = _TWO32 % n
    cap = tl.load(caps + b)
    lanes = tl.arange(0, BLOCK_D)
    slots = tl.arange(0, BLOCK_R)
    picks = tl.full([BLOCK_R], -1, tl.int64)  # values are >= 0: -1 matches nothing drawn
    count = tl.zeros([], tl.int32)
    base = tl.zeros([], tl.int64)
    while (count < r) & (base < cap):
        draw_index = base + lanes
        word = _mix64(stream + ((draw_index // 2) + 1).to(tl.uint64) * _GAMMA)
        draw = tl.where(draw_index % 2 == 0, word >> 32, word & _LOW32)
        scaled = draw * n
        accepted = (scaled & _LOW32) >= threshold
        # Rejected lanes get distinct values below -1: they equal nothing.
        value = tl.where(accepted, (scaled >> 32).to(tl.int64), -2 - lanes.to(tl.int64))
        unseen = tl.sum((value[:, None] == picks[None, :]).to(tl.int32), 1) == 0
        same = (value[:, None] == value[None, :]) & (lanes[None, :] < lanes[:, None])
        first_in_block = tl.sum(same.to(tl.int32), 1) == 0
        first = accepted & unseen & first_in_block
        flags = first.to(tl.int32)
        rank = count + tl.cumsum(flags, 0) - flags  # the slot each new value takes
        hit = (rank[None, :] == slots[:, None]) & first[None, :]  # (BLOCK_R, BLOCK_D)
        taken = tl.sum(hit.to(tl.int32), 1) > 0
        picks = tl.where(taken, tl.sum(tl.where(hit, value[None, :], 0), 1), picks)
        count += tl.sum(flags, 0)
        base += BLOCK_D
    tl.store(out + pid * r + slots, picks + prompt, mask=slots < r)
    tl.store(ok, tl.zeros([], tl.int64), mask=count < r)


KERNEL = Kernel(
    _plan_rows,
    # Per-step values: unspecialised, so a serving engine compiles one variant.
    do_not_specialize=("num_sites", "r", "seed_state"),
    do_not_specialize_on_alignment=(
        "keys",
        "states",
        "sites",
        "prompts",
        "caps",
        "compacted",
        "ok",
        "out",
    ),
    interpretable=False,
)


def block_sizes(r: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_D) for buffer size r."""
    if not 1 <= r <= MAX_BUFFER:
        raise ValueError(f"the Triton planner handles 1 <= r <= {MAX_BUFFER}, got r={r}")
    block_r = triton.next_power_of_2(r)
    return block_r, max(16, min(64, block_r))


def plan_rows(
    *,
    keys: torch.Tensor | None,
    states: torch.Tensor,
    sites: torch.Tensor,
    prompts: torch.Tensor,
    caps: torch.Tensor,
    compacted: torch.Tensor,
    ok: torch.Tensor,
    out: torch.Tensor,
    seed_state: int,
    warmup: bool = False,
) -> float:
    """Fill out (B, S, r) in one launch; with warmup=True only compile (seconds spent)."""
    batch, num_sites, r = out.shape
    block_r, block_d = block_sizes(r)
    args = (
        states if keys is None else keys,
        states,
        sites,
        prompts,
        caps,
        compacted,
        ok,
        out,
        num_sites,
        r,
        seed_state,
    )
    options = {
        "HASH_KEYS": keys is not None,
        "BLOCK_R": block_r,
        "BLOCK_D": block_d,
        "num_warps": 4 if block_r * block_d >= 4096 else 1,
    }
    grid = (max(1, batch * num_sites),)
    if warmup:
        return KERNEL.warmup(out.device, grid, *args, **options)
    KERNEL.launch(out.device, grid, *args, **options)
    return 0.0
