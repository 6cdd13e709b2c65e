"""Decode loops over `RandKVCache` with explicit per-row masks and absolute positions.

`generate` is the one-call entry point for batches (left padding allowed: every row is its
own request). `reference_decode` and `teacher_forced_logprobs` are the batch-1 float32 oracles
the vLLM engine is compared against.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.masking_utils import create_sliding_window_causal_mask

from randkv import spec
from randkv.hf.cache import RandKVCache, prompt_rows
from randkv.hf.hooks import attention_hooks
from randkv.hf.support import STATE_LAYER_TYPES, check_supported
from randkv.spec.config import RandKVConfig

__all__ = [
    "TeacherForced",
    "forced_decode",
    "generate",
    "reference_decode",
    "teacher_forced_logprobs",
]

# Keyword arguments `generate` understands (besides randkv/request_keys/generator).
SUPPORTED_GENERATE_KWARGS = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "eos_token_id",
        "pad_token_id",
        "num_beams",
        "num_return_sequences",
        "use_cache",
    }
)


class TeacherForced(NamedTuple):
    """Log-probabilities of a teacher-forced continuation (float32, on CPU)."""

    logprobs: torch.Tensor  # (steps, vocab): full log-prob vector before each forced token
    token_logprobs: torch.Tensor  # (steps,): log-prob of each forced token


def forward_kwargs(model: Any) -> tuple[str, bool]:
    """The forward's cache keyword (5.x renamed past_key_values) and logits_to_keep support."""
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    return cache_kw, "logits_to_keep" in params


def attention_mask_for(model: Any, allowed: torch.Tensor) -> torch.Tensor:
    """The 4D mask in the form the model's attention implementation takes."""
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl == "sdpa":
        return allowed
    if impl == "eager":
        dtype = model.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min
        )
    raise ValueError(
        f"randkv.hf needs attn_implementation 'sdpa' or 'eager' for per-row masks, got {impl!r}; "
        "load the model with attn_implementation='sdpa'"
    )


def step_attention_mask(
    model: Any,
    cache: RandKVCache,
    ids: torch.Tensor,
    allowed: torch.Tensor,
    real: torch.Tensor | None = None,
) -> Any:
    """This step's mask over `cache` (after `begin_step` gave `allowed`); a mixed or hybrid
    model gets one per layer type: RandKV's on the full layers; for the sliding-window layers
    the mask Transformers builds for its own window cache, over input columns (pad columns
    included, masked); for a hybrid's state layers the step's 2D padding mask (`real`: which
    of this step's columns are real tokens; None when all are), which keeps pad columns out
    of their recurrent states."""
    device = model.device
    mask = attention_mask_for(model, allowed.to(device))
    text = model.config.get_text_config(decoder=True)
    state_kinds = set(getattr(text, "layer_types", None) or ()) & STATE_LAYER_TYPES
    if cache.sliding_window is None and not state_kinds:
        return mask
    masks: dict[str, Any] = {"full_attention": mask}
    if cache.sliding_window is not None:
        shape_only = torch.empty(*ids.shape, 1, dtype=model.dtype, device=device)
        columns = cache.column_mask.to(device)
        # Positional: the cache argument's name changed within 5.x (past_key_values, cache).
        masks["sliding_attention"] = create_sliding_window_causal_mask(
            text, shape_only, columns, cache
        )
    padding = None
    if real is not None and not bool(real.all()):
        padding = real.to(device=device, dtype=torch.long)
    for kind in state_kinds:
        masks[kind] = padding
    return masks


class _Session:
    """Feeds tokens to a model over one cache; returns last-column float32 logits."""

    def __init__(self, model: Any, cache: RandKVCache | DynamicCache) -> None:
        self.model = model
        self.cache = cache
        self.device = model.device
        self.cache_kw, self.keep = forward_kwargs(model)
        self.columns = 0

    def forward(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.device)
        kwargs: dict[str, Any] = {self.cache_kw: self.cache, "use_cache": True}
        if self.keep:
            kwargs["logits_to_keep"] = 1
        if isinstance(self.cache, RandKVCache):
            allowed, positions = self.cache.begin_step(real)
            kwargs["attention_mask"] = step_attention_mask(
                self.model, self.cache, ids, allowed, real
            )
            kwargs["position_ids"] = positions.to(self.device)
        else:  # dense batch-1 reference: plain causal attention
            q = ids.shape[1]
            kwargs["position_ids"] = torch.arange(
                self.columns, self.columns + q, device=self.device
            )[None]
        self.columns += ids.shape[1]
        out = self.model(input_ids=ids, **kwargs)
        return out.logits[:, -1].to(torch.float32)


