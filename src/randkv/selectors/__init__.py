"""Eviction policies for `randkv.hf.RandKVCache`: which r slots each round empties.

A policy is a small frozen dataclass (its parameters are its fields) subclassing `Selector`
(implement `select(view)`) or, for a scored policy, `ScoredSelector` (implement
`score(view)`; the r lowest-scoring candidates go). It reads only the `RoundView` the cache
hands it; one that reads attention declares `needs_attention = True` and folds each layer's
`AttentionStep` into a per-slot statistic in `observe`. `RandKV` is the default.
Every policy is registered by name in `randkv.selectors.registry`, which also says what each
one keeps. See docs/selectors.md.
"""

from randkv.selectors.base import PromptChoice, ScoredSelector, Selector, lowest
from randkv.selectors.h2o import H2O
from randkv.selectors.oracle import Belady, Need
from randkv.selectors.randkv import RandKV, SharedRandKV
from randkv.selectors.recency import PromptWindow, StreamingLLM
from randkv.selectors.rkv import RKV
from randkv.selectors.snapkv import SnapKV
from randkv.selectors.tova import TOVA
from randkv.selectors.view import AttentionStep, RoundView

__all__ = [
    "H2O",
    "RKV",
    "TOVA",
    "AttentionStep",
    "Belady",
    "Need",
    "PromptChoice",
    "PromptWindow",
    "RandKV",
    "RoundView",
    "ScoredSelector",
    "Selector",
    "SharedRandKV",
    "SnapKV",
    "StreamingLLM",
    "lowest",
]
