"""The ledger study's arms by name, and what the oracle is told about a problem's future.

Dense, then the comparators of issue 15: RandKV (one run per eviction seed), RandKV with one
draw shared by the KV heads of a layer, prompt + recent window, StreamingLLM, H2O, SnapKV,
TOVA, R-KV and the Belady oracle. Every scored method keeps the prompt (the same candidates as
RandKV); StreamingLLM keeps only its 4 sinks, which here lie inside the 8-token prompt.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from randkv.quality.evictors import DENSE, Arm
from randkv.quality.ledger import EVENT_CHARS, LedgerProblem
from randkv.selectors import (
    H2O,
    RKV,
    TOVA,
    Belady,
    Need,
    PromptWindow,
    RandKV,
    Selector,
    SharedRandKV,
    SnapKV,
    StreamingLLM,
)

__all__ = ["LEDGER_ARMS", "ORACLE", "SCORED", "ledger_arm", "oracle_needs"]

ORACLE = "oracle"

_POLICIES: tuple[Selector, ...] = (
    RandKV(),
    SharedRandKV(),
    PromptWindow(),
    StreamingLLM(),
    H2O(),
    SnapKV(),
    TOVA(),
    RKV(),
    Belady(),
)

#: Every arm by name, in report order: dense first.
LEDGER_ARMS: dict[str, Arm] = {DENSE: Arm(RandKV, dense=True)} | {
    p.name: Arm(partial(replace, p)) for p in _POLICIES
}

#: The scored methods (they rank tokens by attention or keys); H4's "best scored method".
SCORED = ("h2o", "snapkv", "tova", "rkv")


def ledger_arm(name: str) -> Arm:
    """The arm called `name` (ValueError naming the choices otherwise)."""
    try:
        return LEDGER_ARMS[name]
    except KeyError:
        raise ValueError(f"unknown ledger arm {name!r}; choose from {list(LEDGER_ARMS)}") from None


def oracle_needs(problem: LedgerProblem) -> tuple[Need, ...]:
    """Every use of `problem` as a need of the oracle: the value token of its define.

    A use's value is predicted by the query at its variable token (absolute position P + 4e
    + 1 for event e). The shipped model reads a fact from its define, not from restatements
    (measured on 16 problems: an oracle that keeps the newest copy, often a use, scores 0.43
    at K = 72; one that keeps the define's value token scores 1.00), so the define's value
    token is the one copy each need names.
    """
    prompt = len(problem.prompt)
    define: dict[str, int] = {}
    needs = []
    for event in range(problem.config.events):
        op, var = problem.body[EVENT_CHARS * event : EVENT_CHARS * event + 2]
        at = prompt + EVENT_CHARS * event
        if op == "=":
            define[var] = at + 2
        else:
            needs.append(Need(at + 1, ((define[var],),)))
    return tuple(needs)
