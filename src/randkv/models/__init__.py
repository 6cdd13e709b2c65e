"""Model helpers (tiny random-weight checkpoints for tests)."""

from randkv.models.tiny import build_tiny_checkpoint, tiny_checkpoint_path

__all__ = ["build_tiny_checkpoint", "tiny_checkpoint_path"]
