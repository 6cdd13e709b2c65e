"""The benchmark's arms by name: a thin registry over `randkv.selectors`.

Each name is the `name` of its selector (`H2O(protect_prompt=False).name == "h2o-noprompt"`).
"dense" is the no-eviction reference: RandKV's loop with a budget no round reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from randkv.selectors import (
    H2O,
    TOVA,
    PromptWindow,
    RandKV,
    Selector,
    SnapKV,
    StreamingLLM,
    attention_hooks,
)

__all__ = ["ARMS", "DENSE", "EVICTORS", "Arm", "attention_hooks", "make_evictor"]

#: The compared policies, in report order.
POLICIES: tuple[Selector, ...] = (
    RandKV(),
    RandKV(protect_prompt=False),
    StreamingLLM(),
    PromptWindow(),
    H2O(),
    H2O(protect_prompt=False),
    SnapKV(),
    TOVA(),
)

#: Name of the no-eviction reference.
DENSE = "dense"

#: Selector factories by name, in report order (dense is an arm, below).
EVICTORS: dict[str, Callable[[], Selector]] = {p.name: partial(replace, p) for p in POLICIES}


@dataclass(frozen=True)
class Arm:
    """One arm of the evaluation: its selector, and whether it is the dense reference (a
    budget no round reaches, so its selector never runs)."""

    selector: Callable[[], Selector]
    dense: bool = False

    @property
    def random(self) -> bool:
        """Its decisions depend on the eviction seed: it runs once per seed."""
        return not self.dense and self.selector().random


#: Every arm by name: dense first, then the policies.
ARMS: dict[str, Arm] = {DENSE: Arm(RandKV, dense=True)} | {
    name: Arm(factory) for name, factory in EVICTORS.items()
}


def make_evictor(name: str) -> Selector:
    """A selector by its name."""
    try:
        return EVICTORS[name]()
    except KeyError:
        raise ValueError(f"unknown evictor {name!r}; choose from {list(ARMS)}") from None
