"""Count the device kernels a piece of torch code would launch, on any machine.

`count_launches(fn)` runs `fn` under the torch profiler (CPU activity) and counts the
*leaf* aten operators that do work, plus Triton launches (labelled `triton::NAME` by
`randkv.kernels.triton_jit.Kernel`). On CUDA each such operator is one kernel launch (or one
copy); metadata-only operators (views, reshapes, allocations) launch nothing and are not
counted. So the count measured on CPU is the launch count a GPU would see, give or take
ops that CUDA fuses or splits (a pinned host-to-device copy counts once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch.profiler import ProfilerActivity, profile

from randkv.kernels.triton_jit import LAUNCH_LABEL

if TYPE_CHECKING:
    from torch.autograd.profiler_util import FunctionEvent

    from randkv.kernels.planner import RoundPlanner

# Operators that only make views or allocate: no kernel runs on a GPU.
_NO_KERNEL = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::view",
    "aten::_unsafe_view",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::as_strided",
    "aten::expand",
    "aten::expand_as",
    "aten::permute",
    "aten::transpose",
    "aten::t",
    "aten::select",
    "aten::slice",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::alias",
    "aten::detach",
    "aten::detach_",
    "aten::lift_fresh",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::unbind",
    "aten::split",
    "aten::narrow",
    "aten::is_pinned",
    "aten::pin_memory",  # host work; the copy that follows is counted
    "aten::_pin_memory",
    "aten::set_",
    "aten::result_type",
    "aten::contiguous",  # counted as its copy when it copies
    "aten::to",
    "aten::_to_copy",  # counted as its copy_
    "aten::lift_fresh_copy",  # torch.tensor(host list): host work
}


def count_launches(fn: Callable[[], object]) -> tuple[int, Counter[str]]:
    """(launches, per operator) of one call of `fn`."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith(("aten::", LAUNCH_LABEL))]
    # An event is a leaf if no other counted event lies inside it on the same thread.
    spans = sorted(events, key=lambda e: (e.thread, e.time_range.start, -e.time_range.end))
    counts: Counter[str] = Counter()
    for i, event in enumerate(spans):
        if event.name in _NO_KERNEL:
            continue
        start, end = event.time_range.start, event.time_range.end
        if event.name.startswith(LAUNCH_LABEL):
            counts[event.name] += 1  # the kernel itself, whatever the interpreter ran
            continue
        if _inside_triton(spans, i) or _has_child(spans, i, start, end):
            continue
        counts[event.name] += 1
    return sum(counts.values()), counts


def _has_child(spans: list[FunctionEvent], i: int, start: int, end: int) -> bool:
    thread = spans[i].thread
    for other in spans[i + 1 :]:
        if other.thread != thread or other.time_range.start >= end:
            return False
        if other.time_range.end <= end and other.name not in _NO_KERNEL:
            return True
    return False


def _inside_triton(spans: list[FunctionEvent], i: int) -> bool:
    """Torch ops the Triton interpreter runs inside a labelled launch are the kernel's."""
    event = spans[i]
    for other in spans[:i]:
        if (
            other.name.startswith(LAUNCH_LABEL)
            and other.thread == event.thread
            and other.time_range.start <= event.time_range.start
            and event.time_range.end <= other.time_range.end
        ):
            return True
    return False


def planner_launches(
    planner: RoundPlanner, rounds: int, *, prompt: int = 16
) -> tuple[int, Counter[str]]:
    """Launches of one planned step of `rounds` requests (Python-int inputs, the engine's)."""
    prompts = [min(prompt, planner.config.budget)] * rounds
    keys = [(2**64 - 1 - i * 7919) for i in range(rounds)]
    indices = list(range(rounds))
    planner.plan(prompts, keys, indices)  # warm caches (draw counts, compiled kernels)
    return count_launches(lambda: planner.plan(prompts, keys, indices))


__all__ = ["count_launches", "planner_launches"]
