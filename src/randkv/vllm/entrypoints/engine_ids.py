"""Which engine request a caller's request id became.

vLLM's `LLMEngine.add_request(request_id, ...)` returns the id the engine uses for that
request (vLLM makes it unique); a request with n > 1 samples runs as n engine requests whose
ids vLLM 0.28.0 builds as `f"{index}_{parent id}"` (`ParentRequest.get_child_info`).
RandKV's statistics are keyed by engine ids; this maps a caller's id back to them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

_KEPT = 4096  # the same bound as the workers' finished-request records


class EngineRequestIds:
    def __init__(self) -> None:
        self._ids: OrderedDict[str, str] = OrderedDict()

    def follow(self, engine: Any) -> None:
        """Record the id `engine.add_request` returns for every request added from now on."""
        add_request = engine.add_request

        def recording_add_request(request_id: str, *args: Any, **kwargs: Any) -> str:
            engine_id = add_request(request_id, *args, **kwargs)
            self._ids[request_id] = engine_id
            self._ids.move_to_end(request_id)
            while len(self._ids) > _KEPT:
                self._ids.popitem(last=False)
            return engine_id

        engine.add_request = recording_add_request

    def engine_id(self, request_id: str, sample: int | None = None) -> str:
        """The engine id of the caller's `request_id` (its `sample`-th sample when n > 1)."""
        try:
            engine_id = self._ids[request_id]
        except KeyError:
            raise KeyError(
                f"request {request_id!r} was not added through this LLM (or is older than "
                f"its last {_KEPT} requests)"
            ) from None
        return engine_id if sample is None else f"{sample}_{engine_id}"
