"""RandKV's scheduler without an engine: vLLM's real `Scheduler`, KV cache manager and block
pool (as vLLM's own scheduler tests build them), driven step by step with the tokens a model
would sample. No model runs, no worker exists: a test runs in milliseconds per step and fails
before any engine test does.

`Harness.step()` schedules, then answers like a model runner: one token for every request
whose scheduled tokens reach its end (a prefill chunk that does not gets none), then calls
`update_from_output` as the engine core does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from randkv.spec.config import RandKVConfig
from randkv.vllm.options import RandKVAdditionalConfig
from randkv.vllm.sched.scheduler import RandKVScheduler

TOKEN = 7  # what the stand-in model samples (its value matters to nothing here)


@dataclass
class Harness:
    """A scheduler over a pool of `num_blocks` blocks and what each step returned."""

    scheduler: Any
    block_size: int
    steps: list[SchedulerOutput] = field(default_factory=list)
    finished: dict[str, Any] = field(default_factory=dict)  # request id -> its last output
    ids: Iterable[int] = field(default_factory=itertools.count)
    block_hasher: Any = None  # one per harness: vLLM 0.28 draws its root hash at random

    @property
    def manager(self) -> Any:
        return self.scheduler.kv_cache_manager

    @property
    def pool(self) -> Any:
        return self.manager.block_pool

    def free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def add(
        self,
        prompt_tokens: int | list[int],
        max_tokens: int,
        *,
        request_id: str | None = None,
        extra_args: dict[str, Any] | None = None,
        prompt_start: int = 1000,
    ) -> Request:
        """Add a request of `prompt_tokens` distinct tokens (or these token ids)."""
        if isinstance(prompt_tokens, int):
            prompt = list(range(prompt_start, prompt_start + prompt_tokens))
        else:
            prompt = list(prompt_tokens)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
        request = Request(
            request_id=request_id or f"req-{next(iter(self.ids))}",
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            block_hasher=self.block_hasher,
        )
        self.scheduler.add_request(request)
        return request

    def step(self) -> SchedulerOutput:
        """One engine step: schedule, sample, update."""
        output = self.scheduler.schedule()
        self.steps.append(output)
        req_ids = list(output.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            request = self.scheduler.requests[req_id]
            done = request.num_computed_tokens >= request.num_tokens
            sampled.append([TOKEN] if done else [])
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        engine_outputs = self.scheduler.update_from_output(output, runner_output)
        for client in engine_outputs.values():
            for request_output in client.outputs:
                if request_output.finish_reason is not None:
                    self.finished[request_output.request_id] = request_output
        return output

    def run(self, max_steps: int = 10_000) -> list[SchedulerOutput]:
        """Step until every request has finished; the steps taken."""
        taken = []
        for _ in range(max_steps):
            if not self.scheduler.has_requests():
                return taken
            taken.append(self.step())
        raise AssertionError(f"requests still unfinished after {max_steps} steps")


def _block_hasher(block_size: int) -> Any:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256)


def make_harness(
    model_path: str,
    config: RandKVConfig | None,
    *,
    num_blocks: int,
    block_size: int = 16,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    max_model_len: int = 4096,
    enable_prefix_caching: bool = False,
    window: int | None = None,
    state: bool = False,
    scheduler_cls: type | None = None,
) -> Harness:
    """A RandKV scheduler (or, with `config` None, vLLM's own: the reference) over a pool of
    `num_blocks` blocks; `window` adds a sliding-window KV cache group beside the
    full-attention one, as vLLM builds for a mixed model such as Gemma 3; `state` a Mamba
    state group, as vLLM builds for a hybrid model with prefix caching off (one state block
    per request, vLLM's "none" state mode)."""
    model_config = ModelConfig(model=model_path, dtype="float32", max_model_len=max_model_len)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    cache_config.num_gpu_blocks = num_blocks
    additional = RandKVAdditionalConfig.of({}, config) if config is not None else {}
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        additional_config=additional,
    )
    full = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32
    )
    groups = [KVCacheGroupSpec(["model.layers.0.self_attn.attn"], full)]
    if window is not None:
        sliding = SlidingWindowSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float32,
            sliding_window=window,
        )
        groups.append(KVCacheGroupSpec(["model.layers.1.self_attn.attn"], sliding))
    if state:
        # vLLM's "none" mode sizes a state group's blocks by max_model_len: one per request.
        mamba = MambaSpec(block_size=max_model_len, shapes=((4, 8),), dtypes=(torch.float32,))
        groups.append(KVCacheGroupSpec(["model.layers.2.mixer"], mamba))
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    cls = scheduler_cls or (RandKVScheduler if config is not None else _plain_scheduler())
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        # vLLM schedules in the lcm of its groups' block sizes (a state group's is
        # max_model_len, a multiple of the attention block here).
        block_size=max_model_len if state else block_size,
        log_stats=True,
    )
    return Harness(scheduler, block_size, block_hasher=_block_hasher(block_size))


def _plain_scheduler() -> type:
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler
