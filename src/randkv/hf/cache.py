"""`RandKVCache`: a Transformers `Cache` that evicts per the RandKV spec.

Storage. Every layer holds one key and one value tensor of shape (batch, kv_heads, K + 2r,
head_dim). Row b keeps its own request's slots 0 .. length_b - 1 at those indices (slot s of
the spec is index s), whatever the left padding of the input was: padding is never written.
Such a tensor is `KVLayout.BLOCK_HEAD_SLOT` with one block per row, so rounds are applied by
`PagedCompactor` with block_size = K + 2r and block table [[row]].

Timing (the same as the vLLM engine). A round is applied lazily: right before a row's next
token is written, if that row's buffer holds K + 2r tokens. The round index is
`num_rounds(P, tokens_seen) - 1`. The query that produced that token therefore still attended
over all K + 2r tokens. Observers (`slot_positions`, `retained_positions`, `kv`) apply any
pending round first, which changes nothing observable: no attention runs in between.

Attention masks. Rows may hold different numbers of slots (their prompts, hence their rounds,
differ). `begin_step` returns the per-row mask and absolute RoPE positions for the next
forward; `randkv.hf.generate` passes them to the model. Without `begin_step` (inside
`model.generate` or a plain `model(...)` call) the cache serves the standard causal mask through
`get_mask_sizes` / `get_query_offset`, which is exact only when every row holds the same number
of slots: batch size 1, or a batch of equal-length, unpadded prompts. A padded batch is refused
there with a message pointing to `randkv.hf.generate`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

from randkv import spec
from randkv.hf.support import STATE_LAYER_TYPES, check_supported, randkv_layers
from randkv.kernels.compactor import KVLayout, PagedCompactor
from randkv.kernels.planner import to_key_tensor
from randkv.selectors import AttentionStep, RandKV, RoundView, Selector
from randkv.spec.cadence import latest_round_index, physical_lengths
from randkv.spec.config import RandKVConfig
from randkv.spec.rounds import RoundPlan

__all__ = ["RandKVCache", "left_pad", "prompt_rows"]

_PADDED_BATCH_HINT = (
    "rows of this batch hold different numbers of tokens (left padding or different prompt "
    "lengths); the standard causal mask built by model.generate / model(...) cannot express "
    "per-row evictions. Use randkv.hf.generate(model, ...), which passes per-row masks"
)


def prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """The real (unpadded) token ids of each row of a left-padded batch.

    Raises ValueError for right padding, holes in the mask, or an empty row.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2D (batch, seq), got shape {tuple(input_ids.shape)}")
    ids = input_ids.detach().cpu()
    if attention_mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    else:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} does not match input_ids "
                f"shape {tuple(input_ids.shape)}"
            )
        mask = attention_mask.detach().cpu().bool()
    rows = []
    for b in range(ids.shape[0]):
        count = int(mask[b].sum())
        if count == 0:
            raise ValueError(f"row {b} has no tokens (its attention_mask is all zeros)")
        if not bool(mask[b, ids.shape[1] - count :].all()):
            raise ValueError(
                f"row {b} is not left-padded (padding must come first, then the prompt); "
                "set tokenizer.padding_side = 'left'"
            )
        rows.append([int(t) for t in ids[b, ids.shape[1] - count :]])
    return rows


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of a left-padded batch of token rows; `prompt_rows` undoes it."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
        mask[b, width - len(row) :] = 1
    return ids, mask


