"""What the server tests share: the tiny model's engine settings, RandKV's settings, and
pinning client and server to one vCPU."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from randkv import RandKVConfig

CONFIG = RandKVConfig(budget=64, buffer_size=8, seed=5)
ENGINE_ARGS = {
    "dtype": "float32",
    "block_size": 32,  # vLLM 0.32's CPU attention takes multiples of 32 only
    "num_gpu_blocks_override": 32,
    "gpu_memory_utilization": 0.2,
    "max_model_len": 8192,  # the cancelled request asks for far more than it gets
    "max_num_seqs": 8,
    "enforce_eager": True,
}
PROMPT = "Keep the prompt; sample the rest."  # 33 bytes: under K


@contextmanager
def one_cpu() -> Iterator[None]:
    """Run this process, and the servers it starts (they inherit the CPU set), on one vCPU.

    On the 2-vCPU CI VMs a process that sleeps (the client, the API server) can miss its
    wake-ups for seconds while vLLM's worker decodes flat out, so a stream arrives in one
    burst at its end and a cancel lands too late; with every process on one vCPU wake-ups
    are prompt (docs/notes/vllm-internals.md, item 18).
    """
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)
