"""Request identity that survives batching, ordering and engine restarts.

vLLM's internal request ids carry a random suffix and `LLM.generate` numbers requests
by order, so neither can seed anything reproducible. A request's key is derived from
what it is: its prompt token ids and the sampling parameters that shape its tokens
(seed included). A caller key passed as `SamplingParams(extra_args={"randkv_key": ...})`
(OpenAI API: `"vllm_xargs": {"randkv_key": ...}`) replaces all of that, so replicas with
different defaults, tokenizer revisions or sampling settings still make the same decisions:
a str is hashed (`randkv.request_key_from_text`), an int in [0, 2**64 - 1] is the key itself
(so 42 and "42" are different keys); anything else is refused (`randkv.coerce_request_key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from randkv.spec import coerce_request_key, request_key_from_content
from randkv.spec.config import RandKVConfig

USER_KEY_FIELD = "randkv_key"
BUDGET_FIELD = "randkv_budget"
#: Every request field RandKV reads from `extra_args` / `vllm_xargs`.
KNOWN_FIELDS = (USER_KEY_FIELD, BUDGET_FIELD)

# Parameters that change which tokens come out. Length limits and stop strings only
# truncate, so a request and its longer continuation share their decisions.
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "min_tokens",
)


def sampling_fingerprint(sampling_params: Any) -> str:
    if sampling_params is None:
        return ""
    parts = []
    for name in _SAMPLING_FIELDS:
        value = getattr(sampling_params, name, None)
        if isinstance(value, dict):
            value = sorted(value.items())
        parts.append(f"{name}={value!r}")
    return ";".join(parts)


def check_request_fields(extra: Mapping[str, Any] | None) -> int | None:
    """Validate the `randkv_*` fields of a request's extra arguments; its caller key or None.

    Raises ValueError (an unknown `randkv_*` field, a key out of range) or TypeError (a key
    that is neither int nor str), each naming what is accepted. The budget's range is the
    server's: `RandKVConfig.request_budget` checks it.
    """
    extra = extra or {}
    unknown = sorted(k for k in extra if k.startswith("randkv_") and k not in KNOWN_FIELDS)
    if unknown:
        raise ValueError(f"unknown RandKV request field(s) {unknown}; known: {list(KNOWN_FIELDS)}")
    value = extra.get(USER_KEY_FIELD)
    return None if value is None else coerce_request_key(value)


def requested_budget(extra: Mapping[str, Any] | None) -> Any:
    """The request's own `randkv_budget` as it came (None when absent); its type and range
    are checked by `RandKVConfig.request_budget`."""
    return (extra or {}).get(BUDGET_FIELD)


def request_config(config: RandKVConfig, prompt_length: int, sampling_params: Any) -> RandKVConfig:
    """The RandKVConfig one request runs with: `config.for_request` with the request's own
    `randkv_budget`. Raises PromptTooLongError or RequestBudgetError (both ValueErrors)."""
    extra = getattr(sampling_params, "extra_args", None)
    return config.for_request(prompt_length, requested_budget(extra))


def user_key(sampling_params: Any) -> int | None:
    """The caller's RandKV key of a request (validated), or None."""
    return check_request_fields(getattr(sampling_params, "extra_args", None))


def derive_request_key(
    prompt_token_ids: list[int], sampling_params: Any, internal_request_id: str
) -> int:
    """The 64-bit RandKV key of a request.

    A caller key wins outright. Otherwise: unseeded random sampling is not reproducible, so
    neither need its evictions be; such a request (each sample of n > 1 among them) also
    mixes in its unique internal id.
    """
    caller_key = user_key(sampling_params)
    if caller_key is not None:
        return caller_key
    fingerprint = sampling_fingerprint(sampling_params)
    temperature = getattr(sampling_params, "temperature", 0.0) or 0.0
    if temperature > 0 and getattr(sampling_params, "seed", None) is None:
        fingerprint += f";unseeded={internal_request_id}"
    return request_key_from_content(prompt_token_ids, fingerprint)
