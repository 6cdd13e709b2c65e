"""The selector interface and the template for scored policies.

A selector runs inside `randkv.hf.RandKVCache` on RandKV's cadence: a round fires when a
row's physical length reaches K + 2r, empties r slots of [0, K + r) per (layer, KV head), and
the r newest tokens move into them. Selectors differ only in *which* r slots go, so the
budget (K + r tokens per head after a round, K + 2r at most) is the same for every policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from randkv.selectors.view import AttentionStep, RoundView

__all__ = ["PromptChoice", "ScoredSelector", "Selector", "lowest"]


class Selector(ABC):
    """Chooses the slots each round empties. Subclasses are small frozen dataclasses whose
    fields are the policy's parameters; class attributes declare what the cache records."""

    #: The policy's name in reports (see `name`).
    label: ClassVar[str] = "selector"
    #: Decisions depend on the eviction seed (benchmarks run such policies once per seed).
    random: ClassVar[bool] = False
    #: Reads `RoundView.positions` (the cache must track slot positions).
    needs_positions: ClassVar[bool] = False
    #: Reads attention weights: the cache records query slots and calls `observe` each layer.
    needs_attention: ClassVar[bool] = False
    #: Reads `RoundView.keys` (each slot's cached key, for redundancy scores).
    needs_keys: ClassVar[bool] = False
    #: The attention statistic restarts after each round (an observation window) instead of
    #: following its tokens through the round's moves.
    resets_after_round: ClassVar[bool] = False
    #: An oracle: it must be told what future steps need (a `future` field the evaluation
    #: fills per problem), so only tasks that know their problems' future can run it.
    knows_future: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.label

    @property
    def protects_prompt(self) -> bool:
        """True when prompt tokens are never evicted (candidates start at slot P)."""
        return True

    def first_slot(self, view: RoundView) -> torch.Tensor:
        """(n,) int64: each row's lowest evictable slot, P when the prompt is protected."""
        prompts = view.prompt_lengths
        return prompts if self.protects_prompt else torch.zeros_like(prompts)

    def candidates(self, view: RoundView) -> torch.Tensor:
        """Bool, broadcastable to (n, layers, kv_heads, K + r): the slots this rule may empty."""
        return view.slots_from(self.first_slot(view))

    @abstractmethod
    def select(self, view: RoundView) -> torch.Tensor:
        """Slots to empty: int64 (n, layers, kv_heads, r), values in [0, K + r), distinct
        within each (row, layer, head), on any device."""

    def observe(self, step: AttentionStep, statistic: torch.Tensor) -> None:
        """Fold one layer's attention into its statistic (rows, kv_heads, K + 2r), in place.
        Only called when `needs_attention`; the cache moves the statistic with each round."""
        raise NotImplementedError(f"{self.name} declares needs_attention but has no observe")


@dataclass(frozen=True)
class PromptChoice(Selector):
    """A policy whose prompt tokens are kept (the default) or compete like any other token,
    the "-noprompt" variant of its name."""

    protect_prompt: bool = True

    @property
    def name(self) -> str:
        return self.label if self.protect_prompt else f"{self.label}-noprompt"

    @property
    def protects_prompt(self) -> bool:
        return self.protect_prompt


class ScoredSelector(Selector):
    """Template for scored policies: implement `score`; each round empties, per (row, layer,
    KV head), the r lowest-scoring candidates (ties to the lower slot)."""

    @abstractmethod
    def score(self, view: RoundView) -> torch.Tensor:
        """Float (n, layers, kv_heads, K + r or wider): lower scores are evicted first."""

    def select(self, view: RoundView) -> torch.Tensor:
        scores = self.score(view)[..., : view.config.compacted_length]
        allowed = self.candidates(view).expand_as(scores)
        return lowest(scores, allowed, view.config.buffer_size)


def lowest(scores: torch.Tensor, allowed: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` lowest scores among `allowed` entries of the last dimension.

    Ties go to the lower index (stable sort), so decisions are deterministic.
    """
    masked = scores.masked_fill(~allowed, float("inf"))
    order = torch.sort(masked, dim=-1, stable=True).indices[..., :count]
    taken = allowed.gather(-1, order)
    if not bool(taken.all()):
        raise ValueError(f"fewer than {count} evictable slots in some (row, layer, head)")
    return order
