"""Drive one server with a request mix over HTTP streaming completions."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from randkv.bench.server import SERVED_MODEL_NAME
from randkv.bench.workload import BenchRequest


class Progress(Protocol):
    """What the load generator reports to: a progress bar (tqdm's) or nothing."""

    def update(self, n: int) -> object: ...


@dataclass
class RequestTrace:
    """Client-side timing of one streamed request (seconds from the run's start)."""

    index: int
    sent: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # as the server streamed them
    text: str = ""  # the server's own detokenized text
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def itl(self) -> float | None:
        """Mean inter-token latency: (last token - first token) / (tokens - 1).

        Per-chunk gaps are not used: a busy client reads several chunks at once.
        """
        times = self.token_times
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


async def _stream_one(
    http: httpx.AsyncClient, base_url: str, request: BenchRequest, t0: float, progress: Progress
) -> RequestTrace:
    trace = RequestTrace(request.index, time.perf_counter() - t0)
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": request.prompt_token_ids,
        **request.sampling_fields(),
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        async with http.stream("POST", f"{base_url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                trace.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return trace
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter() - t0
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        trace.token_times.append(now)
                        trace.text += choice["text"]
                    trace.token_ids += choice.get("token_ids") or ()
                    if choice.get("finish_reason"):
                        trace.finish_reason = choice["finish_reason"]
                if chunk.get("usage"):
                    trace.output_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as error:
        trace.error = f"{type(error).__name__}: {error}"
    finally:
        progress.update(1)
    return trace


async def run_load(
    base_url: str, requests: list[BenchRequest], *, progress: Progress
) -> tuple[list[RequestTrace], float, float]:
    """Send every request at once (the server's max_num_seqs and KV pool decide what runs)
    and stream all responses. Returns the traces, the start as Unix time, and the makespan.
    """
    limits = httpx.Limits(max_connections=len(requests) + 4)
    timeout = httpx.Timeout(None, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        start_unix, t0 = time.time(), time.perf_counter()
        traces = await asyncio.gather(
            *(_stream_one(http, base_url, r, t0, progress) for r in requests)
        )
        makespan = time.perf_counter() - t0
    return list(traces), start_unix, makespan
