"""The quality benchmark's model: a small Qwen3 decoder with the byte-level tokenizer.

Text is encoded as its UTF-8 bytes (token id = byte value), the same vocabulary as the tiny
test checkpoint (`randkv.models.tiny`), so the saved folder is a regular Hugging Face
checkpoint that Transformers (and vLLM) load offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from randkv.models import tiny

__all__ = [
    "CHECKPOINTS",
    "MODEL_PARAMS",
    "build_model",
    "decode",
    "encode",
    "load_model",
    "model_config",
    "shipped_checkpoint",
    "write_tokenizer_files",
]

#: Architecture of the shipped checkpoint (Qwen3, full attention, GQA with 2 KV heads).
MODEL_PARAMS: dict[str, Any] = {
    **tiny.DEFAULT_PARAMS,
    "num_layers": 3,
    "hidden_size": 128,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "max_position_embeddings": 4096,
}


def encode(text: str) -> list[int]:
    """Token ids of `text` (its UTF-8 bytes)."""
    return list(text.encode())


def decode(ids: list[int]) -> str:
    """Text of byte token ids; special tokens (ids >= 256) are dropped."""
    return bytes(i for i in ids if i < 256).decode(errors="replace")


def model_config(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Transformers config.json dict for these architecture parameters."""
    return tiny._model_config(params or MODEL_PARAMS)


def build_model(seed: int, params: dict[str, Any] | None = None) -> Any:
    """A freshly initialised Qwen3ForCausalLM (float32); the initialisation is seeded."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**model_config(params))
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float()


def write_tokenizer_files(folder: Path) -> None:
    """Byte-level tokenizer files next to a saved model."""
    (folder / "tokenizer.json").write_text(tiny._tokenizer_json())
    for name, obj in (
        ("tokenizer_config.json", tiny._tokenizer_config()),
        ("special_tokens_map.json", tiny._special_tokens_map()),
        ("generation_config.json", tiny._generation_config()),
    ):
        (folder / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


#: Folder of each task's trained checkpoint, beside this file in the checkout.
CHECKPOINTS = {"pointer": "checkpoint", "ledger": "checkpoint_ledger"}


def shipped_checkpoint(task: str = "pointer") -> Path:
    """Folder of the trained checkpoint of `task` ("pointer" or "ledger") in the checkout."""
    if task not in CHECKPOINTS:
        raise ValueError(f"unknown task {task!r}; choose from {list(CHECKPOINTS)}")
    return Path(__file__).resolve().parent / CHECKPOINTS[task]


def load_model(path: str | Path | None = None, *, attn_implementation: str = "eager") -> Any:
    """Load a quality checkpoint (default: the shipped one) in float32, eval mode.

    Eager attention by default: the scored evictors read attention weights, and every evictor
    runs on the same attention path so that only the eviction decisions differ.
    """
    from transformers import AutoModelForCausalLM

    folder = Path(path) if path is not None else shipped_checkpoint()
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"no checkpoint in {folder}; train one with `python -m studies train`"
        )
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=attn_implementation
    )
    return model.eval()
