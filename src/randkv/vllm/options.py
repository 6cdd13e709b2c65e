"""RandKV's option inside vLLM: the key it is written under, and the typed form it travels in.

A deployment turns RandKV on with `additional_config={"randkv": {...}}` (`vllm serve
--additional-config`, `vllm.LLM`, engine arguments); `randkv.vllm.LLM(randkv=...)` and
`randkv serve` put the `RandKVConfig` they parsed there themselves. The value is coerced
once, where it enters (those two, or the plugin when vLLM builds its configuration); the
plugin then gives the `VllmConfig` a `RandKVAdditionalConfig` carrying that `RandKVConfig`.
vLLM declares `additional_config` for out-of-tree settings (`dict | SupportsHash` up to 0.32,
`dict | SupportsCompileFactors` in 0.34; the typed value has both methods) and pickles it
with the `VllmConfig` into every engine and worker process, so the scheduler, the
workers, the KV cache spec and the front door read the typed value (`config_from_vllm`);
none parses it again.

Imports neither vLLM nor torch: the plugin, which vLLM loads in every process, reads it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from randkv.spec.config import RandKVConfig

ADDITIONAL_CONFIG_KEY = "randkv"

#: What RandKV's scheduler and workers say when an engine reaches them without the plugin.
NO_CONFIG = (
    "{cls} found no RandKV settings on the engine's configuration; RandKV's plugin puts "
    "them there when vLLM builds it from additional_config={{'randkv': ...}} (vLLM loads the "
    "plugin unless VLLM_PLUGINS leaves 'randkv' out)"
)


def options_in(additional_config: Any) -> Any:
    """What a deployment wrote under "randkv" in `additional_config` (None: RandKV off)."""
    if isinstance(additional_config, Mapping):
        return additional_config.get(ADDITIONAL_CONFIG_KEY)
    return None


@dataclass(frozen=True, eq=False)
class RandKVAdditionalConfig(Mapping[str, Any]):
    """vLLM's `additional_config` of an engine with RandKV on: RandKV's settings under
    "randkv" as the `RandKVConfig` parsed where they entered, the other entries unchanged.

    A read-only mapping, so other plugins still `.get` their entries (and it compares equal
    to the plain dict of the same entries); where vLLM would dump a plain dict as JSON it
    hashes this with `compute_hash` (its `SupportsHash` protocol, up to 0.32) or reads
    `compile_factors` (`SupportsCompileFactors`, 0.34).
    """

    randkv: RandKVConfig
    others: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, additional_config: Any, config: RandKVConfig) -> RandKVAdditionalConfig:
        """`additional_config` (a mapping, or None) with RandKV's entry set to `config`."""
        entries = dict(additional_config or {})
        entries.pop(ADDITIONAL_CONFIG_KEY, None)
        return cls(config, entries)

    def __getitem__(self, key: str) -> Any:
        return self.randkv if key == ADDITIONAL_CONFIG_KEY else self.others[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.others
        yield ADDITIONAL_CONFIG_KEY

    def __len__(self) -> int:
        return len(self.others) + 1

    def compile_factors(self) -> dict[str, object]:
        """The plain dict of every entry, RandKV's settings as their fields (vLLM 0.34 keys
        compile caches and the server fingerprint on it)."""
        return {**self.others, ADDITIONAL_CONFIG_KEY: asdict(self.randkv)}

    def compute_hash(self) -> str:
        """A digest of every entry (vLLM up to 0.32 keys compile caches and the server
        fingerprint on it): the JSON of `compile_factors()`."""
        plain = self.compile_factors()
        return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


def config_from_vllm(vllm_config: Any) -> RandKVConfig | None:
    """The RandKVConfig an engine runs with, or None for plain vLLM (no parsing: the plugin
    left the parsed value on the engine's configuration)."""
    extra = getattr(vllm_config, "additional_config", None)
    return extra.randkv if isinstance(extra, RandKVAdditionalConfig) else None
