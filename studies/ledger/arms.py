"""The ledger study's arms, and what the oracle is told about a problem's future.

Dense, then the comparators of issue 15 (`COMPARED`, names in `randkv.selectors.registry`):
RandKV (one run per eviction seed), RandKV with one draw shared by the KV heads of a layer,
prompt + recent window, StreamingLLM, H2O, SnapKV, TOVA, R-KV and the Belady oracle. Every
scored method keeps the prompt (the same candidates as RandKV); StreamingLLM keeps only its 4
sinks, which here lie inside the 8-token prompt.
"""

from __future__ import annotations

from randkv.selectors.oracle import Need
from studies.arms import Arm, find_arm
from studies.ledger.task import EVENT_CHARS, LedgerProblem

__all__ = ["COMPARED", "ORACLE", "SCORED", "ledger_arm", "oracle_needs"]

ORACLE = "oracle"

#: The policies compared by default, in report order (dense comes first, see LedgerEvalConfig).
COMPARED: tuple[str, ...] = (
    "randkv",
    "randkv-shared",
    "window",
    "streamingllm",
    "h2o",
    "snapkv",
    "tova",
    "rkv",
    ORACLE,
)

#: The scored methods (they rank tokens by attention or keys); H4's "best scored method".
SCORED = ("h2o", "snapkv", "tova", "rkv")


def ledger_arm(name: str) -> Arm:
    """The arm called `name`: dense or any registered policy, the oracle included (the
    ledger tells it each problem's needs, `oracle_needs`)."""
    return find_arm(name, future_known=True)


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
