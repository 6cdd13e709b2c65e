"""The typed form RandKV's option travels in through vLLM (`randkv.vllm.options`), without
an engine: a mapping other readers can use, a stable hash, a pickle round trip."""

from __future__ import annotations

import pickle
import subprocess
import sys
import types

import pytest

from randkv import RandKVConfig
from randkv.vllm.options import RandKVAdditionalConfig, config_from_vllm, options_in

pytestmark = [pytest.mark.vllm]

CONFIG = RandKVConfig(budget=64, buffer_size=8, seed=3)


def test_it_reads_like_the_additional_config_it_replaces():
    extra = RandKVAdditionalConfig.of({"other": {"x": 1}, "randkv": {"budget": 1}}, CONFIG)
    assert extra == {"other": {"x": 1}, "randkv": CONFIG}  # the parsed config, not the dict
    assert extra.get("other") == {"x": 1} and extra.get("missing") is None
    assert sorted(extra) == ["other", "randkv"] and len(extra) == 2
    assert options_in(extra) is CONFIG
    assert RandKVAdditionalConfig.of(None, CONFIG) == {"randkv": CONFIG}


def test_the_hash_follows_every_entry():
    one = RandKVAdditionalConfig.of({"other": 1}, CONFIG)
    assert one.compute_hash() == RandKVAdditionalConfig.of({"other": 1}, CONFIG).compute_hash()
    changed = [
        RandKVAdditionalConfig.of({"other": 2}, CONFIG),
        RandKVAdditionalConfig.of({"other": 1}, RandKVConfig(budget=65, buffer_size=8, seed=3)),
        RandKVAdditionalConfig.of({"other": 1}, RandKVConfig(budget=64, buffer_size=8, seed=4)),
    ]
    assert len({one.compute_hash(), *(c.compute_hash() for c in changed)}) == 4


def test_it_pickles_into_other_processes_as_it_is():
    extra = RandKVAdditionalConfig.of({"other": 1}, CONFIG)
    copy = pickle.loads(pickle.dumps(extra))
    assert type(copy) is RandKVAdditionalConfig and copy.randkv == CONFIG
    assert config_from_vllm(types.SimpleNamespace(additional_config=copy)) == CONFIG


def test_only_the_plugin_s_typed_value_turns_randkv_on():
    def vllm_config(additional_config):
        return types.SimpleNamespace(additional_config=additional_config)

    # A plain dict was never through the plugin: nothing reads it as RandKV's settings.
    assert config_from_vllm(vllm_config({"randkv": {"budget": 64}})) is None
    assert config_from_vllm(vllm_config({})) is None
    assert config_from_vllm(types.SimpleNamespace()) is None
    assert options_in({"randkv": {"budget": 64}}) == {"budget": 64}
    assert options_in(None) is None


def test_the_options_module_imports_neither_vllm_nor_torch():
    code = "import sys, randkv.vllm.options; print('vllm' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False False"
