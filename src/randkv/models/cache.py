"""The user cache RandKV builds model folders in, and writing a folder there atomically.

A folder is written into a hidden temporary sibling and renamed into place only once it is
complete, so a crash, a full disk or a concurrent builder never leaves a folder that looks
finished. Each builder says what "complete" means (a marker or provenance file written last).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["default_cache_dir", "write_folder_atomically"]


def default_cache_dir() -> Path:
    """Return the cache root: ``$RANDKV_CACHE``, else ``$XDG_CACHE_HOME/randkv`` or ``~/.cache``."""
    env = os.environ.get("RANDKV_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "randkv"


def write_folder_atomically(
    target: Path,
    write: Callable[[Path], None],
    is_complete: Callable[[Path], bool],
    *,
    occupied_message: str,
) -> Path:
    """Return `target`, calling `write(tmp)` on a temporary sibling and renaming it into place
    unless `target` is already complete.

    A non-empty `target` that is not complete raises FileExistsError(occupied_message): it is
    someone else's folder, or one from an older format, and is never overwritten silently.
    """
    target = target.expanduser().absolute()
    if is_complete(target):
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(occupied_message)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the folder is a shared cache entry
        write(tmp)
        try:
            os.replace(tmp, target)  # atomic; also replaces an empty directory
        except OSError:
            if not is_complete(target):  # not a lost race to an identical build
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
