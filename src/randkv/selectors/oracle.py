"""A Belady-style oracle: it knows which tokens future steps will need."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from randkv.selectors.base import PromptChoice, ScoredSelector
from randkv.selectors.view import RoundView

__all__ = ["Belady", "Need"]


@dataclass(frozen=True)
class Need:
    """At absolute position `time` the model needs one of `copies` (each a tuple of absolute
    positions that together make one copy of what it needs)."""

    time: int
    copies: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Belady(PromptChoice, ScoredSelector):
    """Evict what is needed latest, or never (Belady's MIN, with alternatives).

    `future[row]` lists the needs of cache row `row`. Per (row, layer, KV head), the needs
    after the newest held position are walked in time order; each is served by the newest copy
    the head still holds, whose tokens score 1 / (1 + steps until the need); tokens already
    serving a sooner need keep their score. Everything else scores below every needed token,
    the oldest lowest (ties go to recency). So a head keeps one copy of each fact, the ones
    needed soonest first: the ceiling of what any policy could keep at this budget, with the
    caveat that the model may also use tokens the needs do not name.
    """

    future: tuple[tuple[Need, ...], ...] = ()
    label = "oracle"
    needs_positions = True
    #: The evaluation hands the selector each row's needs (`future`).
    knows_future: ClassVar[bool] = True

    def score(self, view: RoundView) -> torch.Tensor:
        positions = view.need("positions")
        newest = positions.amax(-1, keepdim=True).clamp(min=1)
        scores = positions.double() / (newest.double() + 1) - 2.0  # in [-2, -1): unneeded
        for i, row in enumerate(view.rows.tolist()):
            needs = self.future[row] if row < len(self.future) else ()
            for layer in range(positions.shape[1]):
                for head in range(positions.shape[2]):
                    self._serve(needs, positions[i, layer, head], scores[i, layer, head])
        return scores.float()

    @staticmethod
    def _serve(needs: tuple[Need, ...], held: torch.Tensor, scores: torch.Tensor) -> None:
        slot_of = {p: s for s, p in enumerate(held.tolist()) if p >= 0}
        now = max(slot_of)
        served: set[int] = set()
        for need in needs:
            if need.time <= now:
                continue
            for copy in sorted(need.copies, key=max, reverse=True):
                slots = [slot_of[p] for p in copy if p in slot_of]
                if slots:
                    for s in slots:
                        if s not in served:
                            served.add(s)
                            scores[s] = 1.0 / (1 + need.time - now)
                    break
