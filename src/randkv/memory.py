"""Per-request KV memory of a model, without and with RandKV, read from its config.json.

`randkv memory MODEL_OR_CONFIG` prints what one request holds at a context length, broken
down by the kind of each KV cache group, and how many such requests fit in a memory. Pure
arithmetic on the config's fields: no torch, no vLLM, no Transformers (layer 4, importing
only `randkv.spec`, which validates K and r).

Group kinds and what a request holds in each (block size B, context T tokens):

- "full attention": 2 (K and V) x KV heads x head_dim values per token per layer.
  Plain: ceil(T / B) blocks. RandKV bounds it: ceil(min(T, K + 2r) / B) blocks, the peak just
  before a round (rounds fire at K + 2r and compact to K + r; docs/spec.md, "Cadence").
- "sliding window": the same values per token; vLLM keeps the window, plain or RandKV:
  ceil(min(T, window + B) / B) blocks (the window's tokens plus up to one partial block).
- "state": linear-attention (Gated DeltaNet) or Mamba2 layers hold a fixed-size state per
  request whatever T is (formulas below), plain or RandKV.
- "latent": MLA (DeepSeek-V3) keeps one latent row of kv_lora_rank + qk_rope_head_dim values
  per token per layer, shared by all heads. RandKV bounds it like full attention (K + 2r
  rows, one kept set per layer: docs/spec.md, "MLA").

Config families, told apart by their config.json fields (a multimodal config's
`text_config`, when the top level has no `num_hidden_layers`, is read instead):

- MLA (DeepSeek-V2/V3, Kimi K2): `kv_lora_rank`, `qk_rope_head_dim`, `num_hidden_layers`.
  `first_k_dense_replace` changes the MLP, not the KV; MTP layers
  (`num_nextn_predict_layers`) hold KV only under MTP speculation and are not counted.
  DeepSeek-V3.2's indexer (`index_topk`) keeps another cache and is refused.
- Mamba2 hybrids (Nemotron-H): `hybrid_override_pattern`, one character per layer: "M" a
  Mamba2 layer, "*" an attention layer, "-" (MLP) and "E" (MoE) no cache. Mamba2 fields:
  `mamba_num_heads`, `mamba_head_dim`, `ssm_state_size`, `n_groups`, `conv_kernel`.
- hybrid linear attention (Qwen3-Next): `layer_types` with "linear_attention" and
  "full_attention", or `full_attention_interval` (layer i is full attention when
  (i + 1) % interval == 0); Gated DeltaNet fields `linear_num_key_heads`,
  `linear_num_value_heads`, `linear_key_head_dim`, `linear_value_head_dim`,
  `linear_conv_kernel_dim`.
- sliding-window mixes (gpt-oss, Gemma 3): `layer_types` with "sliding_attention" and
  "full_attention", or Gemma 3's `sliding_window_pattern` (layer i slides unless
  (i + 1) % pattern == 0); the window is `sliding_window`.
- dense GQA (Llama, Qwen2, Qwen3, Mistral): `num_hidden_layers`, `num_key_value_heads`
  (default: `num_attention_heads`, i.e. MHA), `head_dim` (default: `hidden_size` /
  `num_attention_heads`). A `sliding_window` with `use_sliding_window` false (Qwen2/Qwen3)
  is ignored; a `sliding_window` without `layer_types` or a pattern is refused, since the
  config does not say which layers slide.

Attention layers of every family read `num_key_value_heads` and `head_dim` as above
(Nemotron-H also `attention_head_dim`). Anything else raises `ModelConfigError` naming the
config and the field or value it lacks.

State sizes are estimates of vLLM's `MambaSpec` page size per layer (its
`MambaStateShapeCalculator`, tensor parallel size 1), in values:

- Gated DeltaNet: recurrent state num_v_heads * k_dim * v_dim, plus the convolution state
  (conv_kernel - 1) * (num_k_heads * k_dim * 2 + num_v_heads * v_dim).
- Mamba2: SSM state mamba_num_heads * mamba_head_dim * ssm_state_size, plus the convolution
  state (conv_kernel - 1) * (mamba_num_heads * mamba_head_dim + 2 * n_groups *
  ssm_state_size).

vLLM pads a hybrid model's state page up to one attention page and raises the attention
block size until one attention page holds the state (`vllm_hybrid_block_size` estimates it;
544 tokens for Qwen3-Next in bfloat16): pass that as the block size to see vLLM's rounding.
Totals are for the whole model; tensor parallelism splits them across ranks. KV only: no
weights, activations or CUDA graphs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from randkv.spec.config import RandKVConfig

GroupKind = Literal["full attention", "sliding window", "state", "latent"]
#: The kinds in the order tables list them.
GROUP_KINDS: tuple[GroupKind, ...] = ("full attention", "sliding window", "state", "latent")
#: The kinds RandKV bounds at K + 2r tokens.
BOUNDED_KINDS: frozenset[GroupKind] = frozenset({"full attention", "latent"})

#: Bytes per value of the KV (and state) dtypes `--dtype` takes.
DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class ModelConfigError(ValueError):
    """A config.json this module cannot size: its path and what is missing."""


@dataclass(frozen=True)
class KVGroup:
    """Every layer of a model whose cache is of one kind.

    values_per_token: values one layer writes per token (0 for a state group).
    state_values: values of one layer's fixed-size state per request (0 unless "state").
    window: the sliding window in tokens ("sliding window" only).
    detail: the shape, for people (e.g. "8 KV heads x 128").
    """

    kind: GroupKind
    layers: int
    values_per_token: int = 0
    state_values: int = 0
    window: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class ModelKV:
    """A model's KV cache groups, one per kind it has."""

    name: str
    family: str
    groups: tuple[KVGroup, ...]


