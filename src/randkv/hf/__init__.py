"""RandKV for Hugging Face Transformers (5.x): a `Cache` that evicts per the spec, and decode loops.

- `RandKVCache`: a `transformers.Cache`; works inside `model.generate` for batch size 1 and
  unpadded equal-length batches.
- `generate`: one-call generation for any left-padded batch (each row its own request);
  `forced_decode`: the same loop with some tokens dictated (the rest greedy).
- `reference_decode`, `teacher_forced_logprobs`: float32 batch-1 oracles for the engine.
- `attention_hooks`: hands each attention layer's weights to a cache whose selector reads
  attention (`generate` and `forced_decode` install them; this is for hand-written loops).

Tested with transformers 5.0.0, 5.12.1, 5.18.0 and 5.24.0 (torch 2.13, CPU).
"""

from randkv.hf.cache import RandKVCache, left_pad, prompt_rows
from randkv.hf.generate import (
    TeacherForced,
    forced_decode,
    generate,
    reference_decode,
    teacher_forced_logprobs,
)
from randkv.hf.hooks import attention_hooks
from randkv.hf.support import UnsupportedModelError, check_supported, unsupported_reason

__all__ = [
    "RandKVCache",
    "TeacherForced",
    "UnsupportedModelError",
    "attention_hooks",
    "check_supported",
    "forced_decode",
    "generate",
    "left_pad",
    "prompt_rows",
    "reference_decode",
    "teacher_forced_logprobs",
    "unsupported_reason",
]
