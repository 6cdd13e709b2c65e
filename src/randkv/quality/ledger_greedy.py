"""Greedy dense answers to ledger problems by full-sequence forwards (a fast training gate).

Greedy decoding writes the model's argmax at each use and the forced tokens elsewhere. A full
teacher-forced forward gives the argmax at every use at once; while they are all right that is
the greedy answer. At the first wrong use the greedy text diverges, so the wrong value is
written in and the forward repeats from there: one forward per wrong use, plus one. The
evaluation itself decodes token by token through `RandKVCache` (the official dense arm); this
is only for checking a model during and after training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from randkv.quality.ledger import LedgerProblem
from randkv.quality.model import decode, encode

__all__ = ["greedy_bodies"]


def greedy_bodies(model: Any, problems: Sequence[LedgerProblem]) -> list[str]:
    """The greedy dense body of each problem (same length as the problem's body)."""
    texts = [encode(p.prompt + p.body) for p in problems]
    offsets = [[len(p.prompt) + o for o in p.generated_offsets] for p in problems]
    settled = [0] * len(problems)  # uses of each problem known to be greedy
    pending = [i for i, p in enumerate(problems) if p.uses]
    with torch.inference_mode():
        while pending:
            width = max(len(texts[i]) for i in pending)
            ids = torch.zeros((len(pending), width), dtype=torch.long)
            for row, i in enumerate(pending):
                ids[row, : len(texts[i])] = torch.tensor(texts[i])
            guess = model(input_ids=ids).logits.argmax(-1)
            still = []
            for row, i in enumerate(pending):
                for k in range(settled[i], len(offsets[i])):
                    at = offsets[i][k]
                    settled[i] = k + 1
                    token = int(guess[row, at - 1])
                    if token != texts[i][at]:
                        texts[i][at] = token
                        if k + 1 < len(offsets[i]):
                            still.append(i)
                        break
            pending = still
    return [decode(t)[len(p.prompt) :] for t, p in zip(texts, problems, strict=True)]
