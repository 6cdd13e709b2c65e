"""`randkv memory`: per-request KV bytes from a config.json, without and with RandKV.

The four configs under tests/data/configs hold the published config.json values of
Qwen/Qwen3-32B, deepseek-ai/DeepSeek-V3, openai/gpt-oss-120b and
Qwen/Qwen3-Next-80B-A3B-Instruct as recalled (nothing was fetched: this machine reaches no
model hub), only the fields the sizes read plus model_type and architectures. The expected
numbers below are arithmetic written out by hand from those fields, never values the code
under test computed. Settings unless a test says otherwise: 32768 tokens, K=2048, r=64
(K + 2r = 2176 = 136 blocks of 16, so RandKV's peak is 2176 tokens), block 16, bfloat16
(2 bytes), 80 GiB.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from randkv import memory
from randkv.cli import main
from randkv.memory import KVGroup, MemorySettings, ModelConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
GiB = 2**30
MiB = 2**20
MEMORY = 80 * GiB
DEFAULT = MemorySettings()


def _plan(name: str, settings: MemorySettings = DEFAULT) -> memory.MemoryPlan:
    return memory.plan_memory(memory.load_model(CONFIGS / name), settings, MEMORY)


def _by_kind(plan: memory.MemoryPlan) -> dict[str, memory.GroupMemory]:
    return {g.group.kind: g for g in plan.groups}


# -- the four published models, by hand ------------------------------------------------------


def test_qwen3_32b_dense_gqa():
    plan = _plan("Qwen3-32B")
    # 64 layers * 8 KV heads * 128 dims * 2 (K and V) * 2 bytes = 262144 bytes per token
    per_token = 64 * 8 * 128 * 2 * 2
    assert per_token == 262144
    (full,) = plan.groups
    assert (full.group.kind, full.group.layers) == ("full attention", 64)
    assert (full.tokens_plain, full.tokens_randkv) == (32768, 2176)
    assert plan.bytes_plain == 32768 * per_token == 8 * GiB
    # ceil(2176 / 16) * 16 = 136 * 16 = 2176 tokens = 544 MiB
    assert plan.bytes_randkv == 2176 * per_token == 544 * MiB
    assert plan.requests_plain == 10  # 80 GiB / 8 GiB
    assert plan.requests_randkv == 150  # 81920 MiB / 544 MiB = 150.6
    assert plan.ratio == pytest.approx(32768 / 2176)  # 15.06x


def test_deepseek_v3_mla_latent_rows():
    plan = _plan("DeepSeek-V3")
    # 61 layers * (kv_lora_rank 512 + qk_rope_head_dim 64) * 2 bytes = 70272 bytes per token;
    # no heads (128 KV heads in the config do not matter), no first_k_dense_replace, no MTP.
    per_token = 61 * (512 + 64) * 2
    assert per_token == 70272
    (latent,) = plan.groups
    assert (latent.group.kind, latent.group.layers) == ("latent", 61)
    assert plan.bytes_plain == 32768 * 70272 == 2302672896  # 2.14 GiB
    assert plan.bytes_randkv == 2176 * 70272 == 152911872  # 145.83 MiB
    assert plan.requests_plain == 37  # 85899345920 / 2302672896 = 37.3
    assert plan.requests_randkv == 561  # 85899345920 / 152911872 = 561.8


def test_gpt_oss_120b_sliding_window_mix():
    plan = _plan("gpt-oss-120b")
    groups = _by_kind(plan)
    # 18 full and 18 sliding layers, each 8 KV heads * 64 dims * 2 (K, V) * 2 bytes = 2048
    # bytes per token per layer: 18 * 2048 = 36864 bytes per token per group.
    per_token = 18 * 8 * 64 * 2 * 2
    assert per_token == 36864
    full, window = groups["full attention"], groups["sliding window"]
    assert (full.group.layers, window.group.layers, window.group.window) == (18, 18, 128)
    # Window: min(32768, 128 + 16) = 144 tokens = 9 blocks, plain and RandKV alike.
    assert (window.tokens_plain, window.tokens_randkv) == (144, 144)
    assert window.bytes_plain == window.bytes_randkv == 144 * 36864 == 5308416
    assert full.bytes_plain == 32768 * 36864 == 1207959552  # 1.125 GiB
    assert full.bytes_randkv == 2176 * 36864 == 80216064
    assert plan.bytes_plain == 1207959552 + 5308416 == 1213267968
    assert plan.bytes_randkv == 80216064 + 5308416 == 85524480
    assert plan.requests_plain == 70  # 85899345920 / 1213267968 = 70.8
    assert plan.requests_randkv == 1004  # 85899345920 / 85524480 = 1004.4


def test_qwen3_next_hybrid_linear_attention():
    plan = _plan("Qwen3-Next-80B-A3B-Instruct")
    groups = _by_kind(plan)
    # Layers 3, 7, ..., 47 are full attention ((i + 1) % 4 == 0): 12 full, 36 linear.
    full, state = groups["full attention"], groups["state"]
    assert (full.group.layers, state.group.layers) == (12, 36)
    # Full: 12 layers * 2 KV heads * 256 dims * 2 (K, V) * 2 bytes = 24576 bytes per token.
    assert full.bytes_plain == 32768 * (12 * 2 * 256 * 2 * 2) == 768 * MiB
    assert full.bytes_randkv == 2176 * 24576 == 53477376  # 51 MiB
    # Gated DeltaNet per layer: recurrent 32 v-heads * 128 * 128 = 524288 values, conv
    # (4 - 1) * (16 * 128 * 2 + 32 * 128) = 3 * 8192 = 24576 values; 548864 * 2 bytes.
    per_layer = (32 * 128 * 128 + (4 - 1) * (16 * 128 * 2 + 32 * 128)) * 2
    assert per_layer == 1097728
    assert state.group.state_values == 548864
    assert (state.tokens_plain, state.tokens_randkv) == (None, None)
    assert state.bytes_plain == state.bytes_randkv == 36 * 1097728 == 39518208
    assert plan.bytes_plain == 805306368 + 39518208 == 844824576
    assert plan.bytes_randkv == 53477376 + 39518208 == 92995584
    assert plan.requests_plain == 101  # 85899345920 / 844824576 = 101.7
    assert plan.requests_randkv == 923  # 85899345920 / 92995584 = 923.7
    # vLLM's attention block so a page holds a state: 16 * ceil(1097728 / (16 * 2048)) = 544.
    assert memory.vllm_hybrid_block_size(plan.model, DEFAULT) == 16 * 34 == 544


# -- the rounding rules ------------------------------------------------------------------------


def test_blocks_round_up_and_a_short_request_is_the_same_with_randkv():
    short = _plan("Qwen3-32B", MemorySettings(context=1000))
    # ceil(1000 / 16) = 63 blocks = 1008 tokens; K + 2r = 2176 is never reached.
    (full,) = short.groups
    assert (full.tokens_plain, full.tokens_randkv) == (1008, 1008)
    assert short.bytes_plain == short.bytes_randkv == 1008 * 262144
    assert short.ratio == 1.0


def test_a_peak_off_the_block_boundary_rounds_up():
    plan = _plan("Qwen3-32B", MemorySettings(budget=2000, buffer=50, block_size=32))
    # K + 2r = 2100 -> ceil(2100 / 32) = 66 blocks = 2112 tokens
    (full,) = plan.groups
    assert full.tokens_randkv == 2112
    assert plan.bytes_randkv == 2112 * 262144


def test_a_window_longer_than_the_context_holds_the_context():
    plan = _plan("gpt-oss-120b", MemorySettings(context=100))
    # min(100, 128 + 16) = 100 -> 7 blocks = 112 tokens in both groups
    assert {(g.tokens_plain, g.tokens_randkv) for g in plan.groups} == {(112, 112)}


def test_dtype_and_state_dtype():
    fp8 = _plan("Qwen3-32B", MemorySettings(dtype="fp8"))
    assert fp8.bytes_plain == 32768 * 64 * 8 * 128 * 2 * 1  # 1 byte per value: 4 GiB
    mixed = _plan("Qwen3-Next-80B-A3B-Instruct", MemorySettings(dtype="fp8", state_dtype="float32"))
    groups = _by_kind(mixed)
    assert groups["full attention"].bytes_plain == 32768 * 12 * 2 * 256 * 2 * 1
    assert groups["state"].bytes_plain == 36 * 548864 * 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": 0}, "RandKVConfig.budget"),
        ({"buffer": -1}, "RandKVConfig.buffer_size"),
        ({"context": 0}, "context must be a positive integer"),
        ({"block_size": 0}, "block_size must be a positive integer"),
        ({"dtype": "int4"}, "unknown dtype 'int4'"),
        ({"state_dtype": "float64"}, "unknown dtype 'float64'"),
    ],
)
def test_settings_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MemorySettings(**kwargs)


@pytest.mark.parametrize(
    ("text", "size"),
    [("80GiB", 80 * GiB), ("80 GiB", 80 * GiB), ("141GB", 141 * 10**9), ("512mib", 512 * MiB),
     ("1.5GiB", 3 * GiB // 2), ("4096", 4096)],
)  # fmt: skip
def test_parse_size(text, size):
    assert memory.parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "80 GiBs", "-1GiB", "0GiB", ""])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="memory"):
        memory.parse_size(text)


# -- other families, from small configs written here ---------------------------------------------


def test_a_nemotron_h_like_mamba2_hybrid():
    config = {
        "model_type": "nemotron_h",
        "hybrid_override_pattern": "M-M*M-*",  # Mamba2 at 0, 2, 4; attention at 3, 6
        "num_hidden_layers": 7,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "n_groups": 8,
        "conv_kernel": 4,
    }
    model = memory.model_kv(config, "nemotron-h-like")
    assert model.family == "Mamba2 hybrid"
    full, state = model.groups
    assert full == KVGroup(
        "full attention", 2, values_per_token=2 * 8 * 128, detail="8 KV heads x 128"
    )
    # SSM 128 * 64 * 128 = 1048576; conv (4 - 1) * (128 * 64 + 2 * 8 * 128) = 3 * 10240
    assert (state.kind, state.layers, state.state_values) == ("state", 3, 1048576 + 30720)
    plan = memory.plan_memory(model, DEFAULT)
    assert plan.bytes_plain == 32768 * 2 * 2048 * 2 + 3 * 1079296 * 2
    assert plan.bytes_randkv == 2176 * 2 * 2048 * 2 + 3 * 1079296 * 2
    assert plan.requests_plain is None  # no memory given


def _gemma3_like(**fields):
    return {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window": 512,
        **fields,
    }


def test_a_gemma3_like_sliding_window_pattern_and_its_layer_types_agree():
    by_pattern = memory.model_kv(_gemma3_like(sliding_window_pattern=6), "gemma3-like")
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(12)]
    by_types = memory.model_kv(_gemma3_like(layer_types=types), "gemma3-like")
    assert by_pattern == by_types
    full, window = by_pattern.groups
    assert (full.kind, full.layers, window.kind, window.layers) == (
        "full attention", 2, "sliding window", 10
    )  # fmt: skip
    assert window.window == 512 and window.values_per_token == 2 * 1 * 256
    plan = memory.plan_memory(by_pattern, DEFAULT)
    # window: min(32768, 512 + 16) = 528 tokens (33 blocks) in 10 layers, 1024 bytes per token
    assert plan.bytes_plain == 32768 * 2 * 1024 + 528 * 10 * 1024
    assert plan.bytes_randkv == 2176 * 2 * 1024 + 528 * 10 * 1024


def test_a_multimodal_config_is_read_from_its_text_config(tmp_path):
    path = tmp_path / "gemma-3-4b-it-like" / "config.json"
    path.parent.mkdir()
    text = _gemma3_like(sliding_window_pattern=6)
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": text}))
    assert memory.load_model(path.parent).groups == memory.model_kv(text, "x").groups


def test_qwen3_next_layer_types_equal_its_interval():
    config = json.loads((CONFIGS / "Qwen3-Next-80B-A3B-Instruct" / "config.json").read_text())
    interval = memory.model_kv(config, "q")
    config["layer_types"] = ["linear_attention", "linear_attention", "linear_attention",
                             "full_attention"] * 12  # fmt: skip
    assert memory.model_kv(config, "q") == interval


def test_a_qwen2_sliding_window_that_is_off_is_ignored():
    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,  # no head_dim: 3584 / 28 = 128
        "sliding_window": 131072,
        "use_sliding_window": False,
    }
    (full,) = memory.model_kv(config, "qwen2-like").groups
    assert (full.kind, full.layers, full.values_per_token) == ("full attention", 28, 2 * 4 * 128)


def test_no_num_key_value_heads_means_multi_head_attention():
    config = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}
    (full,) = memory.model_kv(config, "mha").groups
    assert full.values_per_token == 2 * 8 * 64


# -- refusals ------------------------------------------------------------------------------------


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "gpt2", "n_layer": 12}, r"\(gpt2\): field 'num_hidden_layers' is missing"),
        ({"num_hidden_layers": 4, "num_attention_heads": 8}, "field 'hidden_size' is missing"),
        ({"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": "128"},
         "field 'head_dim' is not an integer"),
        ({"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64,
          "full_attention_interval": 4}, "field 'linear_num_key_heads' is missing"),
        ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
          "layer_types": ["full_attention", "chunked_attention"]},
         "layer type.*chunked_attention not sized"),
        ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
          "layer_types": ["full_attention"]}, "must list num_hidden_layers"),
        ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
          "sliding_window": 4096}, "which layers slide is not in the config"),
        ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
          "layer_types": ["sliding_attention", "full_attention"]},
         "field 'sliding_window' is missing"),
        ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
          "attention_chunk_size": 8192}, "chunked local attention"),
        ({"num_hidden_layers": 61, "kv_lora_rank": 512}, "field 'qk_rope_head_dim' is missing"),
        ({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
          "index_topk": 2048}, "DeepSeek-V3.2's sparse-attention indexer"),
        ({"hybrid_override_pattern": "M*X"}, "must use only M"),
        ({"hybrid_override_pattern": "M*", "num_hidden_layers": 3}, "has 2 layers"),
        ({"hybrid_override_pattern": "M-", "mamba_num_heads": 8}, "'mamba_head_dim' is missing"),
        ({"hybrid_override_pattern": "--"}, "no layer keeps a KV cache or state"),
    ],
)  # fmt: skip
def test_configs_it_cannot_size_are_refused_naming_the_config_and_the_field(
    tmp_path, config, message
):
    path = _write(tmp_path, config)
    with pytest.raises(ModelConfigError, match=message) as error:
        memory.load_model(path)
    assert str(path) in str(error.value)


def test_a_missing_or_unreadable_config_is_refused(tmp_path):
    with pytest.raises(ModelConfigError, match="no such model folder or config.json"):
        memory.load_model(tmp_path)  # a folder without config.json
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read it as JSON"):
        memory.load_model(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="not a JSON object"):
        memory.load_model(tmp_path)


# -- the command ---------------------------------------------------------------------------------


def test_randkv_memory_prints_the_table(capsys):
    assert main(["memory", str(CONFIGS / "Qwen3-32B")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "Qwen3-32B: dense attention"
    row = next(line for line in lines if line.startswith("full attention")).split()
    assert row[2:] == ["64", "8", "KV", "heads", "x", "128", "32768", "2176", "8.00", "GiB",
                       "544.00", "MiB"]  # fmt: skip
    total = next(line for line in lines if line.startswith("total per request")).split()
    assert total[-4:] == ["8.00", "GiB", "544.00", "MiB"]
    fits = next(line for line in lines if line.startswith("requests in 80.00 GiB")).split()
    assert fits[-2:] == ["10", "150"]
    assert "RandKV holds 15.06x less KV per request" in out


def test_randkv_memory_options_and_json(capsys):
    args = ["memory", str(CONFIGS / "gpt-oss-120b" / "config.json"), "--context", "65536",
            "--budget", "4096", "--buffer", "128", "--block-size", "32", "--dtype", "fp8",
            "--memory", "141GB", "--json"]  # fmt: skip
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    # 18 layers * 8 heads * 64 dims * 2 (K, V) * 1 byte = 18432 bytes per token per group;
    # K + 2r = 4352 = 136 blocks of 32; window min(65536, 128 + 32) = 160 tokens = 5 blocks.
    assert result["bytes_plain"] == 65536 * 18432 + 160 * 18432
    assert result["bytes_randkv"] == 4352 * 18432 + 160 * 18432
    assert result["memory"] == 141 * 10**9
    assert result["requests_randkv"] == 141 * 10**9 // ((4352 + 160) * 18432)
    assert [g["kind"] for g in result["groups"]] == ["full attention", "sliding window"]
    assert result["groups"][1]["window"] == 128


def test_randkv_memory_notes_what_latent_and_state_groups_hold(capsys):
    assert main(["memory", str(CONFIGS / "Qwen3-Next-80B-A3B-Instruct")]) == 0
    out = capsys.readouterr().out
    assert "805.69 MiB" in out and "88.69 MiB" in out  # 844824576 and 92995584 bytes
    assert "however long" in out and "--block-size 544" in out
    assert main(["memory", str(CONFIGS / "DeepSeek-V3")]) == 0
    assert "one kept set for all of the layer's heads" in capsys.readouterr().out


def test_randkv_memory_errors_exit_2_with_the_message(tmp_path, capsys):
    assert main(["memory", str(tmp_path)]) == 2
    assert "randkv: error:" in capsys.readouterr().err
    assert main(["memory", str(CONFIGS / "Qwen3-32B"), "--memory", "lots"]) == 2
    assert "expected a size" in capsys.readouterr().err
    assert main(["memory", str(CONFIGS / "Qwen3-32B"), "--budget", "0"]) == 2
    assert "RandKVConfig.budget" in capsys.readouterr().err


# -- layering ----------------------------------------------------------------------------------


def test_the_module_imports_only_the_standard_library_and_the_spec():
    tree = ast.parse(Path(memory.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    outside = {n for n in names if n.split(".")[0] not in sys.stdlib_module_names}
    assert outside == {"randkv.spec.config"}
    code = (
        "import sys, randkv.memory; "
        "print(sorted({'torch', 'vllm', 'transformers', 'numpy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_readme_table_is_what_the_command_prints():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in ("Qwen3-32B", "gpt-oss-120b", "DeepSeek-V3", "Qwen3-Next-80B-A3B-Instruct"):
        plan = _plan(name)
        cells = (
            f"| {memory.format_bytes(plan.bytes_plain)} | {memory.format_bytes(plan.bytes_randkv)}"
            f" | {plan.ratio:.2f}x | {plan.requests_plain} / {plan.requests_randkv} |"
        )
        row = next(line for line in readme.splitlines() if line.startswith(f"| {name[:18]} |"))
        assert row.endswith(cells), (name, row, cells)
