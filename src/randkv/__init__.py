"""RandKV: Random Attention KV-cache eviction for real inference engines.

`import randkv` needs only the standard library. The layers, each importing only those
below it (docs/architecture.md):

- `randkv.spec`: the executable spec, pure Python;
- `randkv.kernels`: the torch and Triton planner and compactor;
- `randkv.vllm`, `randkv.hf`, `randkv.selectors`: the engine integration and adapters;
- `randkv.cli`, `randkv.bench`, `randkv.check`, `randkv.demo`, `randkv.models`: what users run.
"""

from randkv.spec import (
    PromptTooLongError,
    RandKVConfig,
    coerce_request_key,
    evicted_slots,
    num_rounds,
    physical_length,
    request_key_from_content,
    request_key_from_text,
    retained_positions,
    slot_positions,
)

__version__ = "0.1.0"

__all__ = [
    "PromptTooLongError",
    "RandKVConfig",
    "coerce_request_key",
    "evicted_slots",
    "num_rounds",
    "physical_length",
    "request_key_from_content",
    "request_key_from_text",
    "retained_positions",
    "slot_positions",
]
