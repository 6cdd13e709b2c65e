"""Eviction policies for `randkv.hf.RandKVCache`: which r slots each round empties.

A policy is a small frozen dataclass (its parameters are its fields) subclassing `Selector`
(implement `select(view)`) or, for a scored policy, `ScoredSelector` (implement
`score(view)`; the r lowest-scoring candidates go). It reads only the `RoundView` the cache
hands it; one that reads attention declares `needs_attention = True` and folds each layer's
`AttentionStep` into a per-slot statistic in `observe`. `RandKV` is the default.
See docs/selectors.md.

| policy | keeps | prompt protected |
|---|---|---|
| RandKV() | prompt + r newest + uniform random sample (per KV head) | yes |
| RandKV(protect_prompt=False) | r newest + uniform random sample of everything older | no |
| StreamingLLM(sinks=4) | 4 sink tokens + most recent tokens | no |
| PromptWindow() | prompt + most recent tokens | yes |
| H2O() | prompt + recent half + heavy hitters (accumulated attention) | yes |
| H2O(protect_prompt=False) | recent half + heavy hitters, prompt competes (as in the paper) | no |
| SnapKV() | prompt + r newest + top observation-window votes, pooled | yes |
| TOVA() | prompt + r newest + top attention of the newest query | yes |
| SharedRandKV() | RandKV with one draw per layer shared by its KV heads (ablation) | yes |
| RKV() | prompt + r newest + top attention importance minus key redundancy | yes |
| Belady(future=...) | oracle: the copies future steps need, soonest first | yes |
"""

from randkv.selectors.base import PromptChoice, ScoredSelector, Selector, lowest
from randkv.selectors.h2o import H2O
from randkv.selectors.hooks import attention_hooks
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
    "attention_hooks",
    "lowest",
]
