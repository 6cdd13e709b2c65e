"""`scripts/gpu_check.py --smoke` runs every check on tiny CPU shapes and says they pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CORRECTNESS = {
    "planner_device_vs_cpu",
    "planner_parallel_slices",
    "compactors_bitwise",
    "replay_vs_spec",
    "host_syncs",
}


def test_gpu_check_smoke_run_passes(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["smoke"] and doc["finished"]
    checks = doc["checks"]
    assert set(checks) >= CORRECTNESS
    for name in CORRECTNESS:
        assert checks[name]["kind"] == "correctness"
        assert checks[name]["passed"] is True, (name, checks[name])
    assert doc["summary"]["correctness_passed"] is True
    assert checks["environment"]["details"]["triton_interpret"] == "1"  # set by the script
    assert checks["host_syncs"]["details"]["counts"]["plan+triton"]["total"] == 0
    speed = checks["speed"]["details"]
    assert {"rounds_1", "rounds_8", "rounds_64", "targets"} <= set(speed)
    assert speed["rounds_64"]["triton"]["gb_per_s"] > 0
    assert speed["targets"]["applicable"] is False  # CPU timings say nothing about a GPU
