"""Count host syncs: the tensor reads that would stall the host on a GPU.

`count_host_syncs()` is a context manager that counts, while it is active:
- `aten._local_scalar_dense` (or `aten.item` under inference mode): `int()`, `float()`,
  `bool()` of a tensor;
- device-to-host copies (`_to_copy`/`copy_` from a non-CPU tensor into a CPU one);
- ops whose output shape or value depends on device data (`nonzero`, `equal`, boolean
  indexing, ...), which read back a count or a flag on CUDA;
- calls of `Tensor.tolist`, `Tensor.numpy` and `Tensor.item` on any tensor.

On a CPU-only machine host and device tensors cannot be told apart, so the rule this
enforces is stricter than "no syncs": per-step code must not read tensors back at all;
host-side data lives in Python ints. The patching of `torch.Tensor` is process-wide:
do not use the counter from several threads at once.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_WRAPPED = ("tolist", "numpy", "item")
# Ops that, on CUDA, must read device data on the host to size or return their result.
_DATA_DEPENDENT = {
    _aten.nonzero.default: "aten.nonzero",
    _aten.masked_select.default: "aten.masked_select",
    _aten._unique2.default: "aten.unique",
    _aten.unique_consecutive.default: "aten.unique_consecutive",
    _aten.unique_dim.default: "aten.unique_dim",
    _aten.equal.default: "aten.equal",
    _aten.is_nonzero.default: "aten.is_nonzero",
}


def _is_cpu(device: Any) -> bool:
    return torch.device(device).type == "cpu"


class HostSyncCounter(TorchDispatchMode):
    """A dispatch mode that counts host syncs; see the module docstring.

    `counts` maps an op name ("item", "tolist", "numpy", "aten._local_scalar_dense",
    "d2h_copy", "aten.nonzero", ...) to how often it ran; `total` sums them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._inside_wrapped = 0  # > 0 while a wrapped method runs: count it once

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, name: str) -> None:
        if self._inside_wrapped == 0:
            self.counts[name] += 1

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = self._classify(func, args, kwargs)
        if name is not None:
            self.record(name)
        return func(*args, **kwargs)

    @staticmethod
    def _classify(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        if func is _aten._local_scalar_dense.default:
            return "aten._local_scalar_dense"
        if func is _aten.item.default:
            return "aten.item"  # what int()/bool() dispatch under inference_mode
        if func in _DATA_DEPENDENT:
            return _DATA_DEPENDENT[func]
        if func is _aten._to_copy.default:
            target = kwargs.get("device")
            source = args[0]
            if target is not None and _is_cpu(target) and not _is_cpu(source.device):
                return "d2h_copy"
            return None
        if func is _aten.copy_.default:
            target, source = args[0], args[1]
            if _is_cpu(target.device) and not _is_cpu(source.device):
                return "d2h_copy"
            return None
        if func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            return "aten.repeat_interleave"  # sums the repeats to size its output
        if func in (_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default):
            indices = args[1]
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                return "aten.index(mask)"  # a boolean mask is turned into nonzero()
        return None

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.record(name)
            self._inside_wrapped += 1
            try:
                return method(tensor, *args, **kwargs)
            finally:
                self._inside_wrapped -= 1

        return counted

    def __enter__(self) -> HostSyncCounter:
        # Remember whether torch.Tensor itself defined each method (or inherited it).
        self._originals = {name: vars(torch.Tensor).get(name) for name in _WRAPPED}
        for name in _WRAPPED:
            method = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._wrap(name, method))
        try:
            super().__enter__()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        for name, method in self._originals.items():
            if method is None:
                delattr(torch.Tensor, name)  # back to the inherited C method
            else:
                setattr(torch.Tensor, name, method)


@contextmanager
def count_host_syncs() -> Iterator[HostSyncCounter]:
    """`with count_host_syncs() as syncs: ...`, then read `syncs.total` / `syncs.counts`."""
    with HostSyncCounter() as counter:
        yield counter


_pin_memory = True  # vLLM's engine sets this from its platform (see `set_pin_memory`)


def set_pin_memory(enabled: bool) -> None:
    """Whether `host_to_device` stages host tensors in pinned memory (process-wide).

    vLLM turns pinned memory off where it is unavailable or unwanted (WSL, some containers,
    `is_pin_memory_available()`); RandKV's workers follow that setting.
    """
    global _pin_memory
    _pin_memory = bool(enabled)


def pin_memory_enabled() -> bool:
    return _pin_memory


def host_to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Copy `tensor` to `device` without a host sync where pinned memory is allowed.

    A host tensor bound for CUDA is staged in pinned memory and copied non-blocking on
    the current stream (a pageable copy would block the host); torch's pinned-memory
    allocator keeps the staging buffer alive until the copy has run. With pinning off
    (`set_pin_memory(False)`) the copy is an ordinary pageable one.
    """
    device = torch.device(device)
    if tensor.device.type == "cpu" and device.type == "cuda":
        if not _pin_memory:
            return tensor.to(device)
        if not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=True)
    return tensor.to(device)
