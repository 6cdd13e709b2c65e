"""Every vLLM mode RandKV refuses, in one table.

Each entry says what is refused, how to detect it on vLLM's resolved configuration (in the
engine process, whatever entry point built it), and, when a call-site argument turns it on,
which argument: `randkv.vllm.LLM`, `randkv serve` and the engine check all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class UnsupportedModeError(ValueError):
    """A vLLM feature whose correctness under RandKV eviction is not shown."""


def _set(value: Any) -> bool:
    return bool(value)


def _above_one(value: Any) -> bool:
    return int(value or 1) > 1


@dataclass(frozen=True)
class Refusal:
    """A refused mode.

    what: the mode, as the error names it.
    detect: True when a resolved `VllmConfig` uses the mode.
    engine_arg: the `vllm.LLM` keyword / `vllm serve` field that turns it on, if any.
    requested: True when that argument's value asks for the mode.
    advice: what to do instead (ends the call-site error message).
    """

    what: str
    detect: Callable[[Any], bool]
    engine_arg: str | None = None
    requested: Callable[[Any], bool] = _set
    advice: str = ""

    def call_site_message(self, value: Any) -> str:
        text = f"RandKV does not support {self.what} ({self.engine_arg}={value!r} is set)"
        return f"{text}; {self.advice}" if self.advice else text


def _model(attribute: str) -> Callable[[Any], bool]:
    return lambda c: bool(getattr(c.model_config, attribute, False))


def _parallel(attribute: str) -> Callable[[Any], bool]:
    return lambda c: getattr(c.parallel_config, attribute, 1) > 1


#: Speculation methods RandKV runs (docs/vllm-integration.md, "Speculative decoding"): the
#: proposers without a KV cache (only the scheduler's cut at round boundaries concerns them),
#: and the drafters whose attention layers share the target's KV cache group (compacted with
#: it, each layer with its own draws).
KV_FREE_PROPOSERS = frozenset({"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator"})
KV_DRAFTERS = frozenset({"draft_model", "eagle", "eagle3"})
SPECULATION_METHODS = KV_FREE_PROPOSERS | KV_DRAFTERS


def _speculation_method(speculative_config: Any) -> str | None:
    """The method a speculative config names (a resolved config or the call-site dict);
    None when vLLM infers it from the draft model."""
    if isinstance(speculative_config, dict):
        return speculative_config.get("method")
    return getattr(speculative_config, "method", None)


def _is_mtp(method: str | None) -> bool:
    return method is not None and (method == "mtp" or method.endswith("_mtp"))


def _refused_speculation(speculative_config: Any) -> bool:
    method = _speculation_method(speculative_config)
    return method is not None and not _is_mtp(method) and method not in SPECULATION_METHODS


def _drafts_outrun_buffer(vllm_config: Any) -> bool:
    from randkv.vllm.options import config_from_vllm

    spec, config = vllm_config.speculative_config, config_from_vllm(vllm_config)
    if spec is None or config is None:
        return False
    return int(spec.num_speculative_tokens or 0) >= 2 * config.buffer_size


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "MTP speculation (its layer writes KV beside the target's, on hybrid and MLA model "
        "families; its placement under RandKV is not verified yet)",
        lambda c: (
            c.speculative_config is not None and _is_mtp(_speculation_method(c.speculative_config))
        ),
        "speculative_config",
        lambda value: _is_mtp(_speculation_method(value)),
        advice="use an EAGLE/EAGLE3 drafter, a draft model or ngram "
        '(--speculative-config \'{"method": "eagle3", ...}\'), or remove speculative_config',
    ),
    Refusal(
        "this speculation method (RandKV runs ngram, ngram_gpu, suffix, medusa, "
        "mlp_speculator, draft_model, eagle and eagle3; other drafters write KV RandKV does "
        "not place yet)",
        lambda c: c.speculative_config is not None and _refused_speculation(c.speculative_config),
        "speculative_config",
        _refused_speculation,
        advice="use one of those methods, or remove speculative_config",
    ),
    Refusal(
        "speculative steps of 2r tokens or more (num_speculative_tokens must be below twice "
        "the buffer r, so a step of drafts never outruns a round)",
        _drafts_outrun_buffer,
        advice="lower num_speculative_tokens or raise buffer_size",
    ),
    Refusal(
        "KV transfer / disaggregated serving",
        lambda c: c.kv_transfer_config is not None,
        "kv_transfer_config",
        advice="remove kv_transfer_config (--kv-transfer-config)",
    ),
    Refusal(
        "encoder-cache transfer",
        lambda c: getattr(c, "ec_transfer_config", None) is not None,
        "ec_transfer_config",
        advice="remove ec_transfer_config (--ec-transfer-config)",
    ),
    Refusal(
        "pipeline parallelism (not verified)",
        _parallel("pipeline_parallel_size"),
        "pipeline_parallel_size",
        _above_one,
        advice="RandKV under vLLM pipeline parallelism is not verified (vLLM 0.28.0's CPU "
        "pipeline parallel fails on its own); use tensor parallelism",
    ),
    Refusal(
        "attention-free models (every layer state-space or linear: no KV cache grows with "
        "the sequence, nothing for RandKV to evict; serve them without RandKV)",
        _model("is_attention_free"),
    ),
    Refusal("ALiBi (its bias depends on slot distance)", _model("uses_alibi")),
    Refusal("encoder-decoder models (cross attention)", _model("is_encoder_decoder")),
    Refusal("M-RoPE multimodal positions", _model("uses_mrope")),
    # vLLM runs the data-parallel ranks of a dense model as independent engines (each sees
    # data_parallel_size == 1 here), which RandKV supports like separate replicas; MoE ranks
    # step in lockstep with dummy batches.
    Refusal(
        "lockstep data parallelism of MoE models (not verified; run independent replicas)",
        _parallel("data_parallel_size"),
    ),
    Refusal("decode context parallelism", _parallel("decode_context_parallel_size")),
    Refusal("prefill context parallelism", _parallel("prefill_context_parallel_size")),
    Refusal(
        "vLLM's extensible KV cache",
        lambda c: bool(getattr(c.cache_config, "enable_extensible_kv_cache", False)),
        "enable_extensible_kv_cache",
        advice="RandKV needs the KV cache allocated before warm-up (its caches and its memory "
        "reserve are fixed at start-up); remove enable_extensible_kv_cache=True "
        "(--enable-extensible-kv-cache)",
    ),
    Refusal(
        "quantized KV cache (use kv_cache_dtype='auto')",
        lambda c: c.cache_config.cache_dtype not in ("auto", None),
        "kv_cache_dtype",
        lambda value: value not in (None, "auto"),
        advice="use kv_cache_dtype='auto' (--kv-cache-dtype auto)",
    ),
)

#: The call-site arguments some refusal reads (`randkv serve` passes these through).
REFUSED_ENGINE_ARGS: tuple[str, ...] = tuple(r.engine_arg for r in REFUSALS if r.engine_arg)


def refuse_engine_kwargs(kwargs: dict[str, Any]) -> None:
    """Raise for the first call-site argument that asks for a refused mode."""
    for refusal in REFUSALS:
        if refusal.engine_arg is None:
            continue
        value = kwargs.get(refusal.engine_arg)
        if value is not None and refusal.requested(value):
            raise UnsupportedModeError(refusal.call_site_message(value))


def refused_modes(vllm_config: Any) -> list[str]:
    """The refused modes a resolved VllmConfig uses (empty: RandKV can serve it)."""
    return [refusal.what for refusal in REFUSALS if refusal.detect(vllm_config)]


def check_engine_supported(vllm_config: Any) -> None:
    """Refuse engine configurations RandKV cannot serve; runs in the engine process."""
    problems = refused_modes(vllm_config)
    if problems:
        raise UnsupportedModeError("RandKV does not support: " + "; ".join(problems))


def refuse_shared_kv_layers(shared_kv_cache_layers: dict[str, str]) -> None:
    """Refuse vLLM's cross-layer KV sharing (a layer reading another layer's cache).

    A shared cache appears under both layers in the runner's `kv_caches`, so a round would
    apply two layers' different move sets to the same memory.
    """
    if shared_kv_cache_layers:
        pairs = ", ".join(f"{a} -> {b}" for a, b in sorted(shared_kv_cache_layers.items())[:4])
        raise UnsupportedModeError(
            f"RandKV does not support layers that share a KV cache ({pairs}); the model uses "
            "vLLM's KV sharing (kv_sharing_target_layer_name): use a model whose every "
            "attention layer has its own KV cache"
        )