@dataclass(frozen=True)
class MemorySettings:
    """The context length and cache settings a plan is for; validated on construction."""

    context: int = 32768
    budget: int = 2048
    buffer: int = 64
    block_size: int = 16
    dtype: str = "bfloat16"
    state_dtype: str | None = None  # None: the KV dtype

    def __post_init__(self) -> None:
        for name in ("context", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        RandKVConfig(budget=self.budget, buffer_size=self.buffer)  # K and r as the spec allows
        for dtype in (self.dtype, self.state_dtype):
            if dtype is not None and dtype not in DTYPE_BYTES:
                raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPE_BYTES)}")

    @property
    def peak(self) -> int:
        """K + 2r: the most tokens a bounded group holds, just before a round."""
        return self.budget + 2 * self.buffer

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def state_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.state_dtype or self.dtype]


@dataclass(frozen=True)
class GroupMemory:
    """One group's share of a request: tokens held per layer (block-rounded; None for a
    state group) and bytes over all its layers, plain vLLM and with RandKV."""

    group: KVGroup
    tokens_plain: int | None
    tokens_randkv: int | None
    bytes_plain: int
    bytes_randkv: int


@dataclass(frozen=True)
class MemoryPlan:
    """One request's KV memory, without and with RandKV, and how many fit in `memory`."""

    model: ModelKV
    settings: MemorySettings
    groups: tuple[GroupMemory, ...]
    memory: int | None = None

    @property
    def bytes_plain(self) -> int:
        return sum(g.bytes_plain for g in self.groups)

    @property
    def bytes_randkv(self) -> int:
        return sum(g.bytes_randkv for g in self.groups)

    @property
    def ratio(self) -> float:
        """Plain bytes over RandKV bytes: how many times less KV a request holds."""
        return self.bytes_plain / self.bytes_randkv

    @property
    def requests_plain(self) -> int | None:
        return None if self.memory is None else self.memory // self.bytes_plain

    @property
    def requests_randkv(self) -> int | None:
        return None if self.memory is None else self.memory // self.bytes_randkv


# -- reading config.json ------------------------------------------------------------------


