#!/usr/bin/env bash
# The whole device run, unattended: environment, `randkv check` (JSON), and the pytest files
# that exercise the kernels and planner, every log teed into "$OUT".
#
#   OUT=/some/folder scripts/device_check.sh        (default OUT: results/device-check)
#
# Needs python3 with torch (+ Triton for the kernel lines; vLLM optional). Runs from a plain
# source tree (PYTHONPATH=src), no install needed. Each step has its own time limit and a
# failing step does not stop the next; the exit status is randkv check's.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-results/device-check}"
PY="${PYTHON:-python3}"
CHECK_LIMIT_S="${CHECK_LIMIT_S:-330}"
TEST_LIMIT_S="${TEST_LIMIT_S:-240}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi || echo "nvidia-smi: not available"
  "$PY" - <<'PYEOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "triton", "numpy", "vllm", "transformers", "pytest"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:
        print(name, "not available:", type(error).__name__)
try:
    import torch
    print("cuda available", torch.cuda.is_available(), "torch.version.cuda", torch.version.cuda)
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
except Exception as error:
    print("torch.cuda:", error)
PYEOF
} 2>&1 | tee "$OUT/env.log"

echo "== randkv check (limit ${CHECK_LIMIT_S}s)" | tee "$OUT/check.log"
timeout -k 10 "$CHECK_LIMIT_S" "$PY" -m randkv check --json "$OUT/check.json" 2>&1 | tee -a "$OUT/check.log"
status=${PIPESTATUS[0]}
echo "randkv check exit status $status" | tee -a "$OUT/check.log"

# pytest-timeout bounds each test where it is installed; `timeout` bounds each file anyway.
per_test=""
if "$PY" -c "import pytest_timeout" 2>/dev/null; then per_test="--timeout=120"; fi
for file in tests/spec/test_spec.py tests/kernels/test_planner_compactor.py \
    tests/kernels/test_hostsync.py tests/kernels/test_triton_compactor.py \
    tests/kernels/test_triton_planner.py tests/check/test_randkv_check.py; do
  log="$OUT/pytest-$(basename "$file" .py).log"
  echo "== pytest $file (limit ${TEST_LIMIT_S}s)" | tee "$log"
  timeout -k 10 "$TEST_LIMIT_S" "$PY" -m pytest -q -rfEs -p no:cacheprovider $per_test "$file" 2>&1 | tee -a "$log"
  echo "pytest $file exit status ${PIPESTATUS[0]}" | tee -a "$log" "$OUT/pytest-summary.log"
done
exit "$status"
