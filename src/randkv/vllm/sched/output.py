"""Typed data that crosses the scheduler -> worker boundary once per step (pickled in
multiprocess mode, so plain dataclasses of ints and strings).

vLLM v1 declares every field its scheduler sends the workers, and so does RandKV: its
scheduler returns a `RandKVSchedulerOutput`, vLLM's `SchedulerOutput` plus one declared
field. A subclass rather than a reused vLLM field (the KV connector's metadata slot would
clash with a real connector) or an attribute set on vLLM's object (undeclared, read back
with getattr); it pickles like its base, so it reaches every worker, in-process or through
vLLM's multiprocess executor at any tensor-parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from vllm.v1.core.sched.output import SchedulerOutput


@dataclass(frozen=True)
class RoundDirective:
    """Apply one round to a request before this step's forward pass, then keep only the
    first `keep_blocks` of its blocks (the scheduler freed the rest).

    `block_ids` are the request's blocks as the round finds them (slots [0, K + 2r)), so a
    worker needs no block table of its own to compact: vLLM's V2 runner keeps block ids on
    the device only.
    """

    round_index: int
    keep_blocks: int
    prompt_length: int
    request_key: int
    block_ids: tuple[int, ...]
    budget: int  # the request's own K


@dataclass
class RandKVStepPlan:
    """Everything RandKV's workers need for one step. `budgets`: the K of every request
    scheduled this step whose K is not the server's (a long prompt under min_generated, or
    a request's own randkv_budget)."""

    directives: dict[str, RoundDirective] = field(default_factory=dict)
    budgets: dict[str, int] = field(default_factory=dict)


@dataclass(kw_only=True)
class RandKVSchedulerOutput(SchedulerOutput):
    """vLLM's scheduler output with this step's RandKV plan."""

    randkv: RandKVStepPlan


def with_plan(output: SchedulerOutput, plan: RandKVStepPlan) -> RandKVSchedulerOutput:
    """`output`'s fields (the same objects, not copies) and `plan`."""
    return RandKVSchedulerOutput(
        **{f.name: getattr(output, f.name) for f in fields(output)}, randkv=plan
    )
