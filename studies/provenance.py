"""What every quality result records about where it came from: the model and the machine."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from randkv.bench.timing import cpu_model


def model_record(model_folder: Path) -> dict[str, Any]:
    """The checkpoint's path and its training record (without the loss history)."""
    record = model_folder / "quality_train.json"
    training = None
    if record.is_file():
        training = {k: v for k, v in json.loads(record.read_text()).items() if k != "history"}
    return {"path": str(model_folder), "training": training}


def machine_record(threads: int) -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": cpu_model(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "threads": threads,
    }
