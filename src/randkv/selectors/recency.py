"""Position-only baselines: StreamingLLM's sinks + recent window, and prompt + recent window."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from randkv.selectors.base import ScoredSelector
from randkv.selectors.view import RoundView

__all__ = ["PromptWindow", "StreamingLLM"]


class _Oldest(ScoredSelector):
    """Score = position: each round empties the r oldest candidates."""

    needs_positions = True

    def score(self, view: RoundView) -> torch.Tensor:
        return view.need("positions").float()


@dataclass(frozen=True)
class StreamingLLM(_Oldest):
    """Attention sinks + sliding window (Xiao et al. 2023, arXiv 2309.17453).

    Keeps the first `sinks` positions (4 in the paper), which sit in slots 0 .. sinks - 1
    forever, and the most recent tokens. The prompt is not protected beyond the sinks.
    """

    sinks: int = 4
    label = "streamingllm"

    @property
    def protects_prompt(self) -> bool:
        return False

    def first_slot(self, view: RoundView) -> torch.Tensor:
        return torch.full_like(view.prompt_lengths, self.sinks)


@dataclass(frozen=True)
class PromptWindow(_Oldest):
    """Control: the whole prompt + the most recent tokens (StreamingLLM with the prompt as
    its sink). Each round empties the r oldest generated tokens."""

    label = "window"
