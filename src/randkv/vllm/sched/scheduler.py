"""RandKV's vLLM scheduler: admission, round cadence and the step's round directives.

Plugged in with vLLM's `scheduler_cls`. Positions stay absolute: a request's
`num_computed_tokens` counts every token it has seen, and only block sizing uses
`randkv.physical_length` (`randkv.vllm.sched.cache_manager`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

from randkv.spec import num_rounds
from randkv.spec.config import PromptTooLongError
from randkv.vllm.class_swap import swap_class
from randkv.vllm.metrics import RandKVRecorder, Source
from randkv.vllm.options import NO_CONFIG, config_from_vllm
from randkv.vllm.refusals import check_engine_supported
from randkv.vllm.sched.allocation import footprint_blocks, tokens_to_next_round
from randkv.vllm.sched.cache_manager import RandKVCacheManager, RequestRounds
from randkv.vllm.sched.kv_groups import absolute_group_caps, kv_group_layout
from randkv.vllm.sched.output import RandKVSchedulerOutput, RandKVStepPlan, with_plan
from randkv.vllm.sched.request_identity import derive_request_key, request_config
from randkv.vllm.sched.scheduling_mode import FollowsSchedulingMode
from randkv.vllm.sched.timeline import TimelineMixin

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

logger = init_logger("vllm.randkv.scheduler")

#: The engine-core utility that returns the scheduler's RandKV counters (`LLM.randkv_stats`
#: calls it through vLLM's utility channel, in-process or in the engine core process).
COUNTERS_UTILITY = "randkv_scheduler_counters"


def _install_counters_utility() -> None:
    """Give vLLM's EngineCore the utility method (a new name; nothing of vLLM's changes)."""
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, COUNTERS_UTILITY):

        def scheduler_counters(engine_core: Any) -> dict[str, float]:
            scheduler = engine_core.scheduler
            return scheduler.counters if isinstance(scheduler, RandKVScheduler) else {}

        setattr(EngineCore, COUNTERS_UTILITY, scheduler_counters)


class RandKVScheduler(FollowsSchedulingMode, TimelineMixin, Scheduler):
    """vLLM's scheduler with RandKV's cadence: chunks end at round boundaries, rounds are
    announced to the workers, tail blocks are freed the step a round fires. Under vLLM's
    async scheduling the engine gets `RandKVAsyncScheduler`
    (`randkv.vllm.sched.scheduling_mode`)."""

    kv_cache_manager: RandKVCacheManager

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
        caps = absolute_group_caps(self.kv_cache_config, self.vllm_config, layout)
        self.kv_cache_manager.randkv_attach(
            config, self.request_rounds, self.metrics, layout, self.requests, caps,
            self.vllm_config.scheduler_config.max_num_batched_tokens,
        )  # fmt: skip
        # vLLM calls this split hook for every scheduled request (running and waiting);
        # RandKV uses it to end each chunk at the next round boundary. A hybrid model in
        # vLLM's "align" state mode (prefix caching on) needs vLLM's own split first.
        self.randkv_vllm_split = bool(self.need_mamba_block_aligned_split)
        self.need_mamba_block_aligned_split = True
        _install_counters_utility()
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
            footprint = footprint_blocks(
                config,
                prompt_length=prompt,
                max_tokens=request.max_tokens,
                block_size=self.kv_cache_manager.block_size,
                lookahead=self.num_lookahead_tokens,
            )
            self.request_rounds[request.request_id] = RequestRounds(key, prompt, config, footprint)
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
        if self.randkv_vllm_split:
            # vLLM's cut for its state checkpoints (block boundaries of the prompt); both
            # cuts only shorten, so applying both ends the chunk at the nearer boundary.
            num_new_tokens = super()._mamba_block_aligned_split(
                request, num_new_tokens, num_new_local_computed_tokens,
                num_external_computed_tokens,
            )  # fmt: skip
            if num_new_tokens == 0:
                return 0
        start = request.num_computed_tokens + num_new_local_computed_tokens
        start += num_external_computed_tokens
        if self._randkv_unverified_at_round(request, state, start):
            self.metrics.add("round_waits", 1)
            return 0  # scheduled again once vLLM has verified (or rolled back) its drafts
        # Replay after preemption also goes through here, in the same rounds.
        room = tokens_to_next_round(
            state.config, prompt_length=state.prompt_length, tokens_seen=start
        )
        if num_new_tokens <= room:
            return num_new_tokens
        if request.spec_token_ids and request.status == RequestStatus.RUNNING:
            # A decode step with drafts ends at the round: vLLM keeps the first
            # `room - 1` drafts and drops the rest (its `spec_token_ids` trimming).
            self.metrics.add("draft_steps_shortened", 1)
            self.metrics.add("draft_tokens_dropped", num_new_tokens - room)
        return room

    def _randkv_unverified_at_round(
        self, request: Request, state: RequestRounds, start: int
    ) -> bool:
        """Under async scheduling with speculation, whether a round is due at `start` while
        the step before is still in flight: vLLM counts that step's drafts as computed
        before it has verified them, so the round waits a step for the verified count (a
        round evicts verified tokens only, at the position the spec gives)."""
        if not self.num_spec_tokens or request.num_output_placeholders <= 0:
            return False
        config, prompt = state.config, state.prompt_length
        return num_rounds(config, prompt_length=prompt, tokens_seen=start) > state.rounds_applied

    # ------------------------------------------------------------------ per step

    def schedule(self, *args: Any, **kwargs: Any) -> RandKVSchedulerOutput:
        output = super().schedule(*args, **kwargs)
        return with_plan(output, self._randkv_step_plan(output))

    def _randkv_step_plan(self, scheduler_output: SchedulerOutput) -> RandKVStepPlan:
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
        return RandKVStepPlan(directives=directives, budgets=budgets)

    def _randkv_publish_blocks_held(self) -> None:
        held = self.kv_cache_manager.randkv_blocks_held(self.request_rounds)
        self.metrics.set("kv_blocks_held", held.full)
        self.metrics.set("kv_window_blocks_held", held.windows)
        self.metrics.set("kv_state_blocks_held", held.states)

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

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
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
