"""Batched round planner: torch tensor ops, bit-identical to `randkv.spec`.

One call plans a round for many requests and all layers x KV heads at once, on any
device. Hash arithmetic runs in int64 with wrap-around, which reproduces the spec's
arithmetic modulo 2**64 on CPU and CUDA alike; logical right shifts are masked.

Host syncs: none. Every size and loop bound is computed on the host from the Python-int
inputs; each stream is given enough draws (see `_safe_draws`) that the spec's sampling
finishes within them except with probability < 2**-100, so there is no "too few draws"
retry to decide on the host. That case is still checked, on the device, by an assert
(`torch._assert_async`): the call fails rather than return a plan that differs from the
spec (on CUDA the failure surfaces asynchronously, as a device-side assert).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch

from randkv import spec
from randkv.kernels.hostsync import host_to_device
from randkv.spec.config import PromptTooLongError, RandKVConfig
from randkv.spec.rounds import RoundPlan, source_slots


def _signed(value: int) -> int:
    """The int64 bit pattern of an unsigned 64-bit value."""
    value &= spec.MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GAMMA = _signed(spec.GOLDEN_GAMMA)
_MULT_1 = _signed(spec.MIX_MULTIPLIER_1)
_MULT_2 = _signed(spec.MIX_MULTIPLIER_2)
_LOW32 = 0xFFFFFFFF


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


_SCRATCH_BYTES = 64 * 2**20  # default working memory per chunk of rows
_BYTES_PER_DRAW = 48  # per row and draw: words, halves, products, values, flags, ranks
# Draw counts are sized so that a stream runs short with probability < 2**-100 (the hash
# modelled as random); if one ever does, a device-side assert fails the call.
_LOG_FAILURE = 100 * math.log(2)


def _draw_bucket(n: int, r: int) -> tuple[int, int]:
    """A cache-friendly range [low, low + width) holding n: n rounded down to 8 bits, >= r."""
    width = 1 << max(0, n.bit_length() - 8)
    return max(r, n - n % width), width


@lru_cache(maxsize=4096)
def _safe_draws(low: int, width: int, r: int) -> int:
    """Even draw count giving r distinct accepted values out of any n in [low, low + width),
    except with probability < 2**-100.

    The draws needed are a sum of r geometric variables (the i-th new value succeeds with
    probability accept * (n - i) / n); this is the Chernoff bound on its upper tail,
    minimised over t by golden-section search (the bound is quasi-convex in t).
    """
    # The rejection threshold, 2**32 mod n: exact for one n, else bounded by n.
    threshold = (1 << 32) % low if width == 1 else low + width
    accept = 1 - threshold / 2**32
    probs = [accept * (low - i) / low for i in range(r)]
    if probs[-1] >= 1.0:
        return r + r % 2

    def bound(log_t: float) -> float:  # D + 1 at which P(draws > D) <= 2**-100
        t = math.exp(log_t)
        grow = math.exp(t)
        log_mgf = sum(math.log(p) + t - math.log1p((p - 1) * grow) for p in probs)
        return (log_mgf + _LOG_FAILURE) / t

    log_t_max = math.log(-math.log1p(-probs[-1]))  # the MGF is finite below t_max
    lo, hi = log_t_max - 16.0, log_t_max - 1e-9
    golden = (math.sqrt(5) - 1) / 2
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = bound(a), bound(b)
    for _ in range(40):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = bound(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = bound(b)
    draws = max(r, math.ceil(min(fa, fb)))
    return draws + draws % 2


def _table_dtype(num_draws: int) -> torch.dtype:
    return torch.int16 if num_draws < 2**15 else torch.int32


def _row_bytes(max_n: int, num_draws: int) -> int:
    table = torch.empty((), dtype=_table_dtype(num_draws)).element_size() * (max_n + 1)
    return table + _BYTES_PER_DRAW * num_draws


def _chunks(
    candidates: Sequence[int], draws: Sequence[int], sites: int, scratch_bytes: int
) -> list[tuple[int, int, int, int]]:
    """Row ranges (start, stop, max n, draws) for requests sorted by draws, most first.

    Consecutive requests share a chunk while its scratch fits and their draw counts are
    within 2x; a request too big for one chunk is split by rows.
    """
    groups: list[list[int]] = []  # [first request, stop, max n, draws]
    for b, (n, d) in enumerate(zip(candidates, draws, strict=True)):
        if groups:
            group = groups[-1]
            max_n = max(group[2], n)
            rows = (b + 1 - group[0]) * sites
            if 2 * d > group[3] and rows * _row_bytes(max_n, group[3]) <= scratch_bytes:
                group[1], group[2] = b + 1, max_n
                continue
        groups.append([b, b + 1, n, d])
    chunks = []
    for first, stop, max_n, d in groups:
        step = max(1, scratch_bytes // _row_bytes(max_n, d))
        for start in range(first * sites, stop * sites, step):
            chunks.append((start, min(start + step, stop * sites), max_n, d))
    return chunks


def _host_ints(values: torch.Tensor | Sequence[int]) -> list[int]:
    """Python ints; a tensor is read with .tolist() (free on CPU, a sync on a device)."""
    if isinstance(values, torch.Tensor):
        return [int(v) for v in values.reshape(-1).tolist()]
    return [int(v) for v in values]


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
        *,
        scratch_bytes: int = _SCRATCH_BYTES,
        backend: str = "auto",
    ) -> None:
        self.config = config
        self.scratch_bytes = scratch_bytes  # working memory per chunk of planned rows
        self.layers = tuple(layers)
        self.kv_heads = tuple(kv_heads)
        self.device = torch.device(device)
        layer_t = torch.tensor(self.layers, dtype=torch.int64, device=self.device)
        head_t = torch.tensor(self.kv_heads, dtype=torch.int64, device=self.device)
        # Per-site hash states do not depend on the request: compute them once.
        self._site_states = fold_key(fold_key(torch.zeros_like(layer_t), layer_t)[:, None], head_t)
        self._sources = torch.tensor(source_slots(config), dtype=torch.int64, device=self.device)
        self._seed_state = _signed(spec.seed_state(config.seed))
        self.backend = _choose_backend(backend, self.device, config.buffer_size)
        self._site_flat = self._site_states.reshape(-1).contiguous()

    def warmup(self) -> float:
        """Compile the Triton planner's variant for Python-int keys (the engine's); seconds
        spent (0.0 with the torch backend or on CPU)."""
        if self.backend != "triton":
            return 0.0
        from randkv.kernels import triton_planner

        sites, r = self._site_flat.numel(), self.config.buffer_size
        ints = torch.zeros(5, dtype=torch.int64, device=self.device)
        return triton_planner.plan_rows(
            keys=None,
            states=ints[:1],
            sites=self._site_flat,
            prompts=ints[1:2],
            caps=ints[2:3],
            compacted=ints[3:4],
            ok=ints[4:],
            out=torch.empty((1, sites, r), dtype=torch.int64, device=self.device),
            seed_state=self._seed_state,
            warmup=True,
        )

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
        budgets: Sequence[int] | None = None,
    ) -> RoundPlan:
        """Plan one round for each of B requests, without reading device data back.

        prompt_lengths and round_indices are B Python ints (a tensor is read with
        .tolist(): free for a CPU tensor, a host sync for a device one). request_keys are
        B unsigned 64-bit ints, or an int64 tensor of their bit patterns on any device (see
        `to_key_tensor`). budgets are each request's own K (`RandKVConfig.request_budget`),
        default the config's for that prompt (long prompts under `min_generated` included).
        Host data reaches the device in one pinned, non-blocking copy; with Python-int
        inputs the call makes no host sync.
        """
        config, r, device = self.config, self.config.buffer_size, self.device
        prompts, rounds = _host_ints(prompt_lengths), _host_ints(round_indices)
        batch = len(prompts)
        if len(rounds) != batch or len(request_keys) != batch:
            raise ValueError(
                f"got {batch} prompt lengths, {len(request_keys)} request keys and "
                f"{len(rounds)} round indices"
            )
        shape = (batch, len(self.layers), len(self.kv_heads), r)
        if batch == 0:
            return RoundPlan(torch.empty(shape, dtype=torch.int64, device=device), self._sources)
        if min(prompts) < 0:
            raise ValueError(f"prompt lengths must be >= 0, got {min(prompts)}")
        if budgets is None:
            budgets = [config.request_budget(p) for p in prompts]
        elif len(budgets) != batch:
            raise ValueError(f"got {len(budgets)} budgets for {batch} requests")
        for prompt, budget in zip(prompts, budgets, strict=True):
            if prompt > budget:
                raise PromptTooLongError(prompt, budget)
        compacted = [budget + r for budget in budgets]  # K + r of each request
        candidates = [c - p for c, p in zip(compacted, prompts, strict=True)]  # n, >= r
        draws = [_safe_draws(*_draw_bucket(n, r), r) for n in candidates]
        sources = self._plan_sources(budgets)
        if self.backend == "triton":
            return self._plan_triton(prompts, request_keys, rounds, draws, compacted, sources)
        # Requests that need many draws (prompts near K) go first and share chunks.
        order = sorted(range(batch), key=lambda b: -draws[b])
        inverse = sorted(range(batch), key=order.__getitem__)
        tensor_keys = isinstance(request_keys, torch.Tensor)
        if tensor_keys:
            second = [_signed(index) for index in rounds]
        else:
            # A few requests per call (the engine's case): per-request states in Python
            # ints are exactly the spec's and save two dozen tiny tensor ops.
            second = [
                _signed(spec.request_state(config.seed, key, index))
                for key, index in zip(request_keys, rounds, strict=True)
            ]
        packed = torch.tensor(prompts + second + order + inverse + compacted, dtype=torch.int64)
        prompt_t, second_t, order_t, inverse_t, compacted_t = host_to_device(packed, device).view(
            5, batch
        )
        if isinstance(request_keys, torch.Tensor):
            keys = host_to_device(request_keys.to(torch.int64), device)
            streams = self.stream_keys(keys, second_t)
        else:
            streams = fold_key(second_t[:, None, None], self._site_states)
        permuted = order != list(range(batch))
        if permuted:
            streams = streams.index_select(0, order_t)
            prompt_t = prompt_t.index_select(0, order_t)
            compacted_t = compacted_t.index_select(0, order_t)
        sites = len(self.layers) * len(self.kv_heads)
        streams = streams.reshape(-1)
        n = (compacted_t - prompt_t)[:, None].expand(batch, sites).reshape(-1, 1)
        threshold = (1 << 32) % n
        chunks = _chunks(
            [candidates[b] for b in order], [draws[b] for b in order], sites, self.scratch_bytes
        )
        picks = [
            _first_distinct(streams[a:z], n[a:z], threshold[a:z], max_n, num_draws, r)
            for a, z, max_n, num_draws in chunks
        ]
        evicted = (picks[0] if len(picks) == 1 else torch.cat(picks)).view(shape)
        evicted = evicted + prompt_t[:, None, None, None]
        if permuted:
            evicted = evicted.index_select(0, inverse_t)
        return RoundPlan(evicted=evicted, sources=sources)

    def _plan_sources(self, budgets: Sequence[int]) -> torch.Tensor:
        """The source slots [K + r, K + 2r): shared (r,) when every request has the
        config's K, else one row per request (B, r)."""
        config = self.config
        if all(budget == config.budget for budget in budgets):
            return self._sources
        r = config.buffer_size
        rows = [list(range(budget + r, budget + 2 * r)) for budget in budgets]
        return host_to_device(torch.tensor(rows, dtype=torch.int64), self.device)

    def _plan_triton(
        self,
        prompts: list[int],
        request_keys: torch.Tensor | Sequence[int],
        rounds: list[int],
        draws: list[int],
        compacted: list[int],
        sources: torch.Tensor,
    ) -> RoundPlan:
        """One host-to-device copy, one kernel, one device-side assert (see triton_planner)."""
        from randkv.kernels import triton_planner

        batch, device = len(prompts), self.device
        tensor_keys = isinstance(request_keys, torch.Tensor)
        if tensor_keys:
            states = [_signed(index) for index in rounds]  # the kernel hashes the keys
        else:
            states = [
                _signed(spec.request_state(self.config.seed, key, index))
                for key, index in zip(request_keys, rounds, strict=True)
            ]
        # The ok flag (1 until a row runs out of draws) rides in the same copy.
        packed = torch.tensor(prompts + states + draws + compacted + [1], dtype=torch.int64)
        on_device = host_to_device(packed, device)
        prompt_t, state_t, cap_t, compacted_t = on_device[: 4 * batch].view(4, batch)
        ok = on_device[4 * batch :]
        keys = (
            host_to_device(request_keys.to(torch.int64), device)
            if isinstance(request_keys, torch.Tensor)
            else None
        )
        r = self.config.buffer_size
        out = torch.empty((batch, self._site_flat.numel(), r), dtype=torch.int64, device=device)
        triton_planner.plan_rows(
            keys=keys,
            states=state_t,
            sites=self._site_flat,
            prompts=prompt_t,
            caps=cap_t,
            compacted=compacted_t,
            ok=ok,
            out=out,
            seed_state=self._seed_state,
        )
        torch._assert_async(ok[0], "RandKV planner: a stream ran out of draws")
        shape = (batch, len(self.layers), len(self.kv_heads), r)
        return RoundPlan(evicted=out.view(shape), sources=sources)