def _resolve_generation_config(
    model: Any, generation_config: GenerationConfig | None, kwargs: dict[str, Any]
) -> GenerationConfig:
    unknown = set(kwargs) - SUPPORTED_GENERATE_KWARGS
    if unknown:
        raise TypeError(
            f"randkv.hf.generate does not support {sorted(unknown)}; "
            f"supported: {sorted(SUPPORTED_GENERATE_KWARGS)}"
        )
    base = generation_config if generation_config is not None else model.generation_config
    config = copy.deepcopy(base)
    for key, value in kwargs.items():
        setattr(config, key, value)
    if (config.num_beams or 1) > 1:
        raise ValueError(
            f"RandKV does not support beam search (num_beams={config.num_beams}); "
            "use greedy decoding or sampling"
        )
    if (config.num_return_sequences or 1) > 1:
        raise ValueError(
            f"RandKV does not support num_return_sequences={config.num_return_sequences}: each "
            "row is one request; repeat the prompt with its own request key instead"
        )
    if config.use_cache is False:
        raise ValueError("RandKV is a KV cache: use_cache=False makes no sense here")
    return config


def _logits_processors(config: GenerationConfig) -> LogitsProcessorList:
    """The subset of Transformers' processors we support, in Transformers' order."""
    processors = LogitsProcessorList()
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=config.repetition_penalty))
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            processors.append(TopKLogitsWarper(top_k=config.top_k))
        if config.top_p is not None and config.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=config.top_p))
        if config.min_p is not None:
            processors.append(MinPLogitsWarper(min_p=config.min_p))
    return processors


