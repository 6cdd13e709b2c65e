"""Finished runs of the real-model study, kept on disk so that an evaluation that stops
part-way (the full default run takes about an hour on two CPU cores)
resumes where it stopped.

Runs are kept per part in a folder named by a fingerprint of everything a run's numbers
depend on: the exact token sequences of the part (so regenerated answers that differ in one
token miss), r, the model folder's provenance, the torch version and thread count, and the
source of the installed `randkv` package (so a code change misses too). A run is reused only
under the same fingerprint; each is written to a temporary file and renamed into place, so a
crash never leaves a half-written run behind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

import randkv
from studies.real.run import ArmScores
from studies.real.traces import Trace

__all__ = ["RunStore", "source_digest"]


@functools.cache  # once per process: the code this process runs is the code it started with
def source_digest() -> str:
    """sha256 over the installed randkv package's Python files (paths and contents)."""
    root = Path(randkv.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class RunStore:
    """Saved `ArmScores` of one part under one fingerprint."""

    def __init__(
        self, root: Path, part: str, traces: Sequence[Trace], *, buffer: int, context: Any
    ) -> None:
        record = {
            "part": part,
            "buffer": buffer,
            "traces": [asdict(t) for t in traces],
            "context": context,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "source": source_digest(),
        }
        blob = json.dumps(record, sort_keys=True, default=str).encode()
        self.folder = Path(root) / f"{part}-{hashlib.sha256(blob).hexdigest()[:20]}"

    def _path(self, name: str, budget: int, seed: int) -> Path:
        return self.folder / f"{name}-K{budget}-seed{seed}.pt"

    def load(self, name: str, budget: int, seed: int) -> ArmScores | None:
        """The saved run, or None when there is none (or it cannot be read)."""
        path = self._path(name, budget, seed)
        if not path.exists():
            return None
        try:
            return ArmScores(**torch.load(path, weights_only=True))
        except Exception:  # an unreadable file is a missing run, made again
            return None

    def save(self, scores: ArmScores, budget: int, seed: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(scores.evictor, budget, seed)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        torch.save({f.name: getattr(scores, f.name) for f in fields(scores)}, tmp)
        os.replace(tmp, path)
