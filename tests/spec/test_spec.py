"""The executable spec against independent oracles and statistical laws."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from randkv import (
    PromptTooLongError,
    RandKVConfig,
    num_rounds,
    physical_length,
    retained_positions,
    slot_positions,
    spec,
)

configs = st.builds(
    RandKVConfig,
    budget=st.integers(1, 60),
    buffer_size=st.integers(1, 12),
    seed=st.integers(0, 2**64 - 1),
)


@st.composite
def requests(draw):
    config = draw(configs)
    prompt = draw(st.integers(0, config.budget))
    tokens = draw(st.integers(prompt, prompt + 6 * config.max_physical_length))
    key = draw(st.integers(0, 2**64 - 1))
    return config, prompt, tokens, key


def test_mix64_matches_published_splitmix64_outputs():
    # SplitMix64 seeded with 0: its first outputs are published test vectors.
    state, outputs = 0, []
    for _ in range(3):
        state = (state + spec.GOLDEN_GAMMA) & spec.MASK64
        outputs.append(spec.mix64(state))
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_bounded_is_lemire_with_exact_rejection():
    n = 3
    # 2**32 mod 3 == 1: only the draw whose low product word is 0 is rejected.
    assert spec.bounded(0, n) is None
    assert spec.bounded(1, n) == 0
    assert spec.bounded(2**32 - 1, n) == 2
    counts = [0, 0, 0]
    for draw in range(0, 2**32, 2**32 // 3000):
        value = spec.bounded(draw, n)
        if value is not None:
            counts[value] += 1
    assert max(counts) - min(counts) <= 2


@given(requests())
@settings(max_examples=200, deadline=None)
def test_cadence_matches_a_step_by_step_simulation(case):
    config, prompt, tokens, _ = case
    length = rounds = 0
    for _ in range(tokens):
        length += 1
        if length == config.max_physical_length:
            length -= config.buffer_size
            rounds += 1
    assert physical_length(config, prompt_length=prompt, tokens_seen=tokens) == length
    assert num_rounds(config, prompt_length=prompt, tokens_seen=tokens) == rounds
    assert length <= config.max_physical_length - 1


@given(requests())
@settings(max_examples=150, deadline=None)
def test_retained_sets_keep_prompt_and_newest_tokens(case):
    config, prompt, tokens, key = case
    kept = retained_positions(
        config, prompt_length=prompt, tokens_seen=tokens, request_key=key, layer=3, kv_head=1
    )
    assert len(kept) == physical_length(config, prompt_length=prompt, tokens_seen=tokens)
    assert len(set(kept)) == len(kept)
    assert all(0 <= p < tokens for p in kept)
    assert set(range(prompt)) <= set(kept)
    rounds = num_rounds(config, prompt_length=prompt, tokens_seen=tokens)
    # Tokens that were never candidates: the r newest at the last round, and all later.
    protected_from = spec.round_fires_at(config, rounds - 1) - config.buffer_size if rounds else 0
    assert set(range(protected_from, tokens)) <= set(kept)


@given(requests())
@settings(max_examples=100, deadline=None)
def test_slot_layout_is_hole_filling(case):
    config, prompt, tokens, key = case
    rounds = num_rounds(config, prompt_length=prompt, tokens_seen=tokens)
    before = slot_positions(
        config, prompt_length=prompt, tokens_seen=tokens, request_key=key, layer=0, kv_head=0
    )
    # The prompt never moves; everything after the last round is appended in order.
    assert before[:prompt] == tuple(range(prompt))
    if rounds:
        tail_start = spec.round_fires_at(config, rounds - 1)
        tail = tuple(range(tail_start, tokens))
        assert before[config.compacted_length :] == tail


def test_prompt_longer_than_budget_is_refused():
    config = RandKVConfig(budget=16, buffer_size=4)
    with pytest.raises(
        PromptTooLongError, match="prompt of 17 tokens exceeds the RandKV budget K=16"
    ):
        physical_length(config, prompt_length=17, tokens_seen=30)
    with pytest.raises(ValueError, match="raise the budget"):
        retained_positions(
            config, prompt_length=17, tokens_seen=17, request_key=0, layer=0, kv_head=0
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": 0}, r"budget must be in \[1, "),
        ({"buffer_size": 0}, r"buffer_size must be in \[1, "),
        ({"seed": -1}, r"seed must be in \[0, 18446744073709551615\]"),
        ({"budget": 1.5}, "budget must be an integer"),
        ({"buffer_size": True}, "buffer_size must be an integer"),
        ({"budget": 2**31 - 10, "buffer_size": 8}, "budget \\+ 2 \\* buffer_size must be at most"),
    ],
)
def test_bad_config_names_the_field_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandKVConfig(**kwargs)


def test_config_coercion_for_the_call_site():
    assert RandKVConfig.coerce(True) == RandKVConfig()
    assert RandKVConfig.coerce({"budget": 64}) == RandKVConfig(budget=64)
    assert RandKVConfig.coerce(None) is None
    with pytest.raises(ValueError, match="unknown RandKV option"):
        RandKVConfig.coerce({"budgett": 64})
    with pytest.raises(TypeError, match="randkv= takes"):
        RandKVConfig.coerce(64)


def _first_round_evictions(config, prompt, key, head=0):
    return spec.evicted_slots(
        config, prompt_length=prompt, request_key=key, round_index=0, layer=0, kv_head=head
    )


def test_evictions_are_uniform_over_candidates():
    config, prompt = RandKVConfig(budget=20, buffer_size=4, seed=11), 8
    candidates = config.compacted_length - prompt  # 16 slots, 4 evicted each round
    counts = [0] * candidates
    trials = 4000
    for key in range(trials):
        for slot in _first_round_evictions(config, prompt, key):
            counts[slot - prompt] += 1
    assert stats.chisquare(counts).pvalue > 1e-3
    # Pairs too: every 2-subset of 16 is equally likely to be evicted together.
    pairs: dict[tuple[int, int], int] = {}
    for key in range(trials):
        picks = sorted(_first_round_evictions(config, prompt, key))
        for i, a in enumerate(picks):
            for b in picks[i + 1 :]:
                pairs[(a, b)] = pairs.get((a, b), 0) + 1
    assert len(pairs) == candidates * (candidates - 1) // 2
    assert stats.chisquare(list(pairs.values())).pvalue > 1e-3


def test_heads_draw_independently():
    config, prompt = RandKVConfig(budget=40, buffer_size=8), 8
    n, r, trials = config.compacted_length - prompt, config.buffer_size, 1500
    overlaps = [
        len(
            set(_first_round_evictions(config, prompt, key, 0))
            & set(_first_round_evictions(config, prompt, key, 1))
        )
        for key in range(trials)
    ]
    # Independent uniform r-subsets of n overlap hypergeometrically: mean r*r/n.
    expected = r * r / n
    variance = r * (r / n) * ((n - r) / n) * ((n - r) / (n - 1))
    mean = sum(overlaps) / trials
    assert abs(mean - expected) < 4 * (variance / trials) ** 0.5


def test_survival_law_over_rounds():
    config, prompt = RandKVConfig(budget=24, buffer_size=4, seed=5), 8
    q = (config.budget - prompt) / (config.budget - prompt + config.buffer_size)
    trials = 3000
    # Position `prompt` is a candidate from round 0 on: after j rounds it survived j draws.
    for rounds in (1, 2, 4):
        tokens = spec.round_fires_at(config, rounds - 1)
        survived = sum(
            prompt
            in retained_positions(
                config, prompt_length=prompt, tokens_seen=tokens, request_key=k, layer=0, kv_head=0
            )
            for k in range(trials)
        )
        result = stats.binomtest(survived, trials, q**rounds)
        assert result.pvalue > 1e-3, (rounds, survived / trials, q**rounds)


_PROCESS_SCRIPT = """
import json
from randkv import RandKVConfig, retained_positions
from randkv.kernels.planner import plan_round
config = RandKVConfig(budget=30, buffer_size=5, seed=99)
kept = retained_positions(config, prompt_length=7, tokens_seen=120, request_key=2**63 + 5,
                          layer=2, kv_head=3)
