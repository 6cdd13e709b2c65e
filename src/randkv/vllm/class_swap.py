"""Giving an object vLLM built the methods of RandKV's subclass, checked.

vLLM builds its KV cache manager inside `Scheduler.__init__` and its model runner inside
`Worker.init_device`, with no injection point; RandKV swaps the built object's class for a
subclass that adds RandKV's behaviour. A swap is only sound when the object is exactly the
vLLM class the subclass extends, so this refuses anything else and names what it found.
"""

from __future__ import annotations

from typing import Any

from randkv.vllm.refusals import UnsupportedModeError


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def swap_class(obj: Any, expected: type, replacement: type) -> None:
    """Set `obj.__class__ = replacement` if `obj` is exactly an `expected` (vLLM's class)."""
    if not issubclass(replacement, expected):
        raise TypeError(f"{_name(replacement)} does not extend {_name(expected)}")
    if type(obj) is replacement:
        return  # already swapped (e.g. a worker re-initialised)
    if type(obj) is not expected:
        raise UnsupportedModeError(
            f"RandKV extends vLLM's {_name(expected)}, but this engine built a "
            f"{_name(type(obj))}; RandKV supports vLLM's own classes only (check that no "
            "other plugin replaced this class)"
        )
    obj.__class__ = replacement