def planner_peak_bytes(
    config: RandKVConfig, sites: int, max_batch: int, device: torch.device | str = "cuda"
) -> int:
    """Device memory one planned step of up to `max_batch` rounds can take at its peak.

    Triton backend: the plan itself (int64) and one packed copy of the inputs. Torch
    backend: the plan plus one chunk of scratch (`_SCRATCH_BYTES`). vLLM profiles memory
    before the first round, so its KV budget must leave this much free.
    """
    r = config.buffer_size
    plan = max_batch * sites * r * 8
    backend = _choose_backend("auto", torch.device(device), r)
    if backend == "triton":
        return 2 * plan + (3 * max_batch + 1) * 8
    return 3 * plan + _SCRATCH_BYTES  # the plan, its reorderings, one chunk of scratch


def _choose_backend(backend: str, device: torch.device, buffer_size: int) -> str:
    """ "torch" or "triton": "auto" takes the one-launch Triton planner on CUDA."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"planner backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto":
        if device.type != "cuda":
            return "torch"
        try:
            from randkv.kernels import triton_planner
        except ImportError:  # no Triton: the torch planner works everywhere
            return "torch"
        return "triton" if buffer_size <= triton_planner.MAX_BUFFER else "torch"
    if backend == "triton":
        from randkv.kernels import triton_planner

        triton_planner.block_sizes(buffer_size)  # refuses an r it cannot plan
    return backend


def plan_round(
    config: RandKVConfig,
    *,
    prompt_lengths: torch.Tensor | Sequence[int],
    request_keys: torch.Tensor | Sequence[int],
    round_indices: torch.Tensor | Sequence[int],
    layers: Sequence[int],
    kv_heads: Sequence[int],
    device: torch.device | str = "cpu",
    budgets: Sequence[int] | None = None,
) -> RoundPlan:
    """One-shot `RoundPlanner(config, layers, kv_heads, device).plan(...)`."""
    planner = RoundPlanner(config, layers, kv_heads, device)
    return planner.plan(prompt_lengths, request_keys, round_indices, budgets)


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
) -> torch.Tensor:
    """First r distinct accepted draws of each stream, in draw order.

    num_draws must suffice for every row (see `_safe_draws`). Checking that on the host
    would be a sync; a device-side assert checks it instead (on CUDA a failure surfaces,
    asynchronously, as a device-side assert error rather than as a wrong plan).
    """
    values = bounded_draws(streams, n, threshold, num_draws)
    rows, device, dtype = streams.numel(), streams.device, _table_dtype(num_draws)
    counters = torch.arange(num_draws, dtype=dtype, device=device).expand(rows, -1)
    # first_draw[row, v] = the earliest draw index that produced value v.
    first_draw = torch.full((rows, max_n + 1), num_draws, dtype=dtype, device=device)
    first_draw.scatter_reduce_(1, values, counters, reduce="amin")
    is_first = (first_draw.gather(1, values) == counters) & (values < n)
    rank = is_first.cumsum(1, dtype=torch.int32)
    torch._assert_async(rank[:, -1].min() >= r, "RandKV planner: a stream ran out of draws")
    # Scatter the r earliest first occurrences to columns 0 .. r-1; the rest to column r.
    column = torch.where(is_first & (rank <= r), rank - 1, r).to(torch.int64)
    picks = values.new_zeros((rows, r + 1)).scatter_(1, column, values)
    return picks[:, :r]
