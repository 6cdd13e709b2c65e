"""Tiny random-weight checkpoints of the model families RandKV serves beyond dense GQA:
hybrid linear-attention models (Qwen3-Next: Gated DeltaNet beside full attention; Nemotron-H:
Mamba2 beside full attention), for tests and local runs.

Each is built with Transformers' own model class from a small config, then its weights are
redrawn from one seeded generator at scales where greedy decoding depends on the whole
context (Transformers' default initialisation gives near-uniform logits: a model whose output
ignores its input, useless as a test oracle). The tokenizer is the tiny Qwen3 checkpoint's
byte-level one (`randkv.models.tiny`). Sizes are the smallest vLLM's CPU kernels take:
Qwen3-Next's Gated DeltaNet runs in bfloat16 only, with head dims of 128.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from randkv.models.cache import default_cache_dir, write_folder_atomically
from randkv.models.tiny import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    VOCAB_SIZE,
    _generation_config,
    _special_tokens_map,
    _tokenizer_config,
    _tokenizer_json,
    _write_json,
)

__all__ = ["FAMILIES", "build_tiny_family_checkpoint"]

#: Bump when the generated files change for the same family (invalidates cached builds).
BUILD_VERSION = 1
MARKER_FILE = "randkv_tiny_family.json"


def _qwen3_next_config(num_layers: int) -> dict[str, Any]:
    # Every fourth layer full attention, as the real models (3 Gated DeltaNet : 1 full).
    layer_types = [
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)
    ]
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": num_layers,
        "layer_types": layer_types,
        # Four KV heads of 128: vLLM raises the block size to 64 tokens so a Gated DeltaNet
        # state fits one block's page (with one head, 160: prompts that long for a prefix
        # hit leave little for rounds to evict under a small K).
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "partial_rotary_factor": 0.25,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 1,
        # vLLM's Qwen3-Next needs at least one MoE layer.
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def _nemotron_h_config(num_layers: int) -> dict[str, Any]:
    # Mamba2, attention, MLP repeated: no more attention layers than Mamba2 ones, so vLLM
    # makes one full-attention KV cache group.
    kinds = ("linear_attention", "full_attention", "mlp")
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 128,
        "layers_block_type": [kinds[i % 3] for i in range(num_layers)],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "intermediate_size": 256,
        "mlp_hidden_act": "relu2",
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "n_groups": 1,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "chunk_size": 128,
        "expand": 1,
        "mamba_ssm_cache_dtype": "float32",
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": 32768,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def _deepseek_v3_config(num_layers: int) -> dict[str, Any]:
    # MLA at DeepSeek's real latent sizes (512 + 64: vLLM's CPU MLA kernel takes no other);
    # every layer dense (first_k_dense_replace covers them all): no MoE to build.
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "n_routed_experts": 2,
        "n_shared_experts": 1,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": num_layers,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_theta": 10000.0,
        "rope_interleave": True,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


@dataclass(frozen=True)
class TinyFamily:
    """How to build one family's tiny checkpoint.

    embed_std: the token embeddings' scale. Where it is too large beside what the mixers add
    to the residual stream, the next token is a function of the current one and greedy
    decoding falls into short cycles (Qwen3-Next at 1.0).
    qk_norm_weight: the attention's query/key norm weights (None: Transformers' own). They set
    how sharply attention picks keys; Qwen3-Next's zero-centred norms (gain 1 + weight) at
    their default 0 leave its one full-attention layer too flat to matter: greedy tokens
    then barely depend on which keys are kept, and a test of evictions could not fail.
    projection_gains: (name suffix, gain) pairs: those weights are scaled after the redraw;
    DeepSeek's query and latent up-projections at 3x make its MLA attention sharp enough
    (at 1x greedy decoding cycles through a handful of tokens)."""

    make_config: Callable[[int], dict[str, Any]]
    num_layers: int
    dtype: str
    embed_std: float = 1.0
    qk_norm_weight: float | None = None
    projection_gains: tuple[tuple[str, float], ...] = ()


FAMILIES: dict[str, TinyFamily] = {
    "qwen3_next": TinyFamily(_qwen3_next_config, 4, "bfloat16", embed_std=0.3, qk_norm_weight=2.0),
    "nemotron_h": TinyFamily(_nemotron_h_config, 6, "float32"),
    "deepseek_v3": TinyFamily(
        _deepseek_v3_config,
        2,
        "float32",
        projection_gains=(("q_proj.weight", 3.0), ("kv_b_proj.weight", 3.0)),
    ),
}


def tiny_family_path(family: str, num_layers: int, seed: int) -> Path:
    blob = json.dumps(
        {"version": BUILD_VERSION, "family": family, "layers": num_layers, "seed": seed},
        sort_keys=True,
    )
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return default_cache_dir() / f"tiny-{family.replace('_', '-')}-{digest}"


def build_tiny_family_checkpoint(
    family: str,
    *,
    num_layers: int | None = None,
    seed: int = 0,
    path: str | os.PathLike[str] | None = None,
) -> Path:
    """Build (or reuse) a tiny `family` checkpoint (a key of `FAMILIES`) and return its
    folder. A complete folder with the same parameters is reused."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    layers = num_layers or spec.num_layers
    params = {"version": BUILD_VERSION, "family": family, "layers": layers, "seed": seed}
    target = Path(path) if path is not None else tiny_family_path(family, layers, seed)

    def complete(folder: Path) -> bool:
        marker = folder / MARKER_FILE
        return marker.is_file() and json.loads(marker.read_text()) == params

    def write(folder: Path) -> None:
        _write_model(folder, spec, spec.make_config(layers), seed)
        _write_json(folder / "generation_config.json", _generation_config())
        (folder / "tokenizer.json").write_text(_tokenizer_json())
        _write_json(folder / "tokenizer_config.json", _tokenizer_config())
        _write_json(folder / "special_tokens_map.json", _special_tokens_map())
        _write_json(folder / MARKER_FILE, params)

    return write_folder_atomically(
        target, write, complete, occupied_message=f"{target} exists and is not this checkpoint"
    )


def _write_model(
    folder: Path, family: TinyFamily, config_dict: Mapping[str, Any], seed: int
) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config_dict)
    model_type = fields.pop("model_type")
    fields.update(
        vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID
    )
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _redraw_weights(model, seed, family)
    model.to(getattr(torch, family.dtype)).save_pretrained(folder)


def _redraw_weights(model: Any, seed: int, family: TinyFamily) -> None:
    """Weights at scales where the next token depends on the context: embeddings of unit
    size, projections that keep activations at unit size, logits with a spread of about 4.
    Norm weights (but the attention's query/key norms, `TinyFamily.qk_norm_weight`),
    Mamba/DeltaNet decay and step parameters keep Transformers' values."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("embed_tokens.weight"):
                param.copy_(torch.randn(param.shape, generator=gen) * family.embed_std)
            elif name == "lm_head.weight":
                logits = torch.randn(param.shape, generator=gen) * (4.0 / math.sqrt(hidden))
                logits[256:] = 0.0  # never the special tokens: no early end of sequence
                printable = torch.zeros(param.shape[0], dtype=torch.bool)
                printable[0x20:0x7F] = True
                printable[0x0A] = True
                logits[~printable] = 0.0
                param.copy_(logits)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                if family.qk_norm_weight is not None:
                    param.fill_(family.qk_norm_weight)
            elif param.dim() == 2 and "gate.weight" not in name:
                fan_in = param.shape[1]
                param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(fan_in))
                for suffix, gain in family.projection_gains:
                    if name.endswith(suffix):
                        param.mul_(gain)