def _synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so eviction timings measure the work, not the launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Step:
    """One prepared forward: where each new token of each row is written."""

    rows: torch.Tensor  # (n,) row of each real token
    cols: torch.Tensor  # (n,) column of each real token in the model input
    slots: torch.Tensor  # (n,) slot it is written to
    kv_length: int  # slots the attention reads per row (max over rows)
    query_length: int
    start: int | None  # when every column of every row is new and rows are level: first slot
    next_layer: int = 0  # index into the cache's KV layers (those a forward updates)
    on_device: dict[torch.device, tuple[torch.Tensor, ...]] = field(default_factory=dict)

    def indices(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self.on_device:
            self.on_device[device] = tuple(t.to(device) for t in (self.rows, self.cols, self.slots))
        return self.on_device[device]


class _RandKVLayer(CacheLayerMixin):
    """One full-attention layer's buffers; all bookkeeping lives in the owning `RandKVCache`."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: RandKVCache, layer_idx: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx

    @property
    def key_buffer(self) -> torch.Tensor:
        """(batch, kv_heads, K + 2r, head_dim) keys; raises before the first write."""
        if self.keys is None:
            raise RuntimeError(f"layer {self.layer_idx} holds nothing yet")
        return self.keys

    @property
    def value_buffer(self) -> torch.Tensor:
        """(batch, kv_heads, K + 2r, head_dim) values; raises before the first write."""
        if self.values is None:
            raise RuntimeError(f"layer {self.layer_idx} holds nothing yet")
        return self.values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, head_dim = key_states.shape
        capacity = self.owner.config.max_physical_length
        self.device = key_states.device
        # Zeros, not empty: masked slots still enter attention's matmuls as 0 * value.
        self.keys = key_states.new_zeros((batch, heads, capacity, head_dim))
        self.values = value_states.new_zeros((batch, heads, capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.owner.update(key_states, value_states, self.layer_idx, *args, **kwargs)

    def get_mask_sizes(self, query: int | torch.Tensor) -> tuple[int, int]:
        return self.owner.get_mask_sizes(query, self.layer_idx)

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length(self.layer_idx)

    def get_max_length(self) -> int:
        return self.owner.config.max_physical_length

    def get_max_cache_shape(self) -> int:  # transformers < 5.13 name of get_max_length
        return self.owner.config.max_physical_length

    def reset(self) -> None:
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        self.owner.crop(tokens_to_remove)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.owner.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.owner.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.owner.batch_select_indices(indices)


class RandKVCache(Cache):
    """A Transformers cache holding at most K + 2r tokens per (row, layer, KV head).

    Each batch row is one RandKV request with its own request key, prompt length and rounds.
    Decisions are the selector's (by default `randkv.selectors.RandKV`: `randkv.spec`'s, drawn
    by `RoundPlanner`), applied by `PagedCompactor`.

    Mixed models (sliding-window and full-attention layers, e.g. Gemma 3): RandKV bounds the
    full-attention layers; each sliding-window layer keeps Transformers' own
    `DynamicSlidingWindowLayer` (its last W - 1 columns), exactly as without RandKV. The spec's
    `layer` is the model's layer index, as in vLLM.

    Hybrid models (Qwen3-Next's Gated DeltaNet, Nemotron-H's Mamba2 beside full attention):
    each state layer keeps Transformers' own `LinearAttentionLayer` (one fixed-size state per
    row), exactly as without RandKV; RandKV bounds the full-attention layers.

    Args:
        model_or_config: the model (or its config); a decoder whose layers are full attention,
            or full attention mixed with sliding-window attention.
        randkv: the RandKV settings (a RandKVConfig, a dict, or True for defaults).
        request_keys: one key per batch row: an unsigned 64-bit int, or a str (hashed by
            `randkv.request_key_from_text`).
        prompt_lengths: per-row prompt lengths; default: the tokens of each row's first
            forward (the prefill). Give them when the prefill runs in chunks.
        track_positions: keep the slot -> absolute position map of every (row, layer, head)
            (needed by `slot_positions` / `retained_positions`).
        selector: the policy choosing which slots a round empties, on the same cadence
            (a `randkv.selectors.Selector`); None (default) is `RandKV()`, the spec itself.
    """

    #: slot -> absolute position of every (row, layer, head), when `track_positions`.
    _positions: torch.Tensor | None

    def __init__(
        self,
        model_or_config: Any,
        randkv: RandKVConfig | dict[str, Any] | bool,
        *,
        request_keys: Sequence[spec.RequestKey],
        prompt_lengths: Sequence[int] | None = None,
        track_positions: bool = True,
        selector: Selector | None = None,
    ) -> None:
        config = getattr(model_or_config, "config", model_or_config)
        check_supported(config)
        randkv_config = RandKVConfig.coerce(randkv)
        if randkv_config is None:
            raise ValueError("RandKVCache needs a RandKVConfig (randkv=None means no eviction)")
        if isinstance(request_keys, (str, bytes)):
            raise TypeError("request_keys takes one key per batch row (a list), not one str")
        keys = [spec.coerce_request_key(k) for k in request_keys]
        if not keys:
            raise ValueError("request_keys must have one key per batch row; got none")
        selector = RandKV() if selector is None else selector
        if not isinstance(selector, Selector):
            raise TypeError(
                f"selector must be a randkv.selectors.Selector, got {type(selector).__name__}"
            )
        if selector.needs_positions and not track_positions:
            raise ValueError(f"{selector.name} reads slot positions: keep track_positions=True")
        if prompt_lengths is not None:
            if len(prompt_lengths) != len(keys):
                raise ValueError(
                    f"{len(prompt_lengths)} prompt_lengths for {len(keys)} request_keys"
                )
            for length in prompt_lengths:
                if length < 1:
                    raise ValueError(f"prompt lengths must be >= 1, got {length}")
        text = config.get_text_config(decoder=True)
        self.server_config = randkv_config
        # The rows' own config (`RandKVConfig.for_request`), once their prompts are known.
        self.config = randkv_config.with_budget(randkv_config.budget)
        self.num_layers = int(text.num_hidden_layers)  # all of the model's layers
        #: The model's layers RandKV bounds (full attention), in order; the others slide.
        self.layer_ids: tuple[int, ...] = randkv_layers(config)
        self._ordinal = {layer: j for j, layer in enumerate(self.layer_ids)}
        # MLA (DeepSeek-V2/V3 line): one latent row per token, shared by every head, is
        # what Transformers caches: keys the 512-value latent, values the 64 RoPE values.
        # One "KV head" per layer.
        self.num_kv_heads = (
            1
            if getattr(text, "kv_lora_rank", None)
            else int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        )
        self.request_keys = keys
        self.track_positions = track_positions
        self.selector = selector
        self.observing = False  # attention hooks are installed (randkv.hf.attention_hooks)
        self._given_prompts = None if prompt_lengths is None else [int(p) for p in prompt_lengths]
        self._key_tensor = to_key_tensor(keys)
        #: W of the sliding-window layers (None: every layer is full attention).
        self.sliding_window: int | None = None
        layers: list[CacheLayerMixin | LinearAttentionCacheLayerMixin] = []
        kinds = getattr(text, "layer_types", None) or []
        #: The layers whose `update` a forward calls (full and sliding attention), in order.
        self._kv_layer_ids: tuple[int, ...] = tuple(
            i
            for i in range(self.num_layers)
            if i >= len(kinds) or kinds[i] not in STATE_LAYER_TYPES
        )
        for i in range(self.num_layers):
            if i in self._ordinal:
                layers.append(_RandKVLayer(self, i))
                continue
            if i not in self._kv_layer_ids:  # a hybrid's state layer: Transformers' own
                layers.append(LinearAttentionLayer())
                continue
            if self.sliding_window is None:
                window = getattr(text, "sliding_window", None)
                if window is None:
                    raise ValueError(f"layer {i} is not full attention, but no sliding_window")
                self.sliding_window = int(window)
            layers.append(DynamicSlidingWindowLayer(self.sliding_window))
        super().__init__(layers=layers)
        self._reset_state()

    @property
    def _randkv_layers(self) -> list[_RandKVLayer]:
        """The full-attention layers' buffers, in `layer_ids` order."""
        return [self._buffers(i) for i in self.layer_ids]

    def _buffers(self, layer: int) -> _RandKVLayer:
        """The buffers of a full-attention model layer."""
        found = self.layers[layer]
        if not isinstance(found, _RandKVLayer):
            raise TypeError(f"layer {layer} is {type(found).__name__}, not RandKV's")
        return found

    def _window(self, layer: int) -> CacheLayerMixin:
        """Transformers' own cache of a sliding-window model layer."""
        found = self.layers[layer]
        if not isinstance(found, CacheLayerMixin):
            raise TypeError(f"layer {layer} is {type(found).__name__}, not a sliding window")
        return found

    def _attention_layer(self, layer: int) -> int:
        """`layer`, or for a hybrid's state layer the first full-attention layer (Transformers
        asks a cache's layer 0 for mask sizes and sequence length, and layer 0 may be a state
        layer)."""
        if layer in self._kv_layer_ids:
            return layer
        return self.layer_ids[0]

    def _ordinal_of(self, layer: int) -> int:
        """Index of a full-attention model layer among `layer_ids`."""
        if layer in self._ordinal:
            return self._ordinal[layer]
        if 0 <= layer < self.num_layers:
            raise ValueError(
                f"layer {layer} is a sliding-window layer: Transformers' own cache keeps its "
                f"last {self.sliding_window} tokens, RandKV evicts on layers {list(self.layer_ids)}"
            )
        raise ValueError(f"layer {layer} out of range: the model has {self.num_layers} layers")

    def _resolve_budget(self) -> None:
        """Set `config` to the rows' own (long prompts under min_generated raise K); every
        row of one cache must share it, since they share buffers of K + 2r slots."""
        budgets = {self.server_config.request_budget(p) for p in self._prompts if p is not None}
        if len(budgets) > 1:
            raise ValueError(
                f"rows of this batch have different RandKV budgets {sorted(budgets)} (prompts "
                f"longer than K - min_generated get K = P + min_generated); run them in "
                "separate caches (e.g. one row each)"
            )
        if not budgets or budgets == {self.config.budget}:
            return
        if any(layer.is_initialized for layer in self._randkv_layers):
            raise ValueError("RandKVCache: a row's budget changed after its buffers were made")
        self.config = self.server_config.with_budget(budgets.pop())
        if self._positions is not None:
            self._positions = self._new_positions()

    def _new_positions(self) -> torch.Tensor:
        shape = (self.batch_rows, len(self.layer_ids), self.num_kv_heads)
        return torch.full((*shape, self.config.max_physical_length), -1, dtype=torch.int64)

    @property
    def _compactor(self) -> PagedCompactor:
        return PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, self.config.max_physical_length)

    # ----------------------------------------------------------------- construction helpers

    @classmethod
    def from_inputs(
        cls,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        randkv: RandKVConfig | dict[str, Any] | bool,
        request_keys: Sequence[spec.RequestKey] | None = None,
        track_positions: bool = True,
        selector: Selector | None = None,
    ) -> RandKVCache:
        """A cache for this (left-padded) batch: prompt lengths from the mask, and by default
        content request keys (`randkv.request_key_from_content` of each row's prompt ids)."""
        rows = prompt_rows(input_ids, attention_mask)
        if request_keys is None:
            request_keys = [spec.request_key_from_content(row) for row in rows]
        elif len(request_keys) != len(rows):
            raise ValueError(f"{len(request_keys)} request_keys for a batch of {len(rows)} rows")
        return cls(
            model,
            randkv,
            request_keys=request_keys,
            prompt_lengths=[len(row) for row in rows],
            track_positions=track_positions,
            selector=selector,
        )

    def _reset_state(self) -> None:
        batch = len(self.request_keys)
        self._prompts: list[int | None] = (
            list(self._given_prompts) if self._given_prompts else [None] * batch
        )
        self._seen = [0] * batch
        self._length = [0] * batch
        self._columns = 0
        self._step: _Step | None = None
        self._query_slots: torch.Tensor | None = None
        self._statistic: torch.Tensor | None = None  # the selector's, when it reads attention
        self._groups: list[tuple[list[int], torch.device]] | None = None
        # Which input columns of each row were real tokens (the sliding layers keep columns).
        self._column_real = torch.zeros(len(self.request_keys), 0, dtype=torch.bool)
        self._positions = self._new_positions() if self.track_positions else None
        self._resolve_budget()
        self.eviction_seconds = 0.0  # planning + compaction + position tracking
        self.plan_seconds = 0.0
        self.compact_seconds = 0.0
        self.rounds_applied = 0

    # ----------------------------------------------------------------- observability

    @property
    def batch_rows(self) -> int:
        """Number of rows (requests) this cache serves."""
        return len(self.request_keys)

    def tokens_seen(self, row: int) -> int:
        """Tokens of this row written so far (T)."""
        return self._seen[row]

    def prompt_length(self, row: int) -> int | None:
        """The row's prompt length (None before its prefill when not given)."""
        return self._prompts[row]

    def physical_length(self, row: int) -> int:
        """Slots this row occupies per head, as the spec counts them (a due round counted)."""
        return physical_lengths(self.config, self._seen[row])

    def buffer_length(self, row: int) -> int:
        """Slots written in the buffer now (K + 2r while a round is due but not yet applied)."""
        return self._length[row]

    def rounds(self, row: int) -> int:
        """Eviction rounds this row has fired, as the spec counts them."""
        prompt = self._prompts[row]
        if prompt is None:
            return 0
        return spec.num_rounds(self.config, prompt_length=prompt, tokens_seen=self._seen[row])

    def slot_positions(self, row: int, layer: int, kv_head: int) -> tuple[int, ...]:
        """Absolute position held by each slot of one (row, layer, KV head), in slot order."""
        if self._positions is None:
            raise RuntimeError("slot positions are not tracked (track_positions=False)")
        ordinal = self._ordinal_of(layer)
        self.flush()
        return tuple(self._positions[row, ordinal, kv_head, : self._length[row]].tolist())

    def retained_positions(self, row: int, layer: int, kv_head: int) -> tuple[int, ...]:
        """Sorted absolute positions one (row, layer, KV head) retains."""
        return tuple(sorted(self.slot_positions(row, layer, kv_head)))

    @property
    def positions(self) -> torch.Tensor | None:
        """The slot -> absolute position map, (rows, layers, kv_heads, K + 2r) int64, -1 for
        empty slots (None when not tracked); its layers are `layer_ids`. Not flushed: a due
        round is still pending here."""
        return self._positions

    @property
    def column_mask(self) -> torch.Tensor:
        """(rows, input columns so far) bool: which columns were real tokens of each row (the
        sliding-window layers keep columns, pad columns included); recorded for mixed models
        only."""
        return self._column_real

    @property
    def last_query_slots(self) -> torch.Tensor | None:
        """Slot of each query column of the latest forward, (rows, columns) int64, -1 for pad
        columns. Recorded only when the selector reads attention (`needs_attention`)."""
        return self._query_slots

    def kv(self, row: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of one row's cached keys and values, (kv_heads, length, head_dim), slot order
        (full-attention layers only)."""
        self._ordinal_of(layer)
        self.flush()
        buffers = self._buffers(layer)
        length = self._length[row]
        return buffers.key_buffer[row, :, :length], buffers.value_buffer[row, :, :length]

    # ----------------------------------------------------------------- stepping

    def begin_step(self, new_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prepare the next forward, whose input columns are real tokens where `new_tokens` is True.

        new_tokens: (batch, q) bool; each row's real tokens are its next tokens in order (pad
        columns, e.g. left padding, are never written). Returns (allowed, position_ids):
        allowed (batch, 1, q, kv_length) bool says which slots each query may attend to;
        position_ids (batch, q) are absolute positions (tokens seen), 0 for pad columns.
        Both are on CPU; move them to the model's device.
        """
        inputs = self._prepare(new_tokens.detach().to("cpu", torch.bool), want_inputs=True)
        assert inputs is not None
        return inputs

    def _prepare(
        self, real: torch.Tensor, *, want_inputs: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._step is not None:
            raise RuntimeError(
                f"the previous forward stopped after layer {self._step.next_layer - 1} of "
                f"{self.num_layers}; every layer must be updated once per step"
            )
        batch, query_length = real.shape
        if batch != self.batch_rows:
            raise ValueError(
                f"RandKVCache was built for {self.batch_rows} rows (one per request key) but "
                f"the model runs {batch}; beam search and num_return_sequences > 1 are not "
                "supported"
            )
        self.flush()
        counts = real.sum(1).tolist()
        if any(c and p is None for c, p in zip(counts, self._prompts, strict=True)):
            for b, count in enumerate(counts):
                if count and self._prompts[b] is None:
                    self._prompts[b] = count
            self._resolve_budget()
        capacity = self.config.max_physical_length
        for b, count in enumerate(counts):
            if count == 0:
                continue
            if self._length[b] + count > capacity:
                raise ValueError(
                    f"row {b}: {count} new tokens would cross an eviction round (buffer "
                    f"{self._length[b]} of {capacity}); feed at most "
                    f"{capacity - self._length[b]} tokens in this step"
                )
        rank = real.long().cumsum(1) - 1  # index of each real token among its row's new ones
        rows, cols = real.nonzero(as_tuple=True)
        length = torch.tensor(self._length, dtype=torch.int64)
        seen = torch.tensor(self._seen, dtype=torch.int64)
        offsets = rank[rows, cols]
        slots = length[rows] + offsets
        positions = seen[rows] + offsets
        kv_length = max(1, max(self._length[b] + counts[b] for b in range(batch)))
        level = len(set(self._length)) == 1 and all(c == query_length for c in counts)
        inputs = None
        if want_inputs:
            # Query (b, c) sees slots 0 .. length_b + rank; pad columns see slot 0 (never NaN).
            limit = torch.where(real, length[:, None] + rank, 0)
            allowed = torch.arange(kv_length)[None, None, :] <= limit[:, :, None]
            inputs = allowed[:, None], torch.where(real, seen[:, None] + rank, 0)
        if self._positions is not None and rows.numel():
            self._positions[rows, :, :, slots] = positions[:, None, None]
        start = self._length[0] if level else None
        if self.sliding_window is not None:  # only their masks read it
            self._column_real = torch.cat([self._column_real, real], 1)
        for b, count in enumerate(counts):
            self._length[b] += count
            self._seen[b] += count
        self._columns += query_length
        self._step = _Step(rows, cols, slots, kv_length, query_length, start)
        if self.selector.needs_attention:  # maps the columns of attention rows to slots
            self._query_slots = torch.where(real, length[:, None] + rank, -1)
        return inputs

    def _auto_prepare(self, key_states: torch.Tensor, kwargs: dict[str, Any]) -> None:
        """Prepare a step nobody announced: every row gets every column (unpadded batches)."""
        batch, _, query_length, _ = key_states.shape
        if batch != self.batch_rows:
            self._prepare(torch.ones(batch, query_length, dtype=torch.bool), want_inputs=False)
        if len(set(self._length)) > 1 or len(set(self._seen)) > 1:
            raise ValueError(f"RandKVCache: {_PADDED_BATCH_HINT}")
        # Known prompt lengths that differ mean a padded batch (a shorter first forward is
        # just a prefill chunk).
        if self._given_prompts is not None and len(set(self._given_prompts)) > 1:
            raise ValueError(f"RandKVCache: {_PADDED_BATCH_HINT}")
        inner = kwargs.get("kwargs")
        position_ids = (inner if isinstance(inner, dict) else kwargs).get("position_ids")
        if isinstance(position_ids, torch.Tensor) and position_ids.shape[-1] == query_length:
            expected = torch.arange(self._seen[0], self._seen[0] + query_length)
            if not bool((position_ids.detach().cpu() == expected).all()):
                raise ValueError(f"RandKVCache: {_PADDED_BATCH_HINT}")
        self._prepare(torch.ones(batch, query_length, dtype=torch.bool), want_inputs=False)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's new keys/values of one layer; return the slots attention reads."""
        order = self._kv_layer_ids
        if self._step is None:
            if layer_idx != order[0]:
                raise RuntimeError(
                    f"RandKVCache: layer {layer_idx} was updated before layer {order[0]} in "
                    "this step"
                )
            self._auto_prepare(key_states, kwargs)
        step = self._step
        assert step is not None
        if layer_idx != order[step.next_layer]:
            raise RuntimeError(
                f"RandKVCache: expected layer {order[step.next_layer]} next, got layer "
                f"{layer_idx} (layers must be updated once each, in order)"
            )
        if key_states.shape[0] != self.batch_rows or key_states.shape[2] != step.query_length:
            raise ValueError(
                f"RandKVCache: layer {layer_idx} got keys of shape {tuple(key_states.shape)}; "
                f"this step expects ({self.batch_rows}, heads, {step.query_length}, head_dim)"
            )
        if layer_idx not in self._ordinal:  # a sliding-window layer: Transformers' own
            step.next_layer += 1
            if step.next_layer == len(order):
                self._step = None
            return self._window(layer_idx).update(key_states, value_states)
        layer = self._buffers(layer_idx)
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
            self._groups = None
        keys, values = layer.key_buffer, layer.value_buffer
        if step.start is not None:  # every row writes the same slot range
            end = step.start + step.query_length
            keys[:, :, step.start : end] = key_states
            values[:, :, step.start : end] = value_states
        else:
            rows, cols, slots = step.indices(keys.device)
            keys[rows, :, slots] = key_states[rows, :, cols].to(keys.dtype)
            values[rows, :, slots] = value_states[rows, :, cols].to(values.dtype)
        step.next_layer += 1
        if step.next_layer == len(order):
            self._step = None
        return keys[:, :, : step.kv_length], values[:, :, : step.kv_length]

    # ----------------------------------------------------------------- rounds

    def flush(self) -> None:
        """Apply every due round now (rows whose buffer holds K + 2r tokens)."""
        capacity = self.config.max_physical_length
        due = [b for b in range(self.batch_rows) if self._length[b] == capacity]
        if not due:
            return
        if self._step is not None:
            raise RuntimeError("RandKVCache: cannot apply a round in the middle of a forward")
        layers = self._randkv_layers
        if not all(layer.is_initialized for layer in layers):
            raise RuntimeError("RandKVCache: a round is due but some layers hold no keys")
        start = time.perf_counter()
        device = layers[0].key_buffer.device
        view = self._round_view(due, device)
        plan = RoundPlan.of(self.config, self.selector.select(view).to(device))
        _synchronize(device)
        planned = time.perf_counter()
        for layer_ids, group_device in self._layer_groups():
            sub = RoundPlan(
                evicted=plan.evicted[:, layer_ids].to(group_device),
                sources=plan.sources.to(group_device),
            )
            tables = view.rows.to(group_device)[:, None]
            self._compactor.apply(sub, [layers[j].key_buffer for j in layer_ids], tables)
            self._compactor.apply(sub, [layers[j].value_buffer for j in layer_ids], tables)
        _synchronize(device)
        compacted = time.perf_counter()
        self._move_slot_state(view, plan)
        for b in due:
            self._length[b] = self.config.compacted_length
        self.rounds_applied += len(due)
        self.plan_seconds += planned - start
        self.compact_seconds += compacted - planned
        self.eviction_seconds += time.perf_counter() - start

    def _round_view(self, due: list[int], device: torch.device) -> RoundView:
        """What the selector may read about the due rows (gathered copies, not views)."""
        rows = torch.tensor(due, dtype=torch.int64)
        seen = torch.tensor([self._seen[b] for b in due], dtype=torch.int64)
        return RoundView(
            config=self.config,
            rows=rows,
            round_indices=latest_round_index(self.config, seen),
            prompt_lengths=torch.tensor([self._prompts[b] for b in due], dtype=torch.int64),
            request_keys=self._key_tensor[rows],
            layers=self.layer_ids,
            kv_heads=tuple(range(self.num_kv_heads)),
            device=device,
            positions=None if self._positions is None else self._positions[rows],
            attention=None if self._statistic is None else self._statistic[rows],
            keys=self._round_keys(rows) if self.selector.needs_keys else None,
        )

    def _round_keys(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, layers, kv_heads, K + 2r, head_dim) float32 copies of the due rows' keys."""
        return torch.stack(
            [
                layer.key_buffer[rows.to(layer.key_buffer.device)].float().cpu()
                for layer in self._randkv_layers
            ],
            1,
        )

    def _move_slot_state(self, view: RoundView, plan: RoundPlan) -> None:
        """Per-slot state follows the round: positions and the selector's statistic."""
        if self._positions is not None and view.positions is not None:
            self._positions[view.rows] = plan.apply(view.positions, fill=-1)
        if self._statistic is not None and view.attention is not None:
            if self.selector.resets_after_round:
                self._statistic[view.rows] = 0.0
            else:
                self._statistic[view.rows] = plan.apply(view.attention, fill=0.0)

    def observe_attention(self, layer: int, weights: torch.Tensor) -> None:
        """Fold one layer's attention weights of the current forward, (rows, query heads,
        queries, slots), into the selector's per-slot statistic (`attention_hooks` calls it).
        Sliding-window layers' weights are not RandKV's: ignored."""
        if layer not in self._ordinal:
            return
        if self._query_slots is None:
            raise RuntimeError(f"{self.selector.name} does not read attention, or no step ran")
        if self._statistic is None:
            shape = (self.batch_rows, len(self.layer_ids), self.num_kv_heads)
            self._statistic = torch.zeros(*shape, self.config.max_physical_length)
        step = AttentionStep(
            self.config, layer, weights.float().cpu(), self._query_slots, self.num_kv_heads
        )
        self.selector.observe(step, self._statistic[:, self._ordinal[layer]])

    def _layer_groups(self) -> list[tuple[list[int], torch.device]]:
        """Full-attention layers (indices into `layer_ids`) whose buffers share device, shape
        and strides (one compactor call each)."""
        if self._groups is None:
            groups: dict[tuple[torch.device, tuple[int, ...], tuple[int, ...]], list[int]] = {}
            for i, layer in enumerate(self._randkv_layers):
                keys = layer.key_buffer
                key = (keys.device, tuple(keys.shape), keys.stride())
                groups.setdefault(key, []).append(i)
            self._groups = [(ids, key[0]) for key, ids in groups.items()]
        return self._groups

    # ----------------------------------------------------------------- Cache API

    def _uniform_length(self) -> int:
        lengths = {self.physical_length(b) for b in range(self.batch_rows)}
        if len(lengths) > 1:
            raise ValueError(f"RandKVCache: {_PADDED_BATCH_HINT}")
        return lengths.pop()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Input columns processed so far (T for unpadded batches), as `generate` expects."""
        return self._columns

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """Slot of the next query: the physical length once a due round is applied (a
        sliding-window layer: its columns so far)."""
        layer_idx = self._attention_layer(layer_idx)
        if layer_idx not in self._ordinal:  # its columns written so far
            return self._window(layer_idx).get_seq_length()
        return self._uniform_length()

    def get_mask_sizes(self, query: int | torch.Tensor, layer_idx: int = 0) -> tuple[int, int]:
        """(kv_length, kv_offset) of the standard mask; `query` is the query length, or (older
        5.x releases) the tensor of query cache positions."""
        layer_idx = self._attention_layer(layer_idx)
        if layer_idx not in self._ordinal:  # a sliding-window layer: Transformers' own
            # Older 5.x releases take the tensor of query cache positions.
            return self._window(layer_idx).get_mask_sizes(query)  # type: ignore[arg-type]
        query_length = query if isinstance(query, int) else int(query.shape[-1])
        return self._uniform_length() + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.config.max_physical_length

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.config.max_physical_length

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self._reset_state()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "RandKVCache cannot be cropped: evicted tokens are gone (assisted/speculative "
            "decoding is not supported)"
        )

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise ValueError("RandKVCache does not support beam search (num_beams must be 1)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise ValueError(
            "RandKVCache does not support num_return_sequences > 1 or beam search: each row "
            "is one request with its own key"
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise ValueError("RandKVCache rows are requests; selecting rows is not supported")

    def __repr__(self) -> str:
        return (
            f"RandKVCache(budget={self.config.budget}, buffer_size={self.config.buffer_size}, "
            f"seed={self.config.seed}, rows={self.batch_rows}, layers={self.num_layers})"
        )
