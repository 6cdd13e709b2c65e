"""Whether RandKV may run on the installed vLLM, and `python -m randkv.vllm.release.support`.

A release in `randkv.vllm.release.versions.SUPPORTED` may. Any other is refused with the
supported releases and the command that installs one; `RANDKV_ALLOW_UNVERIFIED_VLLM=1` lets a
user try it anyway: RandKV then runs the drift check (`randkv.vllm.release.drift`) against it
first, refuses on any difference, and logs a warning (what was checked is not what was
tested). A user never gets plain vLLM where RandKV was asked for, and is never stuck without a
way to try.
"""

from __future__ import annotations

import logging
import os

from randkv.vllm.release.versions import (
    ALLOW_UNVERIFIED_ENV,
    UnsupportedVLLMError,
    base_version,
    install_advice,
    newest,
    refusal_message,
    releases_of,
    supported_versions,
)

logger = logging.getLogger("vllm.randkv.support")


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
            f"randkv.vllm needs vLLM: {newest('cpu').install} (CPU) or "
            "pip install 'randkv[vllm]' (GPU)"
        )
    if releases_of(version):
        return version
    if os.environ.get(ALLOW_UNVERIFIED_ENV, "0").strip().lower() not in ("1", "true", "yes"):
        raise UnsupportedVLLMError(refusal_message(version))
    _check_unverified(version)
    return version


def _check_unverified(version: str) -> None:
    from randkv.vllm.release.drift import drift_problems

    problems = drift_problems()
    if problems:
        listed = "\n  ".join(problems)
        raise UnsupportedVLLMError(
            f"RandKV cannot run on vLLM {version} ({ALLOW_UNVERIFIED_ENV} is set): the vLLM "
            f"internals it relies on differ from what RandKV expects:\n  {listed}\n"
            f"RandKV supports vLLM {', '.join(supported_versions())}; {install_advice()}."
        )
    logger.warning(
        "RandKV runs on vLLM %s, which it does not support (%s is set): the internals it "
        "relies on match, but its decisions were never tested on this release. Supported: %s.",
        version,
        ALLOW_UNVERIFIED_ENV,
        ", ".join(supported_versions()),
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m randkv.vllm.release.support")
    parser.add_argument(
        "--require-installed",
        metavar="VERSION",
        help="exit 1 unless vLLM VERSION is installed and supported (make setup runs this)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    args = parser.parse_args(argv)
    if args.markdown:
        from randkv.vllm.release.versions import markdown_table

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