plan = plan_round(config, prompt_lengths=[7, 0], request_keys=[1, 2], round_indices=[0, 9],
                  layers=[0, 5], kv_heads=[1, 2])
print(json.dumps({"kept": list(kept), "plan": plan.evicted.tolist()}))
"""


def test_decisions_identical_across_processes_and_hash_seeds():
    outputs = []
    for hash_seed in ("0", "12345", "random"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run(
            [sys.executable, "-c", _PROCESS_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1] == outputs[2]
    config = RandKVConfig(budget=30, buffer_size=5, seed=99)
    expected = retained_positions(
        config, prompt_length=7, tokens_seen=120, request_key=2**63 + 5, layer=2, kv_head=3
    )
    assert outputs[0]["kept"] == list(expected)


def test_worked_example():
    """The worked example in docs/spec.md, row by row."""
    config = RandKVConfig(budget=8, buffer_size=2, seed=0)
    assert spec.request_state(0, 7, 0) == 0x4E6CCAC83849C89A
    assert spec.site_state(0, 0) == 0xA706DD2F4D197E6F
    assert spec.stream_key(0, 7, 0, 0, 0) == 0xABFAF7DBF8715858
    assert spec.draw32(0xABFAF7DBF8715858, 0) == 0x17479E9B
    assert spec.draw32(0xABFAF7DBF8715858, 1) == 0x7B8E10A7
    rows = {
        11: ((0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10), (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)),
        12: ((0, 1, 2, 10, 4, 5, 11, 7, 8, 9), (0, 1, 2, 3, 4, 11, 10, 7, 8, 9)),
        13: ((0, 1, 2, 10, 4, 5, 11, 7, 8, 9, 12), (0, 1, 2, 3, 4, 11, 10, 7, 8, 9, 12)),
        14: ((0, 1, 2, 10, 4, 5, 12, 13, 8, 9), (0, 1, 2, 12, 4, 13, 10, 7, 8, 9)),
        16: ((0, 1, 2, 15, 4, 5, 12, 13, 14, 9), (0, 1, 2, 12, 4, 13, 15, 7, 8, 14)),
    }
    for tokens, heads in rows.items():
        for head, expected in enumerate(heads):
            got = slot_positions(
                config, prompt_length=3, tokens_seen=tokens, request_key=7, layer=0, kv_head=head
            )
            assert got == expected, (tokens, head)


# --------------------------------------------------------------------------- a request's K


def test_a_long_prompt_gets_its_own_budget_under_min_generated():
    config = RandKVConfig(budget=16, buffer_size=4, min_generated=6)
    # A prompt that fits in K - G is served as without the setting: K stays 16.
    assert config.request_budget(10) == 16
    assert config.for_request(10) == RandKVConfig(budget=16, buffer_size=4)
    # Longer prompts keep the whole prompt plus G sampled generated tokens: K = P + G.
    assert config.request_budget(11) == 17
    assert config.request_budget(40) == 46
    assert config.for_request(40) == RandKVConfig(budget=46, buffer_size=4)
    # Off (the default), a prompt over K is refused, and the message names the setting.
    with pytest.raises(PromptTooLongError, match="K=16; serve such prompts with min_generated"):
        RandKVConfig(budget=16, buffer_size=4).request_budget(17)


@given(
    st.integers(1, 40),
    st.integers(1, 8),
    st.integers(1, 20),
    st.integers(0, 120),
    st.integers(0, 2**64 - 1),
)
@settings(max_examples=150, deadline=None)
def test_long_prompt_decisions_follow_the_step_by_step_cadence(budget, r, g, prompt, key):
    """A request's own K (max(K, P + G)) drives every spec function: the cadence of a
    simulation with that K, the whole prompt kept, G + r generated tokens after a round."""
    config = RandKVConfig(budget=budget, buffer_size=r, min_generated=g)
    own = max(budget, prompt + g)
    tokens = prompt + 5 * (own + 2 * r)
    length = rounds = 0
    for _ in range(tokens):
        length += 1
        if length == own + 2 * r:
            length -= r
            rounds += 1
    assert physical_length(config, prompt_length=prompt, tokens_seen=tokens) == length
    assert num_rounds(config, prompt_length=prompt, tokens_seen=tokens) == rounds
    kept = retained_positions(
        config, prompt_length=prompt, tokens_seen=tokens, request_key=key, layer=1, kv_head=2
    )
    assert set(range(prompt)) <= set(kept) and len(kept) == length
    generated = [p for p in kept if p >= prompt]
    if rounds:
        assert len(generated) >= g + r


def test_a_request_asks_for_its_own_budget_within_the_servers_range():
    config = RandKVConfig(budget=32, buffer_size=4, max_request_budget=64)
    assert config.request_budget(10) == 32
    assert config.request_budget(10, 64) == 64
    assert config.request_budget(10, 12) == 12
    assert config.for_request(10, 48) == RandKVConfig(budget=48, buffer_size=4)
    with pytest.raises(ValueError, match=r"randkv_budget must be in \[1, 64\].*got 65"):
        config.request_budget(10, 65)
    with pytest.raises(ValueError, match=r"must be an integer in \[1, 64\], got bool True"):
        config.request_budget(10, True)
    with pytest.raises(PromptTooLongError, match="K=12"):
        config.request_budget(13, 12)
    # Without max_request_budget a request may ask for less than K, never more.
    with pytest.raises(ValueError, match=r"\[1, 32\]"):
        RandKVConfig(budget=32, buffer_size=4).request_budget(1, 33)
    with pytest.raises(ValueError, match=r"max_request_budget must be in \[32, "):
        RandKVConfig(budget=32, max_request_budget=16)
