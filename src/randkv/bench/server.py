"""Start `randkv serve` as a real server process on loopback, and read its /metrics.

Used by `randkv bench serve`, the demo and the server tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from randkv.spec.config import RandKVConfig

SERVED_MODEL_NAME = "randkv-bench"
#: vLLM's engine arguments by their Python names (`max_num_seqs=8`); None: vLLM decides.
EngineArg = str | int | float | bool | None
EngineArgs = dict[str, EngineArg]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: Engine arguments whose False is not vLLM's default (None: vLLM decides), so it is passed.
NEGATABLE_ENGINE_ARGS = frozenset({"async_scheduling"})


def serve_argv(
    model: str, randkv: RandKVConfig | None, engine_args: Mapping[str, EngineArg], port: int
) -> list[str]:
    """The `randkv serve` command line; engine_args use vLLM's names (`max_num_seqs=8`)."""
    argv = [sys.executable, "-m", "randkv.cli", "serve", model]
    if randkv is None:
        argv.append("--no-randkv")
    else:
        argv += [
            f"--randkv-budget={randkv.budget}",
            f"--randkv-buffer={randkv.buffer_size}",
            f"--randkv-seed={randkv.seed}",
        ]
        if randkv.min_generated is not None:
            argv.append(f"--randkv-min-generated={randkv.min_generated}")
        if randkv.max_request_budget is not None:
            argv.append(f"--randkv-max-request-budget={randkv.max_request_budget}")
        argv.append(f"--randkv-admission={randkv.admission}")
    argv += ["--host=127.0.0.1", f"--port={port}", f"--served-model-name={SERVED_MODEL_NAME}"]
    for name, value in engine_args.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False and name in NEGATABLE_ENGINE_ARGS:
            argv.append("--no-" + name.replace("_", "-"))
        elif value is not False and value is not None:
            argv.append(f"{flag}={value}")
    return argv


class Server:
    """One `randkv serve` process. Use `running_server(...)`, which stops it."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        # The server runs vLLM's normal multi-process layout, its own metrics directory, and
        # no test-only slot tracking.
        for name in (
            "VLLM_ENABLE_V1_MULTIPROCESSING",
            "PROMETHEUS_MULTIPROC_DIR",
            "RANDKV_TRACK_POSITIONS",
        ):
            env.pop(name, None)
        env.update(extra_env or {})
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"randkv serve exited with {self.process.returncode}; log tail:\n"
                    + self.log_tail()
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"randkv serve not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()

    def metrics(self) -> dict[str, float]:
        return scrape_metrics(self.base_url)


@contextmanager
def running_server(
    model: str,
    randkv: RandKVConfig | None,
    engine_args: Mapping[str, EngineArg],
    log_path: Path,
    timeout: float = 300.0,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    port = free_port()
    server = Server(serve_argv(model, randkv, engine_args, port), port, log_path, extra_env)
    try:
        server.wait_ready(timeout)
        yield server
    finally:
        server.stop()


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text page, summed over labels, by sample name
    (`..._total`, gauges, `..._sum`/`..._count`; summed histogram buckets mean nothing)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def scrape_metrics(base_url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(f"{base_url}/metrics", timeout=10.0).text)
