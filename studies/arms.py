"""The arms of a quality evaluation: the dense reference and the registered policies.

An arm is a policy from `randkv.selectors.registry` (its name is the policy's name), or
"dense", the no-eviction reference: RandKV's loop with a budget no round reaches. Each task
names the policies it compares by default; any registered one can be asked for by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from randkv.selectors.base import Selector
from randkv.selectors.randkv import RandKV
from randkv.selectors.registry import policy_names, selector_factory

__all__ = ["DENSE", "Arm", "arm_names", "find_arm"]

#: Name of the no-eviction reference.
DENSE = "dense"


@dataclass(frozen=True)
class Arm:
    """One arm of an evaluation: its selector, and whether it is the dense reference (a
    budget no round reaches, so its selector never runs)."""

    selector: Callable[[], Selector]
    dense: bool = False

    @property
    def random(self) -> bool:
        """Its decisions depend on the eviction seed: it runs once per seed."""
        return not self.dense and self.selector().random

    @property
    def knows_future(self) -> bool:
        """Its selector must be told each problem's future needs (an oracle)."""
        return not self.dense and self.selector().knows_future


_DENSE_ARM = Arm(RandKV, dense=True)


def arm_names() -> tuple[str, ...]:
    """Every name `find_arm` accepts: dense, then the registered policies."""
    return (DENSE, *policy_names())


def find_arm(name: str, *, future_known: bool = False) -> Arm:
    """The arm called `name` (ValueError naming the choices otherwise). A task that cannot
    tell an oracle its problems' future (`future_known=False`) refuses such a policy."""
    if name == DENSE:
        return _DENSE_ARM
    try:
        arm = Arm(selector_factory(name))
    except ValueError:
        raise ValueError(f"unknown evictor {name!r}; choose from {list(arm_names())}") from None
    if arm.knows_future and not future_known:
        raise ValueError(f"{name} needs each problem's future uses, which this task does not know")
    return arm