def config_path(model_or_config: str | Path) -> Path:
    """The config.json of a model folder, or the path itself when it names a file."""
    path = Path(model_or_config)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ModelConfigError(f"{model_or_config}: no such model folder or config.json")
    return path


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a dict; a multimodal config's `text_config` when it holds the layers."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelConfigError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path}: not a JSON object")
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, dict):
        return {**text, "model_type": text.get("model_type", config.get("model_type"))}
    return config


def _int(config: Mapping[str, Any], field: str, where: str) -> int:
    """A positive integer field, or an error naming it."""
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        missing = "missing" if value is None else f"not an integer ({value!r})"
        raise ModelConfigError(f"{where}: field {field!r} is {missing}")
    if value < 1:
        raise ModelConfigError(f"{where}: field {field!r} must be positive, got {value}")
    return value


def _num_layers(config: Mapping[str, Any], where: str) -> int:
    return _int(config, "num_hidden_layers", where)


def attention_shape(config: Mapping[str, Any], where: str) -> tuple[int, int]:
    """(KV heads, head_dim) of the attention layers."""
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads")
    kv_heads = _int({"num_key_value_heads": heads}, "num_key_value_heads", where)
    for field in ("head_dim", "attention_head_dim"):
        if config.get(field) is not None:
            return kv_heads, _int(config, field, where)
    hidden = _int(config, "hidden_size", f"{where} (no head_dim)")
    query_heads = _int(config, "num_attention_heads", f"{where} (no head_dim)")
    if hidden % query_heads:
        raise ModelConfigError(
            f"{where}: no head_dim, and hidden_size {hidden} is not a multiple of "
            f"num_attention_heads {query_heads}"
        )
    return kv_heads, hidden // query_heads


def _attention_group(
    kind: GroupKind, layers: int, config: Mapping[str, Any], where: str
) -> KVGroup:
    kv_heads, head_dim = attention_shape(config, where)
    window = _int(config, "sliding_window", where) if kind == "sliding window" else None
    detail = f"{kv_heads} KV heads x {head_dim}"
    return KVGroup(
        kind,
        layers,
        values_per_token=2 * kv_heads * head_dim,
        window=window,
        detail=detail if window is None else f"window {window}; {detail}",
    )


def gated_delta_net_state(config: Mapping[str, Any], where: str) -> KVGroup:
    """One linear-attention layer's state (Qwen3-Next), as the docstring's formula."""
    k_heads = _int(config, "linear_num_key_heads", where)
    v_heads = _int(config, "linear_num_value_heads", where)
    k_dim = _int(config, "linear_key_head_dim", where)
    v_dim = _int(config, "linear_value_head_dim", where)
    kernel = _int(config, "linear_conv_kernel_dim", where)
    conv_dim = k_heads * k_dim * 2 + v_heads * v_dim
    return KVGroup(
        "state",
        1,
        state_values=v_heads * k_dim * v_dim + (kernel - 1) * conv_dim,
        detail=f"Gated DeltaNet {v_heads} x {k_dim} x {v_dim} + conv {kernel - 1} x {conv_dim}",
    )


def mamba2_state(config: Mapping[str, Any], where: str) -> KVGroup:
    """One Mamba2 layer's state (Nemotron-H), as the docstring's formula."""
    heads = _int(config, "mamba_num_heads", where)
    head_dim = _int(config, "mamba_head_dim", where)
    state = _int(config, "ssm_state_size", where)
    groups = _int(config, "n_groups", where)
    kernel = _int(config, "conv_kernel", where)
    conv_dim = heads * head_dim + 2 * groups * state
    return KVGroup(
        "state",
        1,
        state_values=heads * head_dim * state + (kernel - 1) * conv_dim,
        detail=f"Mamba2 {heads} x {head_dim} x {state} + conv {kernel - 1} x {conv_dim}",
    )


def _with_layers(group: KVGroup, layers: int) -> KVGroup:
    return KVGroup(
        group.kind, layers, group.values_per_token, group.state_values, group.window, group.detail
    )


