"""Per-(layer, head) slot -> absolute position maps, for observability and tests."""

from __future__ import annotations

import torch

from randkv.spec.config import RandKVConfig
from randkv.spec.rounds import move_slots


class SlotPositionMap:
    """Tracks which absolute position each physical slot of one request holds.

    Mirrors what the compactor does to the real cache, using the same plans, so the
    engine can report retained positions without reading the KV tensors.
    """

    def __init__(self, config: RandKVConfig, num_layers: int, num_kv_heads: int) -> None:
        self.config = config
        self.positions = torch.full(
            (num_layers, num_kv_heads, config.max_physical_length), -1, dtype=torch.int64
        )
        self.length = 0  # physical length, the same for every head
        self.tokens_seen = 0
        self.round_tokens_seen = 0  # tokens seen when the last round ran

    def append(self, count: int) -> None:
        """Record `count` new tokens written in order after the current physical end."""
        end = self.length + count
        if end > self.config.max_physical_length:
            raise ValueError(
                f"physical length {end} exceeds K + 2r = {self.config.max_physical_length}; "
                "a round was missed"
            )
        self.positions[:, :, self.length : end] = torch.arange(
            self.tokens_seen, self.tokens_seen + count
        )
        self.length, self.tokens_seen = end, self.tokens_seen + count

    def roll_back(self, tokens_seen: int) -> bool:
        """Forget the tokens after `tokens_seen`: speculative drafts the model rejected
        (vLLM rolls a request back after verification, and no round runs in between, so
        they are the newest slots). False, changing nothing, when that would reach back past
        the last round (a request resumed after preemption starts over instead)."""
        drop = self.tokens_seen - tokens_seen
        since_round = self.tokens_seen - self.round_tokens_seen
        if not 0 <= drop <= since_round:
            return False
        self.positions[:, :, self.length - drop : self.length] = -1
        self.length -= drop
        self.tokens_seen = tokens_seen
        return True

    def apply_round(self, evicted: torch.Tensor, sources: torch.Tensor) -> None:
        """Apply one request's plan: evicted (L, H, r) holes take the tokens at `sources`."""
        if self.length != self.config.max_physical_length:
            raise ValueError(f"a round needs physical length K + 2r, have {self.length}")
        move_slots(self.positions, evicted, sources, fill=-1)
        self.length = self.config.compacted_length
        self.round_tokens_seen = self.tokens_seen

    def slot_positions(self, layer: int, kv_head: int) -> tuple[int, ...]:
        return tuple(self.positions[layer, kv_head, : self.length].tolist())

    def retained_positions(self, layer: int, kv_head: int) -> tuple[int, ...]:
        return tuple(sorted(self.slot_positions(layer, kv_head)))
