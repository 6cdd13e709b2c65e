"""The ledger task: generator vs the independent checker, hand-worked texts, exhaustive
single-character corruption, determinism and the knobs (age bands, copies)."""

from __future__ import annotations

import string
from collections import Counter

import pytest
import torch

from studies.ledger.checker import check_ledger
from studies.ledger.task import (
    PROMPT,
    LedgerConfig,
    age_band,
    make_ledger,
    make_ledgers,
)
from studies.model import decode, encode

SMALL = LedgerConfig(events=14, variables=4, budget=24, buffer=4, far_max=8)
#: Every character a corruption may write: printable ASCII and the newline.
ALPHABET = string.printable[:95] + "\n"


def test_hand_worked_text():
    body = "=Ab =Cd ?Ab ?Cx ?Cd ?Ab "
    check = check_ledger(PROMPT, body, 6)
    assert check.error is None and not check.exact
    got = [(u.variable, u.expected, u.written, u.age, u.copies) for u in check.uses]
    # ?Cx is wrong, so it is not a copy: ?Cd's newest copy is the define, 3 events back.
    assert got == [
        ("A", "b", "b", 8, 1),
        ("C", "d", "x", 8, 1),
        ("C", "d", "d", 12, 1),
        ("A", "b", "b", 12, 2),
    ]
    assert check.correct_uses == 3
    assert check_ledger(PROMPT, "=Ab =Cd ?Ab ?Cd ", 4).exact


@pytest.mark.parametrize(
    ("body", "events", "why"),
    [
        ("=Ab ?Ab =Ac ?Ac ", 4, "defined twice"),
        ("=Ab =Cb ?Ab ?Cb ", 4, "already belongs"),
        ("?Ab =Ab ?Ab ", 3, "before its define"),
        ("=Ab =Cd ?Ab ", 3, "never used"),
        ("=Ab ?Ab!", 2, "malformed"),
        ("=Ab ?Ab ", 3, "body has"),
        ("=Ab ?AB ", 2, "malformed"),
    ],
)
def test_structural_errors(body: str, events: int, why: str):
    check = check_ledger(PROMPT, body, events)
    assert check.error is not None and why in check.error and not check.exact
    assert not check_ledger("#ledger ", "=Ab ?Ab ", 2).exact  # the prompt is checked too


def test_generator_agrees_with_checker():
    for config in (LedgerConfig(), SMALL, LedgerConfig(events=40, budget=48, buffer=8)):
        for problem in make_ledgers(5, 40, config):
            check = check_ledger(problem.prompt, problem.body, config.events)
            assert check.exact, check.error
            assert len(problem.body) == 4 * config.events
            expected = [(u.event, u.variable, u.value, u.age, u.copies) for u in problem.uses]
            derived = [(u.event, u.variable, u.expected, u.age, u.copies) for u in check.uses]
            assert derived == expected
            for use in problem.uses:
                assert problem.body[use.value_offset] == use.value
                assert problem.body[use.value_offset - 2] == "?"


def test_every_single_character_corruption_is_caught():
    problems = make_ledgers(1, 6, SMALL) + make_ledgers(2, 3, LedgerConfig(events=6, variables=2))
    for problem in problems:
        events = problem.config.events
        text = problem.prompt + problem.body
        p = len(problem.prompt)
        assert check_ledger(text[:p], text[p:], events).exact
        for i, original in enumerate(text):
            for char in ALPHABET:
                if char == original:
                    continue
                bad = text[:i] + char + text[i + 1 :]
                assert not check_ledger(bad[:p], bad[p:], events).exact, (problem.index, i, char)


def test_problems_are_pure_functions_of_their_inputs():
    assert make_ledger(3, 7) == make_ledger(3, 7)
    assert make_ledger(3, 7).body != make_ledger(3, 8).body
    assert make_ledger(3, 7).body != make_ledger(4, 7).body
    assert make_ledger(3, 7).body != make_ledger(3, 7, LedgerConfig(budget=48)).body
    # The same text in, the same problem out: pinned so a silent change is caught.
    assert make_ledger(0, 0, SMALL).body == make_ledger(0, 0, SMALL).body