def _kept(groups: list[KVGroup], where: str) -> tuple[KVGroup, ...]:
    """The groups that have layers, in table order; a model without any is refused."""
    kept = tuple(sorted((g for g in groups if g.layers), key=lambda g: GROUP_KINDS.index(g.kind)))
    if not kept:
        raise ModelConfigError(f"{where}: no layer keeps a KV cache or state")
    return kept


def mla_model(name: str, config: Mapping[str, Any], where: str) -> ModelKV:
    if config.get("index_topk") is not None:
        raise ModelConfigError(
            f"{where}: `index_topk` (DeepSeek-V3.2's sparse-attention indexer) keeps a second "
            "cache this command does not size"
        )
    rank = _int(config, "kv_lora_rank", where)
    rope = _int(config, "qk_rope_head_dim", where)
    group = KVGroup(
        "latent",
        _num_layers(config, where),
        values_per_token=rank + rope,
        detail=f"latent {rank} + rope {rope}",
    )
    return ModelKV(name, "MLA", (group,))


def nemotron_h_model(name: str, config: Mapping[str, Any], where: str) -> ModelKV:
    pattern = config["hybrid_override_pattern"]
    if not isinstance(pattern, str) or set(pattern) - set("M*-E"):
        raise ModelConfigError(
            f"{where}: hybrid_override_pattern {pattern!r} must use only M (Mamba2), * "
            "(attention), - (MLP) and E (MoE)"
        )
    layers = config.get("num_hidden_layers", len(pattern))
    if layers != len(pattern):
        raise ModelConfigError(
            f"{where}: hybrid_override_pattern has {len(pattern)} layers, "
            f"num_hidden_layers {layers}"
        )
    groups = []
    if "*" in pattern:
        groups.append(_attention_group("full attention", pattern.count("*"), config, where))
    if "M" in pattern:
        groups.append(_with_layers(mamba2_state(config, where), pattern.count("M")))
    return ModelKV(name, "Mamba2 hybrid", _kept(groups, where))


_LAYER_TYPES: dict[str, str] = {
    "full_attention": "full attention",
    "sliding_attention": "sliding window",
    "linear_attention": "linear",
}


def layer_types(config: Mapping[str, Any], where: str) -> list[str]:
    """Each layer's type as config.json names it (`layer_types` or a pattern field)."""
    layers = _num_layers(config, where)
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ModelConfigError(
                f"{where}: layer_types must list num_hidden_layers ({layers}) layer types"
            )
        unknown = sorted({str(t) for t in types} - set(_LAYER_TYPES))
        if unknown:
            raise ModelConfigError(
                f"{where}: layer type(s) {', '.join(unknown)} not sized by this command "
                f"(it knows {', '.join(_LAYER_TYPES)})"
            )
        return [str(t) for t in types]
    if config.get("full_attention_interval") is not None:
        every = _int(config, "full_attention_interval", where)
        return [
            "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)
        ]
    if config.get("sliding_window_pattern") is not None:
        every = _int(config, "sliding_window_pattern", where)
        return [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)
        ]
    if config.get("sliding_window") is not None and config.get("use_sliding_window") is not False:
        raise ModelConfigError(
            f"{where}: sets sliding_window but neither layer_types nor sliding_window_pattern, "
            "so which layers slide is not in the config; add layer_types"
        )
    return ["full_attention"] * layers


def attention_model(name: str, config: Mapping[str, Any], where: str) -> ModelKV:
    """Dense GQA, sliding-window mixes and hybrid linear attention: by `layer_types`."""
    if config.get("attention_chunk_size") is not None:
        raise ModelConfigError(
            f"{where}: chunked local attention (attention_chunk_size) is not sized by this command"
        )
    types = layer_types(config, where)
    groups = [
        _attention_group("full attention", types.count("full_attention"), config, where),
    ]
    if "sliding_attention" in types:
        groups.append(
            _attention_group("sliding window", types.count("sliding_attention"), config, where)
        )
    if "linear_attention" in types:
        linear = gated_delta_net_state(config, where)
        groups.append(_with_layers(linear, types.count("linear_attention")))
    family = (
        "hybrid linear attention"
        if "linear_attention" in types
        else "sliding-window mix"
        if "sliding_attention" in types
        else "dense attention"
    )
    return ModelKV(name, family, _kept(groups, where))


