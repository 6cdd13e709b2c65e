"""RandKV's KV cache manager: vLLM's, with the full-attention group sized by physical length.

The arithmetic is `randkv.vllm.sched.allocation` (pure, tested against the spec); this class
makes vLLM's calls with it: the full-attention group is sized by the physical length and
loses its tail blocks when a round fires, a mixed model's sliding-window groups go through
vLLM's own managers at the absolute length, and only whole prompt blocks enter the prefix
cache.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.request import Request, RequestStatus

from randkv.spec.config import RandKVConfig
from randkv.vllm.metrics import RandKVRecorder
from randkv.vllm.sched.allocation import blocks_for, full_group_step, peak_blocks
from randkv.vllm.sched.kv_groups import AbsoluteCaps, KVGroupLayout
from randkv.vllm.sched.output import RoundDirective

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager


@dataclass(frozen=True)
class BlocksHeld:
    """Blocks held by RandKV's requests: the full-attention group's, a mixed model's
    window groups', a hybrid model's state groups'."""

    full: int
    windows: int
    states: int


@dataclass
class RequestRounds:
    """Scheduler-side RandKV state of one request; `config` is the request's own
    (`RandKVConfig.for_request`: its budget K, raised for a long prompt or asked for);
    `footprint_blocks` the most full-attention blocks it can ever hold
    (`allocation.footprint_blocks`)."""

    request_key: int
    prompt_length: int
    config: RandKVConfig
    footprint_blocks: int
    rounds_applied: int = 0


