"""Every policy by name: the one list the benchmarks and the CLI read.

Adding a policy is its file plus one line in `POLICIES`: an instance with the parameters it
runs with. Its name is the instance's `name` (`label`, plus `-noprompt` for a
`PromptChoice` with `protect_prompt=False`), and each lookup returns a fresh copy. A study
names the policies it compares (a tuple of these names); `python -m studies eval --evictors`
takes any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import is_dataclass, replace
from functools import partial

from randkv.selectors.base import Selector
from randkv.selectors.h2o import H2O
from randkv.selectors.oracle import Belady
from randkv.selectors.randkv import RandKV, SharedRandKV
from randkv.selectors.recency import PromptWindow, StreamingLLM
from randkv.selectors.rkv import RKV
from randkv.selectors.snapkv import SnapKV
from randkv.selectors.tova import TOVA

__all__ = ["POLICIES", "make_selector", "policy_names", "selector_factory"]

#: One instance per registered policy (the order is the order of `policy_names`), and what
#: it keeps; "prompt" means the prompt is never evicted.
POLICIES: tuple[Selector, ...] = (
    RandKV(),  # prompt + r newest + uniform random sample (per KV head)
    RandKV(protect_prompt=False),  # r newest + uniform random sample of everything older
    SharedRandKV(),  # RandKV with one draw per layer shared by its KV heads (ablation)
    StreamingLLM(),  # 4 sink tokens + most recent tokens
    PromptWindow(),  # prompt + most recent tokens
    H2O(),  # prompt + recent half + heavy hitters (accumulated attention)
    H2O(protect_prompt=False),  # recent half + heavy hitters, prompt competes (as in the paper)
    SnapKV(),  # prompt + r newest + top observation-window votes, pooled
    TOVA(),  # prompt + r newest + top attention of the newest query
    RKV(),  # prompt + r newest + top attention importance minus key redundancy
    Belady(),  # oracle: the copies future steps need (`future=...`), soonest first; prompt
)


def _by_name(policies: tuple[Selector, ...]) -> dict[str, Callable[[], Selector]]:
    factories: dict[str, Callable[[], Selector]] = {}
    for policy in policies:
        if policy.name in factories:
            raise ValueError(f"two registered policies are called {policy.name!r}")
        if not is_dataclass(policy):
            raise TypeError(f"policy {policy.name!r} is not a dataclass")
        # A frozen dataclass copied with no changes: a fresh selector with these parameters.
        factories[policy.name] = partial(replace, policy)
    return factories


_FACTORIES = _by_name(POLICIES)


def policy_names() -> tuple[str, ...]:
    """The names of every registered policy."""
    return tuple(_FACTORIES)


def selector_factory(name: str) -> Callable[[], Selector]:
    """What makes a fresh selector of the policy called `name` (ValueError naming the choices
    otherwise)."""
    try:
        return _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {list(_FACTORIES)}") from None


def make_selector(name: str) -> Selector:
    """A fresh selector of the policy called `name`."""
    return selector_factory(name)()