def model_kv(config: Mapping[str, Any], name: str, where: str = "") -> ModelKV:
    """The KV groups of a parsed config.json (`where` names it in errors)."""
    where = where or name
    if config.get("kv_lora_rank") is not None:
        return mla_model(name, config, where)
    if config.get("hybrid_override_pattern") is not None:
        return nemotron_h_model(name, config, where)
    if "num_hidden_layers" not in config:
        kind = config.get("model_type", "unknown model_type")
        raise ModelConfigError(
            f"{where} ({kind}): field 'num_hidden_layers' is missing; known families: dense "
            "attention, sliding-window mixes, hybrid linear attention (Qwen3-Next), Mamba2 "
            "hybrids (Nemotron-H), MLA (DeepSeek-V3)"
        )
    return attention_model(name, config, where)


def load_model(model_or_config: str | Path) -> ModelKV:
    """The KV groups of a model folder or config.json, named after its folder."""
    path = config_path(model_or_config)
    return model_kv(read_config(path), path.parent.name or str(path), str(path))


# -- the arithmetic ------------------------------------------------------------------------


def tokens_in_blocks(tokens: int, block_size: int) -> int:
    """Tokens of the whole blocks that hold `tokens`."""
    return math.ceil(tokens / block_size) * block_size


def group_tokens(group: KVGroup, settings: MemorySettings) -> tuple[int | None, int | None]:
    """(plain, RandKV) tokens one layer of `group` holds at the context length."""
    block, context = settings.block_size, settings.context
    if group.kind == "state":
        return None, None
    if group.kind == "sliding window":
        assert group.window is not None
        held = tokens_in_blocks(min(context, group.window + block), block)
        return held, held
    plain = tokens_in_blocks(context, block)
    return plain, tokens_in_blocks(min(context, settings.peak), block)


def group_memory(group: KVGroup, settings: MemorySettings) -> GroupMemory:
    plain, randkv = group_tokens(group, settings)
    if plain is None or randkv is None:
        state = group.layers * group.state_values * settings.state_dtype_bytes
        return GroupMemory(group, None, None, state, state)
    per_token = group.layers * group.values_per_token * settings.dtype_bytes
    return GroupMemory(group, plain, randkv, plain * per_token, randkv * per_token)


def plan_memory(model: ModelKV, settings: MemorySettings, memory: int | None = None) -> MemoryPlan:
    """One request's KV, without and with RandKV; requests that fit in `memory` bytes."""
    if memory is not None and memory < 1:
        raise ValueError(f"memory must be positive, got {memory}")
    groups = tuple(group_memory(g, settings) for g in model.groups)
    return MemoryPlan(model, settings, groups, memory)


def vllm_hybrid_block_size(
    model: ModelKV, settings: MemorySettings, alignment: int = 16
) -> int | None:
    """The attention block size vLLM picks so one attention page holds a layer's state
    (hybrid models only; an estimate: the alignment depends on the attention backend)."""
    states = [g for g in model.groups if g.kind == "state"]
    attention = [g for g in model.groups if g.kind in ("full attention", "sliding window")]
    if not states or not attention:
        return None
    state_page = max(g.state_values for g in states) * settings.state_dtype_bytes
    token_page = max(g.values_per_token for g in attention) * settings.dtype_bytes
    return alignment * math.ceil(state_page / (alignment * token_page))


def parse_size(text: str) -> int:
    """Bytes from "80GiB", "80 GB", "512MiB" or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"memory {text!r}: expected a size such as 80GiB, 80GB or 1024MiB")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"memory {text!r} must be positive")
    return size


def format_bytes(size: int) -> str:
    """Binary units, two decimals: 8.00 GiB, 544.00 MiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} B"


# -- output --------------------------------------------------------------------------------


