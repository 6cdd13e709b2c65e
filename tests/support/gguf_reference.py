"""A converted shipped model against Transformers' own GGUF loader of its source file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from randkv.models.shipped import model_provenance


def converted_equals_gguf_loader(folder: Path) -> tuple[Any, Any, Any]:
    """Assert that the converted folder gives the GGUF loader's logits exactly; return the
    (converted model, its tokenizer, the GGUF-loaded reference)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(model_provenance(folder)["source"]["path"])
    reference = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("The quick brown fox jumps over the lazy dog", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(converted(ids).logits, reference(ids).logits)
    return converted, tokenizer, reference
