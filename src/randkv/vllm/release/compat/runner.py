"""Which vLLM model runner RandKV runs on.

vLLM 0.28 and 0.32 ship two model runners, V1 (`vllm.v1.worker.gpu_model_runner`) and V2
(`vllm.v1.worker.gpu.model_runner`), picked from `VLLM_USE_V2_MODEL_RUNNER` and the platform
(V2 by default on CUDA); 0.34 has only V2 and refuses the variable set to anything but 1.
RandKV runs on the runners its release row lists (`randkv.vllm.release.versions`): where that is V1
only (0.28), it asks vLLM for V1; elsewhere it takes vLLM's own choice.
"""

from __future__ import annotations

import os

from randkv.vllm.refusals import UnsupportedModeError
from randkv.vllm.release.versions import SUPPORTED, base_version

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def supported_runners(version: str) -> frozenset[str] | None:
    """The runners RandKV supports on `version` (None: a release outside the table)."""
    rows = [r for r in SUPPORTED if r.version == base_version(version)]
    return frozenset(n for r in rows for n in r.runners) if rows else None


def _installed_version() -> str:
    import vllm

    return str(vllm.__version__)


def ask_for_supported_runner() -> None:
    """Where RandKV supports only V1, make vLLM pick it (or refuse a user's V2 choice).

    The choice is an environment variable read in every engine process, so it is set in
    this process before the engine starts (spawned processes inherit it).
    """
    runners = supported_runners(_installed_version())
    if runners is None or "v2" in runners:
        return
    value = os.environ.get(V2_RUNNER_ENV)
    if value is not None and value.strip().lower() in ("1", "true"):
        raise UnsupportedModeError(
            f"RandKV runs on vLLM {_installed_version()}'s V1 model runner only, but "
            f"{V2_RUNNER_ENV}={value} asks for V2; set {V2_RUNNER_ENV}=0 (or unset it), or "
            "use a vLLM release RandKV supports on V2 (see randkv.vllm.release.versions)"
        )
    os.environ[V2_RUNNER_ENV] = "0"
    from vllm import envs

    # An engine that already ran in this process froze vLLM's environment cache.
    envs.disable_envs_cache()


def check_runner_supported(kind: str) -> None:
    """Refuse a model runner RandKV does not support on the installed release."""
    version = _installed_version()
    runners = supported_runners(version)
    if runners is not None and kind not in runners:
        raise UnsupportedModeError(
            f"RandKV does not support vLLM {version}'s {kind.upper()} model runner (it "
            f"supports {', '.join(sorted(r.upper() for r in runners))} there); set "
            f"{V2_RUNNER_ENV}={'0' if kind == 'v2' else '1'}"
        )
