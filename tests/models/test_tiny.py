"""Tests for the tiny random-weight Qwen3 checkpoint (CPU only, no network)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from randkv.models.tiny import (
    MARKER_FILE,
    VOCAB_SIZE,
    build_tiny_checkpoint,
    tiny_checkpoint_path,
)

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    MARKER_FILE,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


def test_build_is_deterministic(tmp_path: Path, ckpt: Path) -> None:
    other = build_tiny_checkpoint(tmp_path / "a")
    for name in FILES:
        assert (other / name).read_bytes() == (ckpt / name).read_bytes(), name
    reseeded = build_tiny_checkpoint(tmp_path / "b", seed=1)
    assert (reseeded / "model.safetensors").read_bytes() != (
        ckpt / "model.safetensors"
    ).read_bytes()


def test_build_is_idempotent_and_atomic(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: build_tiny_checkpoint(target), range(4)))
    assert all(p == target.absolute() for p in paths)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dirs left
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_checkpoint(target) == target.absolute()
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError):
        build_tiny_checkpoint(target, num_layers=3)  # same folder, other params
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("x")
    with pytest.raises(FileExistsError):
        build_tiny_checkpoint(foreign)


def test_default_cache_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANDKV_CACHE", str(tmp_path))
    expected = tiny_checkpoint_path(num_layers=3)
    assert expected.parent == tmp_path and not expected.exists()
    assert expected != tiny_checkpoint_path(num_layers=2)
    assert build_tiny_checkpoint(num_layers=3) == expected
    assert json.loads((expected / "config.json").read_text())["num_hidden_layers"] == 3
    with pytest.raises(TypeError):
        tiny_checkpoint_path(bogus=1)


def test_config(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["max_position_embeddings"] >= 8192
    assert cfg["tie_word_embeddings"] is False
    assert cfg["vocab_size"] == VOCAB_SIZE
    assert set(cfg["layer_types"]) == {"full_attention"}


def test_tokenizer_round_trip(ckpt: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    assert len(tok) == VOCAB_SIZE
    for text in ["Hello, world!", "  leading spaces\n\ttab", "wörld ✓ 日本語 🙂 ñ", "\x00\x7f"]:
        ids = tok(text)["input_ids"]
        assert ids == list(text.encode("utf-8"))  # one token per byte, no BOS
        assert tok.decode(ids) == text
    assert tok.eos_token_id == 257 and tok.pad_token_id == 258
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=True, return_dict=False
    )
    assert ids == [259, *b"user\nhi", 260, 10]  # <|im_start|> ... <|im_end|> \n


def test_greedy_output_depends_on_context(ckpt: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompt = list(b"The quick brown fox jumps over the lazy dog.")
    n = 64

    def greedy(ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False
            )
        return out[0, len(ids) :].tolist()

    base = greedy(prompt)
    assert len(base) == n
    assert greedy(prompt) == base  # deterministic
    assert len(set(base)) >= 20  # not a constant / short cycle
    assert all(0x20 <= t < 0x7F or t == 0x0A for t in base)  # printable ASCII output
    changed = greedy([ord("X")] + prompt[1:])
    assert changed[20:] != base[20:]  # an early token still matters 20+ tokens later
