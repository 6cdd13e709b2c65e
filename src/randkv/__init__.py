"""RandKV: Random Attention KV-cache eviction for real inference engines.

`import randkv` needs only the standard library; the torch planner and compactor
live in `randkv.planner` and `randkv.compactor`.
"""

from randkv.config import PromptTooLongError, RandKVConfig
from randkv.spec import (
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
