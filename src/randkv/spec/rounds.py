"""One eviction round's moves, and the one function that applies them to per-slot state.

A round empties r slots per (request, layer, KV head), the holes, and moves the r newest
tokens, which sit in the source slots [K + r, K + 2r), into them: the token in slot
sources[i] moves into holes[i]. Everything that keeps one value per slot (the spec's slot
list, the slot -> position maps, a policy's attention scores) follows a round through
`move_slots`. Standard library only, so `randkv.spec` can use it; torch tensors are handled
through their own methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from randkv.spec.config import RandKVConfig

if TYPE_CHECKING:
    import torch

__all__ = ["RoundPlan", "move_slots", "source_slots"]

#: One slot's value in a Python list of per-slot state.
Value = TypeVar("Value")


def source_slots(config: RandKVConfig) -> range:
    """Slots of the r newest tokens when a round fires, [K + r, K + 2r); the i-th fills the
    i-th hole."""
    return range(config.compacted_length, config.max_physical_length)


@overload
def move_slots(
    state: list[Value], holes: Sequence[int], sources: Sequence[int], *, fill: Value | None = None
) -> list[Value]: ...


@overload
def move_slots(
    state: torch.Tensor,
    holes: torch.Tensor,
    sources: Sequence[int] | torch.Tensor,
    *,
    fill: float | None = None,
) -> torch.Tensor: ...


def move_slots(
    state: list[Value] | torch.Tensor,
    holes: Sequence[int] | torch.Tensor,
    sources: Sequence[int] | torch.Tensor,
    *,
    fill: Any = None,  # the overloads type it: a list's value, or a tensor's number
) -> list[Value] | torch.Tensor:
    """Apply a round's moves in place along the last dimension and return `state`.

    state[..., holes[..., i]] takes state[..., sources[i]]; then, if `fill` is given, the
    source slots (free after the round) are set to it. A list takes a sequence of holes; a
    tensor takes holes of its leading shape plus r (on any device; moved to the state's),
    and sources of shape (r,), or (B, r) with one row per leading index of `state` (requests
    with their own budgets).
    """
    if isinstance(state, list):
        moved = [state[s] for s in sources]
        for hole, value in zip(holes, moved, strict=True):
            state[hole] = value
        if fill is not None:
            for s in sources:
                state[s] = fill
        return state
    device = state.device
    # A tensor state takes tensor holes (the overloads); `torch` is not imported here.
    holes = cast("torch.Tensor", holes).to(device)
    if not isinstance(sources, Sequence) and sources.dim() == 2:  # a row per request
        rows = sources.to(device).reshape(sources.shape[0], *[1] * (state.dim() - 2), -1)
        rows = rows.expand(*state.shape[:-1], rows.shape[-1])
        state.scatter_(-1, holes, state.gather(-1, rows))
        if fill is not None:
            state.scatter_(-1, rows, fill)
        return state
    index = list(sources) if isinstance(sources, Sequence) else sources.to(device)
    state.scatter_(-1, holes, state[..., index])
    if fill is not None:
        state[..., index] = fill
    return state


@dataclass(frozen=True)
class RoundPlan:
    """One eviction round for a batch of requests.

    evicted[b, l, h] are the r slots (in draw order) that request b, layer l, head h
    empties; the token in slot sources[i] (sources[b, i] when requests have their own
    budgets) then moves into evicted[b, l, h, i].
    """

    evicted: torch.Tensor  # (requests, layers, kv_heads, r) int64
    sources: torch.Tensor  # (r,) or (requests, r) int64: slots K + r .. K + 2r - 1

    @classmethod
    def of(
        cls, config: RandKVConfig, evicted: torch.Tensor, budgets: Sequence[int] | None = None
    ) -> RoundPlan:
        """The plan that fills `evicted` from the source slots (on its device) of the
        config's K, or of each request's own K in `budgets`."""
        if budgets is None or all(b == config.budget for b in budgets):
            return cls(evicted=evicted, sources=evicted.new_tensor(source_slots(config)))
        r = config.buffer_size
        rows = [list(range(b + r, b + 2 * r)) for b in budgets]
        return cls(evicted=evicted, sources=evicted.new_tensor(rows))

    def row_sources(self, row: int) -> torch.Tensor:
        """The source slots of request `row`, (r,)."""
        return self.sources if self.sources.dim() == 1 else self.sources[row]

    @property
    def num_moves(self) -> int:
        return self.evicted.numel()

    def apply(self, state: torch.Tensor, *, fill: float | None = None) -> torch.Tensor:
        """`move_slots` with this plan's moves; state has the plan's leading shape."""
        return move_slots(state, self.evicted, self.sources, fill=fill)