def notes(plan: MemoryPlan) -> list[str]:
    """What a reader must know about this plan's numbers."""
    kinds = {g.group.kind for g in plan.groups}
    lines = []
    if "latent" in kinds:
        lines.append(
            "latent: one row per token shared by every head; RandKV keeps K + 2r rows per "
            "layer, one kept set for all of the layer's heads"
        )
    if "state" in kinds:
        lines.append(
            "state: estimated from vLLM's state shapes; the same with or without RandKV (one "
            "state per request, however long)"
        )
        block = vllm_hybrid_block_size(plan.model, plan.settings)
        if block is not None and block != plan.settings.block_size:
            lines.append(
                f"vLLM raises this model's attention block size to about {block} tokens to "
                f"fit one state per page: --block-size {block} shows its rounding"
            )
    return lines


def _row(cells: list[str], widths: list[int]) -> str:
    """Text columns (group, shape) to the left, numbers to the right."""
    return "  ".join(
        cell.ljust(width) if column in (0, 2) else cell.rjust(width)
        for column, (cell, width) in enumerate(zip(cells, widths, strict=True))
    ).rstrip()


def format_plan(plan: MemoryPlan) -> str:
    """The table `randkv memory` prints."""
    s = plan.settings
    state_dtype = f", state {s.state_dtype}" if s.state_dtype else ""
    lines = [
        f"{plan.model.name}: {plan.model.family}",
        f"context {s.context} tokens; RandKV K={s.budget}, r={s.buffer} (peak K+2r = {s.peak});"
        f" block {s.block_size}; {s.dtype} KV{state_dtype}",
        "",
    ]
    header = ["group", "layers", "shape", "tokens plain", "tokens RandKV", "plain", "RandKV"]
    rows = [
        [
            g.group.kind,
            str(g.group.layers),
            g.group.detail,
            "state" if g.tokens_plain is None else str(g.tokens_plain),
            "state" if g.tokens_randkv is None else str(g.tokens_randkv),
            format_bytes(g.bytes_plain),
            format_bytes(g.bytes_randkv),
        ]
        for g in plan.groups
    ]
    total = ["total per request", "", "", "", "", format_bytes(plan.bytes_plain)]
    rows.append([*total, format_bytes(plan.bytes_randkv)])
    if plan.memory is not None:
        fits = [f"requests in {format_bytes(plan.memory)}", "", "", "", ""]
        rows.append([*fits, str(plan.requests_plain), str(plan.requests_randkv)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines += [_row(header, widths), *(_row(r, widths) for r in rows), ""]
    lines.append(f"RandKV holds {plan.ratio:.2f}x less KV per request")
    lines += [f"note: {line}" for line in notes(plan)]
    return "\n".join(lines)


def plan_to_json(plan: MemoryPlan) -> dict[str, Any]:
    """The plan as plain JSON values (exact bytes)."""
    s = plan.settings
    return {
        "model": plan.model.name,
        "family": plan.model.family,
        "context": s.context,
        "budget": s.budget,
        "buffer": s.buffer,
        "block_size": s.block_size,
        "dtype": s.dtype,
        "state_dtype": s.state_dtype or s.dtype,
        "groups": [
            {
                "kind": g.group.kind,
                "layers": g.group.layers,
                "detail": g.group.detail,
                "window": g.group.window,
                "values_per_token": g.group.values_per_token,
                "state_values": g.group.state_values,
                "tokens_plain": g.tokens_plain,
                "tokens_randkv": g.tokens_randkv,
                "bytes_plain": g.bytes_plain,
                "bytes_randkv": g.bytes_randkv,
            }
            for g in plan.groups
        ],
        "bytes_plain": plan.bytes_plain,
        "bytes_randkv": plan.bytes_randkv,
        "ratio": plan.ratio,
        "memory": plan.memory,
        "requests_plain": plan.requests_plain,
        "requests_randkv": plan.requests_randkv,
        "vllm_hybrid_block_size": vllm_hybrid_block_size(plan.model, s),
        "notes": notes(plan),
    }
