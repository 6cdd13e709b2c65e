"""Forward hooks that hand every attention layer's weights to the cache's selector.

Transformers-specific (it finds attention modules by `q_proj` and reads
`_attn_implementation`), so it lives in `randkv.hf`, not in the backend-neutral
`randkv.selectors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from randkv.hf.cache import RandKVCache
    from randkv.selectors.base import Selector

__all__ = ["attention_hooks"]


@contextlib.contextmanager
def attention_hooks(
    model: Any, cache: RandKVCache, selector: Selector | None = None
) -> Iterator[None]:
    """While the block runs, pass each attention layer's weights to `cache.observe_attention`.

    A no-op unless the cache's selector (`selector`, if given, must be that one) declares
    `needs_attention`, or when hooks are already installed (`randkv.hf.generate` installs
    them itself). Needs a model loaded with attn_implementation="eager", the only path that
    returns the weights.
    """
    if selector is not None and selector is not cache.selector:
        raise ValueError("attention_hooks: pass the selector the cache was built with")
    if not cache.selector.needs_attention or cache.observing:
        yield
        return
    if getattr(model.config, "_attn_implementation", None) != "eager":
        raise ValueError(
            f"{cache.selector.name} reads attention weights: load the model with "
            "attn_implementation='eager'"
        )

    def hook(module: Any, args: Any, output: Any) -> None:
        weights = output[1]
        if weights is None:
            raise RuntimeError("the attention layer returned no weights")
        cache.observe_attention(module.layer_idx, weights.detach())

    handles = [
        module.register_forward_hook(hook)
        for module in model.modules()
        if hasattr(module, "layer_idx") and hasattr(module, "q_proj")
    ]
    cache.observing = True
    try:
        yield
    finally:
        cache.observing = False
        for handle in handles:
            handle.remove()
