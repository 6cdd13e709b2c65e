"""The vectorised cadence helper against the spec, on ints, numpy arrays and torch tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from randkv import spec
from randkv.spec.cadence import latest_round_index, physical_lengths, rounds_completed
from randkv.spec.config import RandKVConfig

CONFIGS = [
    RandKVConfig(budget=8, buffer_size=2),
    RandKVConfig(budget=40, buffer_size=8),
    RandKVConfig(budget=5, buffer_size=7),
]


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
def test_cadence_matches_the_spec_elementwise(config: RandKVConfig) -> None:
    seen = list(range(0, 6 * config.max_physical_length))
    prompt = 3
    expected_rounds = [spec.num_rounds(config, prompt_length=prompt, tokens_seen=t) for t in seen]
    expected_physical = [
        spec.physical_length(config, prompt_length=prompt, tokens_seen=t) for t in seen
    ]
    as_numpy = np.array(seen, dtype=np.int64)
    as_torch = torch.tensor(seen, dtype=torch.int64)
    assert [rounds_completed(config, t) for t in seen] == expected_rounds
    assert [physical_lengths(config, t) for t in seen] == expected_physical
    assert rounds_completed(config, as_numpy).tolist() == expected_rounds
    assert physical_lengths(config, as_numpy).tolist() == expected_physical
    assert rounds_completed(config, as_torch).tolist() == expected_rounds
    assert physical_lengths(config, as_torch).tolist() == expected_physical
    assert latest_round_index(config, as_torch).tolist() == [n - 1 for n in expected_rounds]


def test_cadence_keeps_large_counts_exact() -> None:
    config = RandKVConfig(budget=2048, buffer_size=64)
    seen = 2048 + 128 + 64 * (2**33) + 5  # a round index above 2**32
    assert rounds_completed(config, torch.tensor([seen])).item() == spec.num_rounds(
        config, prompt_length=0, tokens_seen=seen
    )
    assert physical_lengths(config, np.array([seen]))[0] == spec.physical_length(
        config, prompt_length=0, tokens_seen=seen
    )
