"""What the observation-window policies (SnapKV, R-KV) share: the r newest queries' votes,
and pooling along positions."""

from __future__ import annotations

from collections.abc import Callable

import torch

from randkv.selectors.view import AttentionStep

Pool = Callable[..., torch.Tensor]  # torch.nn.functional.avg_pool1d or max_pool1d


def check_odd_kernel(kernel: int) -> None:
    if kernel % 2 == 0:
        raise ValueError("the pooling kernel must be odd")


def window_queries(step: AttentionStep) -> torch.Tensor | None:
    """Bool (rows, queries): the queries in the buffer slots, i.e. the r tokens written since
    the previous round, which vote for the next one; None when this forward has none."""
    window = step.query_slots >= step.config.compacted_length
    return window if bool(window.any()) else None


def pool_by_position(
    values: torch.Tensor, positions: torch.Tensor, kernel: int, pool: Pool
) -> torch.Tensor:
    """Pool `values` over neighbouring *positions* along the last (slot) dimension and return
    them in slot order: slot order is arbitrary after hole-filling rounds."""
    order = positions.argsort(dim=-1)
    flat = values.gather(-1, order).reshape(-1, 1, values.shape[-1])
    pooled = pool(flat, kernel, stride=1, padding=kernel // 2).reshape(values.shape)
    return torch.empty_like(values).scatter_(-1, order, pooled)
