"""RandKV's vLLM scheduler: physical-length block accounting and round directives.

Plugged in with vLLM's `scheduler_cls`. Positions stay absolute: a request's
`num_computed_tokens` counts every token it has seen, and only block sizing uses
`randkv.physical_length`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

from randkv.spec import num_rounds, physical_length
from randkv.spec.config import PromptTooLongError, RandKVConfig
from randkv.vllm.class_swap import swap_class
from randkv.vllm.metrics import RandKVRecorder, Source
from randkv.vllm.options import NO_CONFIG, config_from_vllm
from randkv.vllm.refusals import check_engine_supported
from randkv.vllm.sched.kv_groups import KVGroupLayout, kv_group_layout
from randkv.vllm.sched.output import (
    RandKVSchedulerOutput,
    RandKVStepPlan,
    RoundDirective,
    with_plan,
)
from randkv.vllm.sched.request_identity import derive_request_key, request_config
from randkv.vllm.sched.scheduling_mode import FollowsSchedulingMode
from randkv.vllm.sched.timeline import TimelineMixin

logger = init_logger("vllm.randkv.scheduler")


@dataclass
class RequestRounds:
    """Scheduler-side RandKV state of one request; `config` is the request's own
    (`RandKVConfig.for_request`: its budget K, raised for a long prompt or asked for)."""

    request_key: int
    prompt_length: int
    config: RandKVConfig
    rounds_applied: int = 0


class RandKVCacheManager(KVCacheManager):
    """vLLM's KV cache manager, sizing each request by its physical length.

    The scheduler swaps an existing manager's class to this one (vLLM builds the
    manager inside `Scheduler.__init__`), then calls `randkv_attach`.
    """

    def randkv_attach(
        self,
        config: RandKVConfig,
        rounds: dict[str, RequestRounds],
        metrics: RandKVRecorder,
        layout: KVGroupLayout,
    ) -> None:
        self.randkv = config
        self.rounds = rounds
        self.metrics = metrics
        self.layout = layout
        self.directives: dict[str, RoundDirective] = {}
        managers = self.coordinator.single_type_managers
        self.full_manager = managers[layout.randkv]
        self.window_managers = [managers[g] for g in layout.windows]
        self.block_size = self.full_manager.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),  # vLLM >= 0.32; KV connectors only
    ):
        state = self.rounds[request.request_id]
        config, block_size = state.config, self.block_size
        prompt = state.prompt_length
        computed = request.num_computed_tokens + num_new_computed_tokens
        physical = physical_length(config, prompt_length=prompt, tokens_seen=computed)
        rounds = num_rounds(config, prompt_length=prompt, tokens_seen=computed)
        end = physical + num_new_tokens
        if end > config.max_physical_length:  # the scheduler's split hook prevents this
            raise RuntimeError(f"RandKV: a step would reach physical length {end}")
        request_blocks = self.full_manager.req_to_blocks[request.request_id]
        hits = new_computed_blocks.blocks if new_computed_blocks else None
        prefix_hits = list(hits[self.layout.randkv]) if hits else []
        held = len(request_blocks) + len(prefix_hits)
        needed = cdiv(end, block_size)
        round_due = rounds > state.rounds_applied
        # Only a round frees blocks: the tail past the compacted length plus this chunk.
        keep = min(held, needed) if round_due else held
        to_allocate = max(0, needed - keep) + self.randkv_window_blocks_to_allocate(
            request, computed, computed + num_new_tokens, hits
        )
        watermark = 0
        if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            watermark = self.watermark_blocks
        # Prefix hits on cached blocks nobody holds leave the free queue when touched (a
        # window group's hit list has vLLM's null block where the window skips).
        null = self.block_pool.null_block
        idle_hits = sum(
            1 for group in hits or () for block in group if block.ref_cnt == 0 and block is not null
        )
        free = self.block_pool.get_num_free_blocks() + (held - keep) - idle_hits - reserved_blocks
        if full_sequence_must_fit:
            # Admission: the longest this request can get is K + 2r - 1 tokens of blocks
            # (and what vLLM's window managers say the window groups can hold at most).
            final = physical_length(config, prompt_length=prompt, tokens_seen=request.num_tokens)
            peak = max(final, min(request.num_tokens, config.max_physical_length))
            windows = self.randkv_window_blocks_to_allocate(
                request, computed, request.num_tokens, hits, admission=True
            )
            if cdiv(peak, block_size) - keep + windows + watermark > free:
                return None
        if to_allocate + watermark > free:
            return None
        if hits is not None and any(hits):
            # Not forwarded: skip_zeroing_group_ids concerns blocks a KV connector loads
            # (refused with RandKV), and vLLM 0.28's coordinator has no such keyword.
            self.coordinator.allocate_new_computed_blocks(
                request_id=request.request_id,
                new_computed_blocks=hits,
                num_local_computed_tokens=computed,
                num_external_computed_tokens=0,
            )
        if round_due:
            # The round fires now: the worker compacts before this step's forward pass
            # (reading the tail blocks freed here, before anyone can write them).
            self.directives[request.request_id] = RoundDirective(
                round_index=rounds - 1,
                keep_blocks=keep,
                prompt_length=prompt,
                request_key=state.request_key,
                block_ids=tuple(block.block_id for block in request_blocks),
                budget=config.budget,
            )
            state.rounds_applied = rounds
            if held > keep:
                tail = request_blocks[keep:]
                del request_blocks[keep:]
                self.block_pool.free_blocks(reversed(tail))
                self.metrics.add("blocks_freed", len(tail))
        new_blocks = self.randkv_allocate_new_blocks(
            request.request_id, end, computed + num_new_tokens, num_encoder_tokens
        )
        if not delay_cache_blocks:
            self.cache_blocks(request, computed + num_new_tokens)
        return self.create_kv_cache_blocks(new_blocks)

    def randkv_window_blocks_to_allocate(
        self,
        request: Request,
        computed: int,
        tokens: int,
        hits: Any,
        admission: bool = False,
    ) -> int:
        """Blocks the sliding-window groups need for `tokens` absolute tokens, as vLLM's own
        managers count them (after they free what left the window). 0 for a dense model."""
        if not self.window_managers:
            return 0
        rid = request.request_id
        if not admission:
            # Tokens of steps still in flight (async scheduling) are not safe to free yet.
            safe = max(0, computed - request.num_in_flight_tokens)
            for manager in self.window_managers:
                manager.remove_skipped_blocks(rid, safe, request.num_prompt_tokens)
        tokens = min(tokens, self.max_model_len)
        return sum(
            manager.get_num_blocks_to_allocate(
                rid,
                tokens,
                hits[group] if hits else [],
                computed,
                computed,
                tokens,
                apply_admission_cap=admission,
            )
            for group, manager in zip(self.layout.windows, self.window_managers, strict=True)
        )

    def randkv_allocate_new_blocks(
        self, request_id: str, physical_end: int, absolute_end: int, num_encoder_tokens: int
    ) -> tuple[list[Any], ...]:
        """New blocks per group: the full-attention group up to the physical length, vLLM's
        sliding-window groups up to the absolute one (their blocks stay where vLLM puts
        them)."""
        if not self.window_managers:
            return self.coordinator.allocate_new_blocks(
                request_id, physical_end, physical_end, num_encoder_tokens
            )
        absolute_end = min(absolute_end, self.max_model_len)
        managers = self.coordinator.single_type_managers
        return tuple(
            manager.allocate_new_blocks(request_id, physical_end, physical_end)
            if group == self.layout.randkv
            else manager.allocate_new_blocks(request_id, absolute_end, absolute_end)
            for group, manager in enumerate(managers)
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Only whole prompt blocks enter the prefix cache: compaction writes slots >= P, so
        blocks holding generated tokens change after they are hashed. (vLLM's async
        scheduler also calls this, with each step's generated tokens.)"""
        state = self.rounds.get(request.request_id)
        if not self.enable_caching or state is None:
            return
        full_prompt = (state.prompt_length // self.block_size) * self.block_size
        self.coordinator.cache_blocks(request, min(num_computed_tokens, full_prompt))


class RandKVScheduler(FollowsSchedulingMode, TimelineMixin, Scheduler):
    """vLLM's scheduler with RandKV's cadence: chunks end at round boundaries, rounds are
    announced to the workers, tail blocks are freed the step a round fires. Under vLLM's
    async scheduling the engine gets `RandKVAsyncScheduler`
    (`randkv.vllm.sched.scheduling_mode`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = config_from_vllm(self.vllm_config)
        if config is None:
            raise ValueError(NO_CONFIG.format(cls="RandKVScheduler"))
        check_engine_supported(self.vllm_config)
        layout = kv_group_layout(self.kv_cache_config)
        self.randkv = config
        self.request_rounds: dict[str, RequestRounds] = {}
        self.rejected: dict[str, str] = {}
        self.metrics = RandKVRecorder(self.vllm_config, Source.SCHEDULER, publishes_once=True)
        swap_class(self.kv_cache_manager, KVCacheManager, RandKVCacheManager)
        self.kv_cache_manager.randkv_attach(config, self.request_rounds, self.metrics, layout)
        # vLLM calls this split hook for every scheduled request (running and waiting);
        # RandKV uses it to end each chunk at the next round boundary.
        self.need_mamba_block_aligned_split = True
        self._open_timeline()
        logger.info(
            "RandKV on: budget K=%d, buffer r=%d, seed=%d; at most %d tokens of KV per request",
            config.budget,
            config.buffer_size,
            config.seed,
            config.max_physical_length - 1,
        )

    @property
    def counters(self) -> dict[str, float]:
        """The scheduler's RandKV counters (rejected prompts, preemptions, blocks freed)."""
        return self.metrics.stats("scheduler")

    # ------------------------------------------------------------------ admission

    def add_request(self, request: Request) -> None:
        prompt = request.num_prompt_tokens
        try:
            key = derive_request_key(
                list(request.prompt_token_ids or []), request.sampling_params, request.request_id
            )
            config = request_config(self.randkv, prompt, request.sampling_params)
        except PromptTooLongError as error:
            self._randkv_reject(request, str(error))
            self.metrics.add("rejected_prompts", 1)
        except (TypeError, ValueError) as error:  # a malformed randkv_* request field
            self._randkv_reject(request, str(error))
        else:
            self.request_rounds[request.request_id] = RequestRounds(key, prompt, config)
            if prompt > self.randkv.budget:
                self.metrics.add("long_prompts", 1)
        super().add_request(request)

    def _randkv_reject(self, request: Request, message: str) -> None:
        """Finish the request with an error at the end of this step; nothing else is affected."""
        self.rejected[request.request_id] = message
        logger.warning("RandKV rejects request %s: %s", request.request_id, message)

    def _mamba_block_aligned_split(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        state = self.request_rounds.get(request.request_id)
        if state is None:  # rejected: never scheduled
            return 0
        start = request.num_computed_tokens + num_new_local_computed_tokens
        start += num_external_computed_tokens
        physical = physical_length(
            state.config, prompt_length=state.prompt_length, tokens_seen=start
        )
        # Replay after preemption also goes through here, in the same rounds.
        return min(num_new_tokens, state.config.max_physical_length - physical)

    # ------------------------------------------------------------------ per step

    def schedule(self, *args: Any, **kwargs: Any) -> RandKVSchedulerOutput:
        output = super().schedule(*args, **kwargs)
        return with_plan(output, self._randkv_step_plan(output))

    def _randkv_step_plan(self, scheduler_output: Any) -> RandKVStepPlan:
        """The rounds this step fires, for the requests it still runs."""
        manager = self.kv_cache_manager
        dropped = set(scheduler_output.preempted_req_ids or ()) | set(
            scheduler_output.finished_req_ids
        )
        directives = {
            rid: d
            for rid, d in manager.directives.items()
            if rid not in dropped and rid in scheduler_output.num_scheduled_tokens
        }
        manager.directives = {}
        self._randkv_publish_blocks_held()
        # The workers compute physical lengths every step: they need each request's own K.
        budgets = {}
        for rid in scheduler_output.num_scheduled_tokens:
            state = self.request_rounds.get(rid)
            if state is not None and state.config.budget != self.randkv.budget:
                budgets[rid] = state.config.budget
        return RandKVStepPlan(
            directives=directives,
            scheduler_counters=self.metrics.stats("scheduler"),
            budgets=budgets,
        )

    def _randkv_publish_blocks_held(self) -> None:
        manager = self.kv_cache_manager
        full = manager.full_manager.req_to_blocks
        self.metrics.set("kv_blocks_held", sum(len(full.get(r, ())) for r in self.request_rounds))
        # A window group's list keeps vLLM's null block where a block left the window.
        null = manager.block_pool.null_block
        windows = sum(
            sum(1 for block in window.req_to_blocks.get(r, ()) if block is not null)
            for window in manager.window_managers
            for r in self.request_rounds
        )
        self.metrics.set("kv_window_blocks_held", windows)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        result = super()._preempt_request(request, *args, **kwargs)
        state = self.request_rounds.get(request.request_id)
        if state is not None:
            # All blocks are gone; the request will replay its rounds from the prompt.
            state.rounds_applied = 0
            self.kv_cache_manager.directives.pop(request.request_id, None)
            self.metrics.add("preemptions", 1)
        return result

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        result = super()._free_request(request, *args, **kwargs)
        self.request_rounds.pop(request.request_id, None)
        self.rejected.pop(request.request_id, None)
        self.kv_cache_manager.directives.pop(request.request_id, None)
        self._randkv_publish_blocks_held()  # the engine may go idle and stop scheduling
        return result

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if not self.rejected:
            return outputs
        messages = dict(self.rejected)
        for request in self.finish_requests(messages, RequestStatus.FINISHED_ERROR):
            client = outputs.get(request.client_index)
            if client is None:
                client = outputs[request.client_index] = EngineCoreOutputs(outputs=[])
            client.outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=request.get_finished_reason(),
                    stop_reason=messages[request.request_id],
                )
            )
        return outputs


class RandKVAsyncScheduler(RandKVScheduler, AsyncScheduler):
    """`RandKVScheduler` over vLLM's `AsyncScheduler`: step N + 1 is scheduled while step N
    runs. A round needs nothing more (docs/vllm-integration.md, "Async scheduling")."""


RandKVScheduler.randkv_async_twin = RandKVAsyncScheduler
