"""Teacher-forced scoring of whole sequences through `RandKVCache`, fast.

`score_sequences` feeds fixed token sequences (perplexity text, recorded generations) through
a cache and hands the log-probabilities of every position to a callback. It feeds the
largest chunks that never cross an eviction round: a round fires only at the start of the
step after a row's buffer fills (`RandKVCache.flush`), so a chunk that ends exactly where the
buffer fills sees the same cache, and gets the same round after it, as token-by-token
decoding does. Attention-reading selectors see the chunk's queries together; each of them
folds a step's queries in as it folds the same queries one by one (sums over queries, the
newest query, the next round's observation window), so decisions match `forced_decode` up to
float rounding (tests/test_real_quality.py compares the two).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from randkv.hf.cache import RandKVCache
from randkv.hf.generate import forward_kwargs, step_attention_mask
from randkv.hf.hooks import attention_hooks

__all__ = ["ChunkScores", "score_sequences"]

#: on_chunk(start, logprobs): `logprobs` (batch, columns, vocab) float32 on CPU holds the
#: log-distribution of the token at each position start + 1 + j, given all before it.
ChunkScores = Callable[[int, torch.Tensor], None]


def score_sequences(
    model: object, input_ids: torch.Tensor, cache: RandKVCache, on_chunk: ChunkScores
) -> None:
    """Feed `input_ids` (batch, length), every row unpadded and as long, through `cache`,
    which must know each row's prompt length (`prompt_lengths=`; they may differ).

    The first forward feeds the longest prompt (a shorter prompt's row starts its generated
    part there: no round can fall inside it); then every forward feeds as many columns as the
    fullest row has room for before its next round. `on_chunk` gets the log-probabilities of
    every fed column; the last column is never fed (nothing follows it).
    """
    batch, length = input_ids.shape
    if cache.batch_rows != batch or any(cache.tokens_seen(b) for b in range(batch)):
        raise ValueError("cache must be a fresh RandKVCache for this batch")
    prompts = [cache.prompt_length(b) for b in range(batch)]
    if None in prompts:
        raise ValueError("score_sequences needs each row's prompt length (prompt_lengths=)")
    first = max(p for p in prompts if p is not None)
    if first >= length:
        raise ValueError(f"prompts of up to {first} tokens leave nothing of {length} to score")
    capacity = cache.config.max_physical_length
    cache_kw, keeps_logits = forward_kwargs(model)
    device = model.device  # type: ignore[attr-defined]
    start = 0
    with attention_hooks(model, cache), torch.inference_mode():
        while start < length - 1:
            cache.flush()  # due rounds first, so the room below is right
            room = min(capacity - cache.physical_length(b) for b in range(batch))
            end = first if start == 0 else min(length - 1, start + room)
            ids = input_ids[:, start:end]
            allowed, positions = cache.begin_step(torch.ones(ids.shape, dtype=torch.bool))
            kwargs = {
                cache_kw: cache,
                "use_cache": True,
                "attention_mask": step_attention_mask(model, cache, ids, allowed),
                "position_ids": positions.to(device),
            }
            if keeps_logits:
                kwargs["logits_to_keep"] = 0  # every column
            logits = model(input_ids=ids.to(device), **kwargs).logits  # type: ignore[operator]
            on_chunk(start, torch.log_softmax(logits.float(), dim=-1).cpu())
            start = end
