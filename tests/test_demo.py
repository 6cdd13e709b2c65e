"""The demo's retention picture: the kept-tail marker against `randkv.spec`, and its legend."""

from __future__ import annotations

import pytest

from randkv import RandKVConfig, request_key_from_text, retained_positions
from randkv.demo import DEMO_CONFIG

pytest.importorskip("matplotlib")

from randkv.bench.plots import kept_tail_start, plot_retention  # noqa: E402


def test_kept_tail_is_r_plus_the_tokens_since_the_last_round():
    # K = 128, r = 64: rounds fire at 256, 320, ..., 640 tokens seen.
    assert (DEMO_CONFIG.budget, DEMO_CONFIG.buffer_size) == (128, 64)
    tail = {t: kept_tail_start(DEMO_CONFIG, prompt_length=51, tokens_seen=t) for t in (255, 256)}
    assert tail == {255: None, 256: 192}  # nothing evicted yet; then exactly the r newest
    assert kept_tail_start(DEMO_CONFIG, prompt_length=51, tokens_seen=319) == 192
    assert kept_tail_start(DEMO_CONFIG, prompt_length=51, tokens_seen=320) == 256
    # The demo's own run: 649 tokens, last round at 640, so 64 + 9 = 73 newest are kept.
    assert kept_tail_start(DEMO_CONFIG, prompt_length=51, tokens_seen=649) == 649 - 73


@pytest.mark.parametrize("tokens_seen", [130, 131, 137, 200])
def test_kept_tail_is_exactly_what_every_head_keeps(tokens_seen):
    """Every (layer, head) of every request keeps [tail, T); some head has evicted tail - 1."""
    config = RandKVConfig(budget=40, buffer_size=8, seed=3)
    prompt = 12
    tail = kept_tail_start(config, prompt_length=prompt, tokens_seen=tokens_seen)
    assert tail is not None
    kept_sets = [
        set(
            retained_positions(
                config,
                prompt_length=prompt,
                tokens_seen=tokens_seen,
                request_key=request_key_from_text(f"request {k}"),
                layer=layer,
                kv_head=head,
            )
        )
        for k in range(4)
        for layer in range(2)
        for head in range(4)
    ]
    assert all(set(range(tail, tokens_seen)) <= kept for kept in kept_sets)
    assert any(tail - 1 not in kept for kept in kept_sets)


def test_retention_picture_has_a_colour_key(tmp_path):
    config, prompt, tokens_seen = DEMO_CONFIG, 51, 649
    key = request_key_from_text("randkv-demo")
    retained = [
        retained_positions(
            config,
            prompt_length=prompt,
            tokens_seen=tokens_seen,
            request_key=key,
            layer=0,
            kv_head=head,
        )
        for head in range(8)
    ]
    path = tmp_path / "retention.png"
    labels = plot_retention(
        retained, config=config, tokens_seen=tokens_seen, prompt_length=prompt, layer=0, path=path
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert labels == [
        "evicted",
        "prompt (always kept)",
        "kept by the random sample",
        "newest tokens (always kept)",
        "end of prompt",
        "newest 73 = r + 9 since the last round",
    ]
