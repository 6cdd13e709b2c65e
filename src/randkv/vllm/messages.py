"""Typed data that crosses the scheduler -> worker boundary once per step (pickled in
multiprocess mode, so plain dataclasses of ints and strings)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundDirective:
    """Apply one round to a request before this step's forward pass, then keep only the
    first `keep_blocks` of its blocks (the scheduler freed the rest)."""

    round_index: int
    keep_blocks: int
    prompt_length: int
    request_key: int


@dataclass
class RandKVStepPlan:
    """Everything RandKV's workers need for one step."""

    directives: dict[str, RoundDirective] = field(default_factory=dict)
    request_keys: dict[str, int] = field(default_factory=dict)  # newly scheduled requests
    scheduler_counters: dict[str, int] = field(default_factory=dict)
