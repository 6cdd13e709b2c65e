"""Batched round planner: torch tensor ops, bit-identical to `randkv.spec`.

One call plans a round for many requests and all layers x KV heads at once, on any
device. Hash arithmetic runs in int64 with wrap-around, which reproduces the spec's
arithmetic modulo 2**64 on CPU and CUDA alike; logical right shifts are masked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from randkv import spec
from randkv.config import RandKVConfig


def _signed(value: int) -> int:
    """The int64 bit pattern of an unsigned 64-bit value."""
    value &= spec.MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GAMMA = _signed(spec.GOLDEN_GAMMA)
_MULT_1 = _signed(spec.MIX_MULTIPLIER_1)
_MULT_2 = _signed(spec.MIX_MULTIPLIER_2)
_LOW32 = 0xFFFFFFFF
_TABLE_BYTES = 32 * 2**20  # scratch per chunk of rows in the first-draw table


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """`spec.mix64` on int64 tensors holding uint64 bit patterns."""
    x = (x ^ _shift_right(x, 30)) * _MULT_1
    x = (x ^ _shift_right(x, 27)) * _MULT_2
    return x ^ _shift_right(x, 31)


def fold_key(state: torch.Tensor, field: torch.Tensor | int) -> torch.Tensor:
    """`spec.fold_key` on int64 tensors."""
    return mix64((state ^ field) + _GAMMA)


def to_key_tensor(keys: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """Request keys (unsigned 64-bit ints) as an int64 tensor of their bit patterns."""
    return torch.tensor([_signed(k) for k in keys], dtype=torch.int64, device=device)


@dataclass(frozen=True)
class RoundPlan:
    """One eviction round for a batch of requests.

    evicted[b, l, h] are the r slots (in draw order) that request b, layer l, head h
    empties; the token in slot sources[i] then moves into evicted[b, l, h, i].
    """

    evicted: torch.Tensor  # (requests, layers, kv_heads, r) int64
    sources: torch.Tensor  # (r,) int64: slots K + r .. K + 2r - 1

    @property
    def num_moves(self) -> int:
        return self.evicted.numel()


@lru_cache(maxsize=256)
def _expected_draws(n: int, r: int) -> int:
    """Draws that almost always yield r distinct values out of n, rounded up to even."""
    collisions = sum(n / (n - i) for i in range(r)) - r  # coupon collector, expected
    draws = r + math.ceil(1.1 * collisions + 4 * math.sqrt(collisions + 1)) + 2
    return draws + draws % 2


class RoundPlanner:
    """Plans rounds for a fixed set of global layers and KV heads on one device.

    A tensor-parallel rank passes its own global head indices and a pipeline stage
    its own global layer indices; decisions do not depend on the split.
    """

    def __init__(
        self,
        config: RandKVConfig,
        layers: Sequence[int],
        kv_heads: Sequence[int],
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.layers = tuple(layers)
        self.kv_heads = tuple(kv_heads)
        self.device = torch.device(device)
        layer_t = torch.tensor(self.layers, dtype=torch.int64, device=self.device)
        head_t = torch.tensor(self.kv_heads, dtype=torch.int64, device=self.device)
        # Per-site hash states do not depend on the request: compute them once.
        self._site_states = fold_key(fold_key(torch.zeros_like(layer_t), layer_t)[:, None], head_t)
        self._sources = torch.arange(
            config.compacted_length, config.max_physical_length, device=self.device
        )
        self._seed_state = _signed(spec.seed_state(config.seed))

    def stream_keys(self, request_keys: torch.Tensor, round_indices: torch.Tensor) -> torch.Tensor:
        """`spec.stream_key` for every (request, layer, head): shape (B, L, H)."""
        state = fold_key(torch.full_like(request_keys, self._seed_state), request_keys)
        state = fold_key(state, round_indices)
        return fold_key(state[:, None, None], self._site_states)

    @torch.inference_mode()
    def plan(
        self,
        prompt_lengths: torch.Tensor | Sequence[int],
        request_keys: torch.Tensor | Sequence[int],
        round_indices: torch.Tensor | Sequence[int],
    ) -> RoundPlan:
        """Plan one round for each of B requests.

        Arguments have shape (B,); request_keys are unsigned 64-bit ints, or an int64
        tensor of their bit patterns (see `to_key_tensor`).
        """
        config, r, device = self.config, self.config.buffer_size, self.device
        prompts = torch.as_tensor(prompt_lengths, dtype=torch.int64, device=device)
        rounds = torch.as_tensor(round_indices, dtype=torch.int64, device=device)
        batch = prompts.numel()
        shape = (batch, len(self.layers), len(self.kv_heads), r)
        if batch == 0:
            return RoundPlan(prompts.new_empty(shape), self._sources)
        longest, shortest = int(prompts.max()), int(prompts.min())
        config.check_prompt(longest)
        if shortest < 0:
            raise ValueError(f"prompt lengths must be >= 0, got {shortest}")
        if isinstance(request_keys, torch.Tensor):
            streams = self.stream_keys(request_keys.to(device), rounds)
        else:
            # A few requests per call (the engine's case): per-request states in Python
            # ints are exactly the spec's and save two dozen tiny tensor ops.
            states = [
                _signed(spec.request_state(config.seed, key, index))
                for key, index in zip(request_keys, rounds.tolist(), strict=True)
            ]
            state_t = torch.tensor(states, dtype=torch.int64, device=device)
            streams = fold_key(state_t[:, None, None], self._site_states)
        streams = streams.reshape(-1)
        candidates = config.compacted_length - prompts  # n per request, >= r
        sites = len(self.layers) * len(self.kv_heads)
        n = candidates.repeat_interleave(sites)[:, None]
        threshold = (1 << 32) % n
        max_n = config.compacted_length - shortest
        rows_per_chunk = max(1, _TABLE_BYTES // (4 * (max_n + 1)))
        num_draws = _expected_draws(config.compacted_length - longest, r)
        chunks = []
        for start in range(0, streams.numel(), rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            draws = num_draws
            while True:
                picks = _first_distinct(streams[rows], n[rows], threshold[rows], max_n, draws, r)
                if picks is not None:
                    break
                draws *= 2  # rare: a stream needed more draws; the result does not change
            chunks.append(picks)
        evicted = torch.cat(chunks).view(shape) + prompts[:, None, None, None]
        return RoundPlan(evicted=evicted, sources=self._sources)


def plan_round(
    config: RandKVConfig,
    *,
    prompt_lengths: torch.Tensor | Sequence[int],
    request_keys: torch.Tensor | Sequence[int],
    round_indices: torch.Tensor | Sequence[int],
    layers: Sequence[int],
    kv_heads: Sequence[int],
    device: torch.device | str = "cpu",
) -> RoundPlan:
    """One-shot `RoundPlanner(config, layers, kv_heads, device).plan(...)`."""
    planner = RoundPlanner(config, layers, kv_heads, device)
    return planner.plan(prompt_lengths, request_keys, round_indices)


def bounded_draws(
    streams: torch.Tensor, n: torch.Tensor, threshold: torch.Tensor, num_draws: int
) -> torch.Tensor:
    """Draws 0 .. num_draws-1 of each stream mapped into [0, n); rejected draws become n.

    Each 64-bit word yields two 32-bit draws, high half first (see docs/spec.md).
    """
    offsets = torch.arange(1, num_draws // 2 + 1, dtype=torch.int64, device=streams.device)
    words = mix64(streams[:, None] + offsets * _GAMMA)
    halves = torch.stack((_shift_right(words, 32), words & _LOW32), dim=-1)
    scaled = halves.view(streams.numel(), num_draws) * n
    return torch.where((scaled & _LOW32) >= threshold, scaled >> 32, n)


def _first_distinct(
    streams: torch.Tensor,
    n: torch.Tensor,
    threshold: torch.Tensor,
    max_n: int,
    num_draws: int,
    r: int,
) -> torch.Tensor | None:
    """First r distinct accepted draws of each stream, in draw order; None if too few draws."""
    values = bounded_draws(streams, n, threshold, num_draws)
    rows = streams.numel()
    counters = torch.arange(num_draws, dtype=torch.int32, device=streams.device).expand(rows, -1)
    # first_draw[row, v] = the earliest draw index that produced value v.
    first_draw = torch.full((rows, max_n + 1), num_draws, dtype=torch.int32, device=streams.device)
    first_draw.scatter_reduce_(1, values, counters, reduce="amin")
    is_first = (first_draw.gather(1, values) == counters) & (values < n)
    rank = is_first.cumsum(1)
    if bool((rank[:, -1] < r).any()):
        return None
    # Scatter the r earliest first occurrences to columns 0 .. r-1; the rest to column r.
    column = torch.where(is_first & (rank <= r), rank - 1, r)
    picks = values.new_zeros((rows, r + 1)).scatter_(1, column, values)
    return picks[:, :r]
