"""Deterministic tiny random-weight Qwen3 checkpoint for tests and local runs.

The checkpoint is a regular Hugging Face folder (``config.json``, ``model.safetensors``,
byte-level ``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``) that
both Transformers 5.x and vLLM load without network access.  Weights are drawn from a seeded
CPU ``torch.Generator``, so the same parameters always give byte-identical files.

The initialisation is scaled so that greedy decoding depends on the whole context (attention
is sharp and its output is comparable in size to the token embedding) and does not collapse
into a short cycle; see :data:`DEFAULT_PARAMS` for the values.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from randkv.models.cache import default_cache_dir, write_folder_atomically

__all__ = [
    "BUILD_VERSION",
    "CHAT_TEMPLATE",
    "DEFAULT_PARAMS",
    "SPECIAL_TOKENS",
    "build_tiny_checkpoint",
    "default_cache_dir",
    "tiny_checkpoint_params",
    "tiny_checkpoint_path",
]

#: Bump when the generated files change for the same parameters (invalidates cached builds).
BUILD_VERSION = 1

#: Name of the marker file written last; its presence means the folder is complete.
MARKER_FILE = "randkv_tiny.json"

#: Special tokens, in id order, placed after the 256 byte tokens.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|reserved_0|>",
    "<|reserved_1|>",
    "<|reserved_2|>",
)
BOS_ID, EOS_ID, PAD_ID, IM_START_ID, IM_END_ID = 256, 257, 258, 259, 260
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

#: ChatML-style template (messages with string content; optional generation prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Default build parameters (every key may be overridden as a keyword argument).
DEFAULT_PARAMS: dict[str, Any] = {
    "seed": 0,
    "num_layers": 2,
    "hidden_size": 128,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "max_position_embeddings": 32768,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    # Initialisation scales.
    "embed_std": 1.0,  # token embedding entries ~ N(0, embed_std)
    "qk_norm_gain": 2.0,  # q_norm/k_norm weights; sets attention sharpness (Qwen3 has qk-norm)
    "attn_gain": 1.0,  # q/k/v/o ~ N(0, attn_gain / sqrt(fan_in))
    "mlp_gain": 1.0,  # gate/up/down ~ N(0, mlp_gain / sqrt(fan_in))
    "logit_gain": 4.0,  # lm_head ~ N(0, logit_gain / sqrt(hidden)): logits std ~ logit_gain
    # Zero the lm_head rows of all but printable ASCII and "\n", so generated text is readable.
    "printable_output": True,
}


def tiny_checkpoint_params(**overrides: Any) -> dict[str, Any]:
    """Return the full, normalised parameter dict (defaults updated with ``overrides``)."""
    unknown = set(overrides) - set(DEFAULT_PARAMS)
    if unknown:
        raise TypeError(f"unknown tiny checkpoint parameter(s): {sorted(unknown)}")
    params = dict(DEFAULT_PARAMS)
    params.update(overrides)
    for key, default in DEFAULT_PARAMS.items():
        params[key] = type(default)(params[key])
    for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim"):
        if params[key] <= 0:
            raise ValueError(f"{key} must be positive")
    if params["num_heads"] % params["num_kv_heads"]:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    if params["head_dim"] % 2:
        raise ValueError("head_dim must be even (RoPE)")
    return params


def _params_hash(params: Mapping[str, Any]) -> str:
    blob = json.dumps({"version": BUILD_VERSION, **params}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_checkpoint_path(**params: Any) -> Path:
    """Return the default cache folder for these parameters, without building it."""
    full = tiny_checkpoint_params(**params)
    return default_cache_dir() / f"tiny-qwen3-{_params_hash(full)}"


def _is_complete(path: Path, params: Mapping[str, Any]) -> bool:
    marker = path / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return info.get("version") == BUILD_VERSION and info.get("params") == dict(params)


def build_tiny_checkpoint(
    path: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    num_layers: int = 2,
    **params: Any,
) -> Path:
    """Build (or reuse) the tiny checkpoint and return its folder.

    ``path`` defaults to :func:`tiny_checkpoint_path`.  Other keywords override
    :data:`DEFAULT_PARAMS`.  A complete folder with the same parameters is reused as is; the
    files are written into a temporary sibling folder that is renamed into place, so
    concurrent builders never see a partial checkpoint.  An existing non-empty folder built
    with other parameters (or not by this function) raises :class:`FileExistsError`.
    """
    full = tiny_checkpoint_params(seed=seed, num_layers=num_layers, **params)
    target = Path(path) if path is not None else tiny_checkpoint_path(**full)
    return write_folder_atomically(
        target,
        lambda folder: _write_checkpoint(folder, full),
        lambda folder: _is_complete(folder, full),
        occupied_message=f"{target} exists and is not a tiny checkpoint with these params",
    )


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _write_checkpoint(folder: Path, params: Mapping[str, Any]) -> None:
    from safetensors.torch import save_file

    _write_json(folder / "config.json", _model_config(params))
    _write_json(folder / "generation_config.json", _generation_config())
    save_file(_make_weights(params), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "tokenizer.json").write_text(_tokenizer_json())
    _write_json(folder / "tokenizer_config.json", _tokenizer_config())
    _write_json(folder / "special_tokens_map.json", _special_tokens_map())
    # Written last: marks the folder as complete.
    _write_json(folder / MARKER_FILE, {"version": BUILD_VERSION, "params": dict(params)})


def _model_config(p: Mapping[str, Any]) -> dict[str, Any]:
    n_layers = p["num_layers"]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "head_dim": p["head_dim"],
        "hidden_act": "silu",
        "hidden_size": p["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": p["intermediate_size"],
        "layer_types": ["full_attention"] * n_layers,
        "max_position_embeddings": p["max_position_embeddings"],
        "max_window_layers": n_layers,
        "num_attention_heads": p["num_heads"],
        "num_hidden_layers": n_layers,
        "num_key_value_heads": p["num_kv_heads"],
        "rms_norm_eps": p["rms_norm_eps"],
        # Both spellings: Transformers 5 reads rope_parameters; vLLM would otherwise
        # default a missing Qwen3 rope_theta to 1e6 while Transformers uses 1e4.
        "rope_parameters": {"rope_theta": p["rope_theta"], "rope_type": "default"},
        "rope_theta": p["rope_theta"],
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
        "vocab_size": VOCAB_SIZE,
    }


def _generation_config() -> dict[str, Any]:
    return {
        "bos_token_id": BOS_ID,
        "eos_token_id": [EOS_ID, IM_END_ID],
        "pad_token_id": PAD_ID,
        "do_sample": False,
    }


def _make_weights(p: Mapping[str, Any]) -> dict[str, Any]:
    """Draw all tensors in a fixed order from one seeded CPU generator (float32)."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(p["seed"])
    h, d, ff = p["hidden_size"], p["head_dim"], p["intermediate_size"]
    nq, nkv = p["num_heads"], p["num_kv_heads"]

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen, dtype=torch.float32) * std).contiguous()

    def const(n: int, value: float) -> torch.Tensor:
        return torch.full((n,), float(value), dtype=torch.float32)

    attn_std = p["attn_gain"] / math.sqrt(h)
    weights: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": normal(VOCAB_SIZE, h, p["embed_std"]),
    }
    for i in range(p["num_layers"]):
        pre = f"model.layers.{i}."
        weights[pre + "input_layernorm.weight"] = const(h, 1.0)
        weights[pre + "self_attn.q_proj.weight"] = normal(nq * d, h, attn_std)
        weights[pre + "self_attn.k_proj.weight"] = normal(nkv * d, h, attn_std)
        weights[pre + "self_attn.v_proj.weight"] = normal(nkv * d, h, attn_std)
        weights[pre + "self_attn.o_proj.weight"] = normal(
            h, nq * d, p["attn_gain"] / math.sqrt(nq * d)
        )
        weights[pre + "self_attn.q_norm.weight"] = const(d, p["qk_norm_gain"])
        weights[pre + "self_attn.k_norm.weight"] = const(d, p["qk_norm_gain"])
        weights[pre + "post_attention_layernorm.weight"] = const(h, 1.0)
        weights[pre + "mlp.gate_proj.weight"] = normal(ff, h, p["mlp_gain"] / math.sqrt(h))
        weights[pre + "mlp.up_proj.weight"] = normal(ff, h, p["mlp_gain"] / math.sqrt(h))
        weights[pre + "mlp.down_proj.weight"] = normal(h, ff, p["mlp_gain"] / math.sqrt(ff))
    weights["model.norm.weight"] = const(h, 1.0)
    lm_head = normal(VOCAB_SIZE, h, p["logit_gain"] / math.sqrt(h))
    # Zero rows give logit 0, far below the maximum of the other logits (std logit_gain), so
    # greedy decoding never emits them: special tokens (no early EOS) and, with
    # printable_output, bytes other than printable ASCII and newline.
    lm_head[256:] = 0.0
    if p["printable_output"]:
        keep = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
        keep[0x20:0x7F] = True
        keep[0x0A] = True
        lm_head[~keep] = 0.0
    weights["lm_head.weight"] = lm_head
    return weights


# --- tokenizer -----------------------------------------------------------------------------


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2 style reversible map from bytes to printable unicode characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _byte_to_unicode().items()}
    for offset, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = 256 + offset
    bpe = models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    tokenizer.add_special_tokens(special)
    return tokenizer.to_str(pretty=True) + "\n"


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(256 + i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "pad_token": SPECIAL_TOKENS[2],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "chat_template": CHAT_TEMPLATE,
    }


def _special_tokens_map() -> dict[str, str]:
    bos, eos, pad = SPECIAL_TOKENS[:3]
    return {"bos_token": bos, "eos_token": eos, "pad_token": pad}