class RandKVCacheManager(KVCacheManager):
    """vLLM's KV cache manager, sizing each request by its physical length.

    The scheduler swaps an existing manager's class to this one (vLLM builds the
    manager inside `Scheduler.__init__`), then calls `randkv_attach`.
    """

    randkv: RandKVConfig
    rounds: dict[str, RequestRounds]
    metrics: RandKVRecorder
    layout: KVGroupLayout
    directives: dict[str, RoundDirective]
    full_manager: SingleTypeKVCacheManager
    #: vLLM's managers of the groups it runs at absolute lengths (`KVGroupLayout.absolute`:
    #: a mixed model's sliding windows, a hybrid model's states).
    absolute_managers: list[SingleTypeKVCacheManager]
    absolute_caps: AbsoluteCaps
    requests: dict[str, Request]
    max_num_batched_tokens: int
    randkv_prefill_end_keyword: bool

    def randkv_attach(
        self,
        config: RandKVConfig,
        rounds: dict[str, RequestRounds],
        metrics: RandKVRecorder,
        layout: KVGroupLayout,
        requests: dict[str, Request],
        absolute_caps: AbsoluteCaps | None = None,
        max_num_batched_tokens: int = 0,
    ) -> None:
        """`requests`: the scheduler's; `absolute_caps`: what footprint admission reserves
        in the window and state groups (`kv_groups.absolute_group_caps`);
        `max_num_batched_tokens`: the longest prefill chunk."""
        self.randkv = config
        self.requests = requests
        self.absolute_caps = absolute_caps or AbsoluteCaps()
        self.max_num_batched_tokens = max_num_batched_tokens
        self.rounds = rounds
        self.metrics = metrics
        self.layout = layout
        self.directives = {}
        managers = self.coordinator.single_type_managers
        self.full_manager = managers[layout.randkv]
        self.absolute_managers = [managers[g] for g in layout.absolute]
        self.block_size = self.full_manager.block_size
        count = type(self.full_manager).get_num_blocks_to_allocate
        self.randkv_prefill_end_keyword = "prefill_end" in inspect.signature(count).parameters

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),  # vLLM >= 0.32; KV connectors only
    ) -> KVCacheBlocks | None:
        state = self.rounds[request.request_id]
        config, block_size = state.config, self.block_size
        computed = request.num_computed_tokens + num_new_computed_tokens
        request_blocks = self.full_manager.req_to_blocks[request.request_id]
        hits = new_computed_blocks.blocks if new_computed_blocks else None
        prefix_hits = list(hits[self.layout.randkv]) if hits else []
        step = full_group_step(
            config,
            prompt_length=state.prompt_length,
            tokens_seen=computed,
            num_new_tokens=num_new_tokens,
            rounds_applied=state.rounds_applied,
            blocks_held=len(request_blocks) + len(prefix_hits),
            block_size=block_size,
            lookahead=num_lookahead_tokens,
        )
        absolute_end = computed + num_new_tokens
        to_allocate = step.new_blocks + self.randkv_absolute_blocks_to_allocate(
            request, computed, absolute_end + num_lookahead_tokens, hits
        )
        if to_allocate > self.block_pool.num_gpu_blocks:
            return None  # vLLM's state manager says "not this step" (a prefix hit's state)
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
        free = self.block_pool.get_num_free_blocks() + step.freed_blocks
        free -= idle_hits + reserved_blocks
        admitting = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        if admitting and self.randkv.admission == "footprint":
            # Admit only what the pool holds with every admitted request at its largest
            # footprint (its full-attention K + 2r, and what vLLM's window and state groups
            # hold at most): no preemption for growth RandKV can foresee. (With nothing else
            # admitted, the request runs whatever its footprint: the pool is all its own.)
            growth = self._randkv_reserved_growth(request.request_id)
            if growth is not None:
                # Its window and state blocks: what vLLM's managers need to admit it now,
                # or what it holds at most once decoding, whichever is more.
                now = self.randkv_absolute_blocks_to_allocate(
                    request, computed, request.num_tokens + num_lookahead_tokens, hits,
                    admission=True,
                )  # fmt: skip
                held = self._randkv_absolute_held(request.request_id)
                absolute = max(now, self.absolute_caps.decode - held)
                need = state.footprint_blocks - step.keep_blocks + absolute + growth
                if need + watermark > free:
                    return None
        elif full_sequence_must_fit:
            # Admission: the longest this request can get is K + 2r - 1 tokens of blocks
            # (and what vLLM's window managers say the window groups can hold at most).
            peak = peak_blocks(
                config,
                prompt_length=state.prompt_length,
                num_tokens=request.num_tokens,
                block_size=block_size,
                lookahead=num_lookahead_tokens,
            )
            windows = self.randkv_absolute_blocks_to_allocate(
                request, computed, request.num_tokens + num_lookahead_tokens, hits, admission=True
            )
            if peak - step.keep_blocks + windows + watermark > free:
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
        if step.round_due:
            self._randkv_fire_round(request, state, step.rounds, step.keep_blocks)
        new_blocks = self.randkv_allocate_new_blocks(
            request.request_id,
            (step.lookahead_end, step.physical_end),
            (absolute_end + num_lookahead_tokens, absolute_end),
            num_encoder_tokens,
        )
        if not delay_cache_blocks:
            self.cache_blocks(request, absolute_end)
        return self.create_kv_cache_blocks(new_blocks)

    def _randkv_fire_round(
        self, request: Request, state: RequestRounds, rounds: int, keep_blocks: int
    ) -> None:
        """Announce the round to the workers and free the tail blocks: the worker compacts
        before this step's forward pass, reading the tail blocks freed here before anyone
        can write them."""
        request_blocks = self.full_manager.req_to_blocks[request.request_id]
        self.directives[request.request_id] = RoundDirective(
            round_index=rounds - 1,
            keep_blocks=keep_blocks,
            prompt_length=state.prompt_length,
            request_key=state.request_key,
            block_ids=tuple(block.block_id for block in request_blocks),
            budget=state.config.budget,
        )
        state.rounds_applied = rounds
        if len(request_blocks) > keep_blocks:
            tail = request_blocks[keep_blocks:]
            del request_blocks[keep_blocks:]
            self.block_pool.free_blocks(reversed(tail))
            self.metrics.add("blocks_freed", len(tail))

    def _randkv_reserved_growth(self, admitting: str) -> int | None:
        """Blocks the admitted requests (those holding full-attention blocks, other than
        `admitting`) may still take before they reach their footprints, in every group;
        None when none is admitted."""
        growth, admitted = 0, False
        for request_id, blocks in self.full_manager.req_to_blocks.items():
            state = self.rounds.get(request_id)
            if request_id == admitting or state is None or not blocks:
                continue
            admitted = True
            growth += max(0, state.footprint_blocks - len(blocks))
            absolute = self.absolute_caps.decode + self._randkv_prefill_chunk_blocks(request_id)
            growth += max(0, absolute - self._randkv_absolute_held(request_id))
        return growth if admitted else None

    def _randkv_prefill_chunk_blocks(self, request_id: str) -> int:
        """The window blocks a request still prefilling (or replaying) may hold beyond its
        decode footprint: its next chunk in each window group."""
        request = self.requests.get(request_id)
        if request is None or not self.absolute_caps.window_groups:
            return 0
        remaining = request.num_tokens - 1 - request.num_computed_tokens
        if remaining <= 0:
            return 0
        chunk = min(remaining, self.max_num_batched_tokens)
        return self.absolute_caps.window_groups * blocks_for(chunk, self.block_size)

    def _randkv_absolute_held(self, request_id: str) -> int:
        """Blocks a request holds now in the window and state groups (not vLLM's null
        block, which their lists keep where they hold none)."""
        null = self.block_pool.null_block
        return sum(
            1
            for manager in self.absolute_managers
            for block in manager.req_to_blocks.get(request_id, ())
            if block is not null
        )

    def randkv_absolute_blocks_to_allocate(
        self,
        request: Request,
        computed: int,
        tokens: int,
        hits: Any,
        admission: bool = False,
    ) -> int:
        """Blocks the sliding-window and state groups need for `tokens` absolute tokens, as
        vLLM's own managers count them (after they free what left the window, or a state
        checkpoint no longer needed). 0 for a dense model. More than the pool holds means
        "not this step" (vLLM's state manager answers so while a prefix hit's state block
        is being cached)."""
        if not self.absolute_managers:
            return 0
        rid = request.request_id
        if not admission:
            # Tokens of steps still in flight (async scheduling) are not safe to free yet.
            safe = max(0, computed - request.num_in_flight_tokens)
            for manager in self.absolute_managers:
                manager.remove_skipped_blocks(rid, safe, request.num_prompt_tokens)
        tokens = min(tokens, self.max_model_len)
        extra = {}
        if self.randkv_prefill_end_keyword:
            # Where the prompt (or a replay) ends: vLLM's state manager places its prefill
            # checkpoints by it (vLLM >= 0.32).
            extra["prefill_end"] = max(request.num_prompt_tokens, request.num_tokens - 1)
        return sum(
            manager.get_num_blocks_to_allocate(
                rid,
                tokens,
                hits[group] if hits else [],
                computed,
                computed,
                tokens,
                apply_admission_cap=admission,
                **extra,
            )
            for group, manager in zip(self.layout.absolute, self.absolute_managers, strict=True)
        )

    def randkv_allocate_new_blocks(
        self,
        request_id: str,
        physical: tuple[int, int],
        absolute: tuple[int, int],
        num_encoder_tokens: int,
    ) -> tuple[list[Any], ...]:
        """New blocks per group: the full-attention group up to the physical length, vLLM's
        sliding-window and state groups up to the absolute one (their blocks stay where
        vLLM puts them). Each length comes as (with the drafter's lookahead, the target's
        alone)."""
        if not self.absolute_managers:
            return self.coordinator.allocate_new_blocks(
                request_id, physical[0], physical[1], num_encoder_tokens
            )
        cap = self.max_model_len
        with_lookahead, target = min(absolute[0], cap), min(absolute[1], cap)
        managers = self.coordinator.single_type_managers
        return tuple(
            manager.allocate_new_blocks(request_id, physical[0], physical[1])
            if group == self.layout.randkv
            else manager.allocate_new_blocks(request_id, with_lookahead, target)
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

    def randkv_blocks_held(self, request_ids: Any) -> BlocksHeld:
        """The blocks these requests hold now, by kind of group (a window or state group's
        list keeps vLLM's null block where it holds none)."""
        full = self.full_manager.req_to_blocks
        null = self.block_pool.null_block
        managers = self.coordinator.single_type_managers

        def held_in(groups: tuple[int, ...]) -> int:
            return sum(
                sum(1 for block in managers[g].req_to_blocks.get(r, ()) if block is not null)
                for g in groups
                for r in request_ids
            )

        return BlocksHeld(
            full=sum(len(full.get(r, ())) for r in request_ids),
            windows=held_in(self.layout.windows),
            states=held_in(self.layout.states),
        )