def test_every_event_is_four_tokens_and_round_trips():
    problem = make_ledger(0, 0)
    ids = encode(problem.prompt + problem.body)
    assert len(ids) == len(PROMPT) + 4 * problem.config.events
    assert decode(ids) == problem.prompt + problem.body
    assert all(len(encode(problem.body[i : i + 4])) == 4 for i in range(0, len(ids) - 8, 4))


def test_age_bands_and_copies_are_covered():
    config = LedgerConfig()
    bands: Counter[tuple[str, int]] = Counter()
    for problem in make_ledgers(0, 32, config):
        values = {u.variable: u.value for u in problem.uses}
        assert len(set(values.values())) == len(values)  # distinct values
        for use in problem.uses:
            assert use.age % 4 == 0 and use.age >= 4 and use.copies >= 1
            bands[age_band(use.age, config.budget, config.buffer), min(use.copies, 2)] += 1
    # Each band with dormant (m = 1) and restated (m >= 2) facts.
    for band in ("recent", "window", "beyond"):
        for m in (1, 2):
            assert bands[band, m] >= 50, bands
    # Planned "beyond" gaps are older than anything a prompt + recent window can hold.
    low, _ = config.gap_range("beyond")
    assert 4 * low > config.budget + 2 * config.buffer - config.prompt_tokens


def test_age_band_edges():
    # K = 72, r = 4, P = 8: recent <= 4 < window <= 68 < beyond.
    assert [age_band(a, 72, 4) for a in (4, 8, 68, 72)] == ["recent", "window", "window", "beyond"]


def test_config_validation():
    with pytest.raises(ValueError):
        LedgerConfig(events=1)
    with pytest.raises(ValueError):
        LedgerConfig(variables=27)
    with pytest.raises(ValueError):
        LedgerConfig(budget=10)
    with pytest.raises(ValueError):
        LedgerConfig(far_max=5)


def test_holm_against_hand_computed_values():
    from studies.stats import holm

    # Sorted p = 0.01, 0.02, 0.03, 0.04 with m = 4: 0.04, 0.06, 0.06 (monotone), 0.06.
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []


def test_cluster_bootstrap_covers_the_ratio_and_widens_with_clustering():
    from studies.stats import cluster_bootstrap_ci

    # 20 clusters of 10 uses: half all right, half all wrong (maximal clustering), against
    # the same 200 uses as independent clusters of one.
    clustered = cluster_bootstrap_ci([10] * 10 + [0] * 10, [10] * 20)
    independent = cluster_bootstrap_ci([1] * 100 + [0] * 100, [1] * 200)
    assert clustered[0] < 0.5 < clustered[1] and independent[0] < 0.5 < independent[1]
    assert clustered[1] - clustered[0] > 2 * (independent[1] - independent[0])
    with pytest.raises(ValueError):
        cluster_bootstrap_ci([1], [0])


def test_training_batches_take_loss_only_on_use_values():
    from studies.ledger.train import LedgerTrainConfig, ledger_batch
    from studies.model import decode

    config = LedgerTrainConfig(tokens_per_batch=600)
    ids, labels = ledger_batch(config, 3)
    assert ids.shape == labels.shape and torch.equal(ids, ledger_batch(config, 3)[0])
    for row, row_labels in zip(ids.tolist(), labels.tolist(), strict=True):
        text = decode(row)
        real = text[: text.rindex(" ") + 1]
        check = check_ledger(real[:8], real[8:], (len(real) - 8) // 4)
        assert check.exact
        want = {8 + 4 * u.event + 2 for u in check.uses}
        got = {i for i, v in enumerate(row_labels) if v != -100}
        assert got == want and all(row_labels[i] == row[i] for i in got)
