"""One Triton kernel, compiled on CUDA and interpreted on CPU tensors, with start-up warm-up.

Triton compiles a kernel the first time it meets a new *specialisation* of its arguments
(an integer equal to 1 or divisible by 16, a pointer aligned to 16 bytes, each constexpr
value, the launch options). RandKV's kernels declare every per-step argument unspecialised,
so an engine meets one specialisation per kernel; `Kernel.warmup` compiles it at worker
start-up, before the engine reports ready, instead of inside the first serving step.

`Kernel.specialization` computes the key Triton compiles under (with Triton's own
`native_specialize_impl` where it exists), so a CPU test can show that serving-like
launches meet only the warmed keys; `compiled_variants` counts Triton's real cache on CUDA.

Launches are labelled `triton::NAME` for the torch profiler (see `randkv.kernels.launches`).
"""

from __future__ import annotations

import inspect
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
from torch.autograd import profiler as autograd_profiler
from triton.runtime.interpreter import InterpretedFunction

LAUNCH_LABEL = "triton::"

try:  # Triton >= 3.5: the specialisation rule itself
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl as _native
except ImportError:  # pragma: no cover - older Triton: the mirror below
    _native = None


def _specialize(value: Any, specialize: bool, align: bool) -> tuple[Any, ...]:
    """Triton's (type, specialisation) of one non-constexpr argument."""
    if _native is not None:
        try:
            return tuple(_native(BaseBackend, value, False, specialize, align))
        except TypeError:  # another Triton's signature: the mirror below
            pass
    if isinstance(value, torch.Tensor):  # pragma: no cover - mirror of Triton's rule
        aligned = align and specialize and value.data_ptr() % 16 == 0
        return (f"*{value.dtype}", "D" if aligned else "")
    if isinstance(value, bool) or not isinstance(value, int):  # pragma: no cover
        return (type(value).__name__, value)
    kind = "i32" if -(2**31) <= value < 2**31 else "i64"  # pragma: no cover
    if not specialize:  # pragma: no cover
        return (kind, None)
    if value == 1:  # pragma: no cover
        return ("constexpr", 1)
    return (kind, "D" if align and value % 16 == 0 else "")  # pragma: no cover


class Kernel:
    """A Triton kernel function; `launch` runs it on tensors of any device.

    do_not_specialize / do_not_specialize_on_alignment name the arguments whose values
    vary from step to step (see the module docstring).
    """

    tracking = False  # set by tests and `randkv check`: record every launch's key

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        do_not_specialize: Sequence[str] = (),
        do_not_specialize_on_alignment: Sequence[str] = (),
        interpretable: bool = True,
    ) -> None:
        self.name = fn.__name__.lstrip("_")
        options = {
            "do_not_specialize": list(do_not_specialize),
            "do_not_specialize_on_alignment": list(do_not_specialize_on_alignment),
        }
        # triton.jit returns an InterpretedFunction when TRITON_INTERPRET=1 at import.
        self.compiled = triton.jit(fn, **options)
        self._fn, self._options = fn, options
        # False: the kernel calls @triton.jit helpers (its own or triton.language's, e.g.
        # tl.sum), which only an interpreter-mode import of Triton can run on CPU.
        self._interpretable = interpretable
        self._interpreter: InterpretedFunction | None = None
        params = inspect.signature(fn).parameters.values()
        self._params = [(p.name, "constexpr" in str(p.annotation)) for p in params]
        self.warmed: set[tuple[Any, ...]] = set()
        self.launched: Counter[tuple[Any, ...]] = Counter()
        self.compile_seconds = 0.0

    def for_device(self, device: torch.device) -> Any:
        """The compiled kernel for GPU tensors; Triton's interpreter for CPU tensors."""
        if device.type != "cpu" or isinstance(self.compiled, InterpretedFunction):
            return self.compiled
        if self._interpreter is None:
            if not self._interpretable:
                raise RuntimeError(
                    f"the Triton kernel {self.name} runs on CPU tensors only in Triton's "
                    "interpreter: set TRITON_INTERPRET=1 before triton is first imported "
                    "(it calls triton.language helpers that compiled-mode Triton cannot "
                    "interpret), or pass CUDA tensors"
                )
            self._interpreter = InterpretedFunction(self._fn, **self._options)
        return self._interpreter

    def specialization(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The key Triton compiles this call under (positional args, then keywords)."""
        key: list[Any] = []
        no_spec = set(self._options["do_not_specialize"])
        no_align = set(self._options["do_not_specialize_on_alignment"])
        for (name, constexpr), value in zip(self._params, args, strict=False):
            if constexpr:
                key.append((name, value))
            else:
                key.append((name, *_specialize(value, name not in no_spec, name not in no_align)))
        names = {name for name, _ in self._params}
        key.extend((name, value) for name, value in sorted(kwargs.items()) if name in names)
        # Launch options (num_warps, ...) are part of the compiled variant too.
        key.extend((name, value) for name, value in sorted(kwargs.items()) if name not in names)
        return tuple(key)

    def launch(
        self, device: torch.device, grid: tuple[int, ...], *args: Any, **kwargs: Any
    ) -> None:
        if Kernel.tracking:
            self.launched[self.specialization(args, kwargs)] += 1
        kernel = self.for_device(device)
        if autograd_profiler._is_profiler_enabled:  # one labelled launch for counters
            with torch.profiler.record_function(LAUNCH_LABEL + self.name):
                kernel[grid](*args, **kwargs)
        else:
            kernel[grid](*args, **kwargs)

    def warmup(
        self, device: torch.device, grid: tuple[int, ...], *args: Any, **kwargs: Any
    ) -> float:
        """Compile for these arguments without launching; seconds spent (0.0 on CPU, where
        the interpreter compiles nothing)."""
        self.warmed.add(self.specialization(args, kwargs))
        kernel = self.for_device(device)
        if isinstance(kernel, InterpretedFunction):
            return 0.0
        start = time.perf_counter()
        kernel.warmup(*args, grid=grid, **kwargs)
        seconds = time.perf_counter() - start
        self.compile_seconds += seconds
        return seconds

    def compiled_variants(self, device: torch.device) -> int | None:
        """Variants in Triton's in-process cache for `device` (None where unreadable)."""
        if device.type != "cuda" or isinstance(self.compiled, InterpretedFunction):
            return None
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            caches = self.compiled.device_caches
            return len(caches[index][0]) if index in caches else 0
        except Exception:  # a Triton version with another cache layout
            return None