def _token_ids(value: int | Sequence[int] | torch.Tensor | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def generate(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    randkv: RandKVConfig | dict[str, Any] | bool | None,
    request_keys: Sequence[spec.RequestKey] | None = None,
    generation_config: GenerationConfig | None = None,
    generator: torch.Generator | None = None,
    cache: RandKVCache | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Generate with RandKV eviction; returns (batch, prompt columns + new tokens) like
    `model.generate`.

    Each row of the (left-padded) batch is one request with its own prompt length, request
    key (an int or a str; default: `randkv.request_key_from_content` of the row's prompt ids)
    and rounds.
    Greedy or sampling (`do_sample`, `temperature`, `top_k`, `top_p`, `min_p`,
    `repetition_penalty`), with defaults from the model's generation config; `generator`
    seeds sampling (else torch's global RNG). Rows that emit an EOS token continue with the pad
    token; decoding stops when every row has finished. randkv=None runs plain `model.generate`.

    `cache` may be a fresh `RandKVCache` built for this batch (e.g. `RandKVCache.from_inputs`,
    to inspect retained positions or eviction timings afterwards, or with another
    `selector`); randkv is then ignored. A selector that reads attention gets it through
    `randkv.hf.attention_hooks` (the model must use eager attention).
    """
    if cache is None:
        if randkv is None or randkv is False:
            if request_keys is not None:
                raise ValueError("request_keys need randkv=...; randkv=None runs dense generation")
            dense: torch.Tensor = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                **kwargs,
            )
            return dense
        check_supported(model.config)
        cache = RandKVCache.from_inputs(
            model, input_ids, attention_mask, randkv=randkv, request_keys=request_keys
        )
    else:
        rows = prompt_rows(input_ids, attention_mask)
        if request_keys is not None:
            raise ValueError("pass request_keys to the RandKVCache, not with cache=")
        if cache.batch_rows != len(rows) or any(
            cache.tokens_seen(b) for b in range(cache.batch_rows)
        ):
            raise ValueError(
                f"cache= must be a fresh RandKVCache for {len(rows)} rows; got {cache!r} "
                "that already holds tokens or has another batch size"
            )
        if any(cache.prompt_length(b) not in (None, len(row)) for b, row in enumerate(rows)):
            raise ValueError("cache= was built for other prompt lengths than this batch")
        check_supported(model.config)
    config = _resolve_generation_config(model, generation_config, kwargs)
    max_new = config.max_new_tokens
    if max_new is None:
        max_new = max(0, (config.max_length or 20) - input_ids.shape[1])
    processors = _logits_processors(config)
    eos = _token_ids(config.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    batch = input_ids.shape[0]
    real = (
        torch.ones_like(input_ids, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.to(torch.bool)
    )
    session = _Session(model, cache)
    sequences = input_ids.to(session.device)
    eos_t = torch.tensor(eos, dtype=sequences.dtype, device=session.device)
    unfinished = torch.ones(batch, dtype=torch.bool, device=session.device)
    step_ids, step_real = sequences, real
    with attention_hooks(model, cache), torch.inference_mode():
        for step in range(max_new):
            logits = session.forward(step_ids, step_real)
            # Transformers annotates the legacy LongTensor / FloatTensor types; any tensor works.
            scores = processors(sequences, logits)  # type: ignore[arg-type]
            if config.do_sample:
                probs = torch.softmax(scores, dim=-1)
                next_tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            else:
                next_tokens = torch.argmax(scores, dim=-1)
            next_tokens = torch.where(unfinished, next_tokens, pad)
            sequences = torch.cat([sequences, next_tokens[:, None]], dim=-1)
            if eos:
                unfinished &= ~torch.isin(next_tokens, eos_t)
                if not bool(unfinished.any()):
                    break
            if step + 1 < max_new:
                step_ids = next_tokens[:, None]
                step_real = torch.ones(batch, 1, dtype=torch.bool)
    return sequences


def forced_decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    forced: torch.Tensor,
    *,
    cache: RandKVCache,
    on_step: Callable[[int, RandKVCache], None] | None = None,
) -> torch.Tensor:
    """Decode `forced.shape[1]` tokens per row over `cache`: where `forced` (batch, steps) is
    >= 0 that token is written, where it is -1 the greedy token is; returns the new tokens.

    For tasks whose text is partly dictated (a schedule) and partly answered by the model,
    every written token goes through the cache's rounds. `on_step(step, cache)` runs after
    each forward, before the step's token is chosen (the cache then holds what the model saw).
    Attention-reading selectors get their weights as in `generate`.
    """
    rows = prompt_rows(input_ids, attention_mask)
    if cache.batch_rows != len(rows) or any(cache.tokens_seen(b) for b in range(len(rows))):
        raise ValueError("cache must be a fresh RandKVCache for this batch")
    real = (
        torch.ones_like(input_ids, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.to(torch.bool)
    )
    session = _Session(model, cache)
    out = torch.empty(forced.shape, dtype=torch.long)
    step_ids, step_real = input_ids.to(session.device), real
    with attention_hooks(model, cache), torch.inference_mode():
        for step in range(forced.shape[1]):
            logits = session.forward(step_ids, step_real)
            if on_step is not None:
                on_step(step, cache)
            greedy = torch.argmax(logits, dim=-1).cpu()
            column = forced[:, step]
            out[:, step] = torch.where(column >= 0, column, greedy)
            step_ids = out[:, step : step + 1].to(session.device)
            step_real = torch.ones(len(rows), 1, dtype=torch.bool)
    return out


def _single_row_cache(
    model: Any,
    prompt_ids: Sequence[int],
    randkv: RandKVConfig | dict[str, Any] | bool | None,
    request_key: spec.RequestKey | None,
) -> RandKVCache | DynamicCache:
    check_supported(model.config)
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    config = RandKVConfig.coerce(randkv)
    if config is None:
        return DynamicCache(config=model.config)
    if request_key is None:
        request_key = spec.request_key_from_content(prompt_ids)
    return RandKVCache(model, config, request_keys=[request_key], prompt_lengths=[len(prompt_ids)])


def reference_decode(
    model: Any,
    prompt_ids: Sequence[int],
    *,
    randkv: RandKVConfig | dict[str, Any] | bool | None,
    request_key: spec.RequestKey | None = None,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
) -> tuple[list[int], list[float]]:
    """Greedy float32 batch-1 decode: (tokens, log-prob of each chosen token).

    The oracle for the engine: same evictions as RandKV with this request key (an int or a
    str; default: the content key of `prompt_ids`); randkv=None decodes densely. Never stops
    early unless `eos_token_id` is given (the EOS token is then included).
    """
    if model.dtype != torch.float32:
        raise ValueError(
            f"reference_decode runs in float32; the model is {model.dtype} "
            "(load it with dtype=torch.float32)"
        )
    session = _Session(model, _single_row_cache(model, prompt_ids, randkv, request_key))
    stop = set(_token_ids(eos_token_id))
    tokens: list[int] = []
    logprobs: list[float] = []
    step_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logp = torch.log_softmax(session.forward(step_ids, _all_real(step_ids)), dim=-1)[0]
            token = int(torch.argmax(logp))
            tokens.append(token)
            logprobs.append(float(logp[token]))
            if token in stop:
                break
            step_ids = torch.tensor([[token]], dtype=torch.long)
    return tokens, logprobs


def teacher_forced_logprobs(
    model: Any,
    prompt_ids: Sequence[int],
    forced_tokens: Sequence[int],
    *,
    randkv: RandKVConfig | dict[str, Any] | bool | None,
    request_key: spec.RequestKey | None = None,
) -> TeacherForced:
    """Feed `forced_tokens` after the prompt one at a time (with RandKV's evictions) and return
    the float32 log-probabilities before each of them."""
    session = _Session(model, _single_row_cache(model, prompt_ids, randkv, request_key))
    rows: list[torch.Tensor] = []
    step_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.inference_mode():
        for i, token in enumerate(forced_tokens):
            rows.append(torch.log_softmax(session.forward(step_ids, _all_real(step_ids)), -1)[0])
            if i + 1 < len(forced_tokens):
                step_ids = torch.tensor([[int(token)]], dtype=torch.long)
    if not rows:
        vocab = model.config.get_text_config(decoder=True).vocab_size
        return TeacherForced(torch.empty(0, vocab), torch.empty(0))
    logprobs = torch.stack(rows).cpu()
    index = torch.tensor([int(t) for t in forced_tokens])[:, None]
    return TeacherForced(logprobs, logprobs.gather(1, index)[:, 0])


def _all_real(ids: torch.Tensor) -> torch.Tensor:
    return torch.ones(ids.shape, dtype=torch.bool)
