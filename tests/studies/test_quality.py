"""The quality benchmark: task generator vs an independent checker, evictor budgets and rules
against hand-computed oracles, statistics against scipy, and a tiny end-to-end evaluation.

CPU only, no network: models are the tiny random-weight checkpoint or a fresh random init.
"""

from __future__ import annotations

import inspect
import json
import random
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

import randkv.hf as rh
from randkv import RandKVConfig, spec
from randkv.models.tiny import PAD_ID
from randkv.selectors import H2O, TOVA, AttentionStep, RoundView, Selector, SnapKV
from randkv.selectors.registry import make_selector
from studies.arms import DENSE
from studies.pointer import evaluate as quality_eval
from studies.pointer.checker import check_answer, parse_prompt
from studies.pointer.evaluate import COMPARED
from studies.pointer.task import TaskConfig, make_problem, make_problems
from studies.stats import paired_comparison, sign_test, wilson_interval

left_pad = partial(rh.left_pad, pad_id=PAD_ID)
CONFIG = RandKVConfig(budget=24, buffer_size=4, seed=3)
PROMPTS = [list(b"RandKV quality"), list(b"hi"), list(b"the quick brown fox")]
NEW_TOKENS = 60  # 8 to 10 rounds per row
SELECTORS = [name for name in COMPARED if name != "randkv"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ckpt(tiny_model_path: str) -> Path:
    return Path(tiny_model_path)


@pytest.fixture(scope="module")
def eager(ckpt: Path):
    return AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    ).eval()


# --------------------------------------------------------------------------- task and checker


def test_checker_on_a_hand_worked_problem():
    # A -> B -> A; digits A=1, B=2. Tallies: A 1, B 2, A 2, B 4, A 3.
    prompt = "A1b B2a |A\n"
    assert parse_prompt(prompt) == ({"A": (1, "B"), "B": (2, "A")}, "A")
    assert check_answer(prompt, "A11 B22 A12 B24 A13 ", 5, tally=True).exact
    wrong = check_answer(prompt, "A11 B22 A11 B24 A13 ", 5, tally=True)
    assert not wrong.exact and wrong.hops_correct == 2
    assert check_answer(prompt, "A11 B22", 3, tally=True).hops_correct == 1  # ends early
    # Pointer chain: each hop copies the key's whole fact.
    assert check_answer(prompt, "A1b B2a A1b B2a A1b ", 5).exact
    assert check_answer(prompt, "A1b B2a A1b B2a A1b ", 5, tally=True).hops_correct == 0
    wrong = check_answer(prompt, "A1b B2a A1b B2b A1b ", 5)
    assert not wrong.exact and wrong.hops_correct == 3
    assert check_answer(prompt, "A11 B22 A12 ", 3).hops_correct == 0  # a tally is not a pointer
    # A 3-cycle walked from C: C -> A -> B -> C.
    assert check_answer("B7c A0b C5a |C\n", "C5a A0b B7c C5a ", 4).exact
    with pytest.raises(ValueError):
        parse_prompt("A1b A2a |A\n")  # two facts for one key


@pytest.mark.parametrize("tally", [False, True])
@pytest.mark.parametrize("num_keys,hops", [(1, 5), (4, 40), (12, 64), (26, 200)])
def test_generator_answers_pass_the_independent_checker(num_keys, hops, tally):
    task = TaskConfig(num_keys=num_keys, hops=hops, tally=tally)
    for problem in make_problems(5, 20, task):
        assert len(problem.prompt) == task.prompt_chars
        assert len(problem.target) == task.answer_chars
        facts, start = parse_prompt(problem.prompt)
        assert len(facts) == num_keys
        assert sorted(n for _, n in facts.values()) == sorted(facts)  # a permutation
        assert check_answer(problem.prompt, problem.target, hops, tally=tally).exact
        assert not check_answer(problem.prompt, problem.target, hops, tally=not tally).exact
        # Walking the pointers from the start returns to it after cycle_length hops.
        key = start
        for _ in range(problem.cycle_length):
            key = facts[key][1]
        assert key == start
        assert problem.final_answer == problem.target[-4:-1]


@pytest.mark.parametrize("tally", [False, True])
def test_checker_catches_every_single_character_corruption(tally):
    problem = make_problem(9, 3, TaskConfig(num_keys=8, hops=30, tally=tally))
    rng = random.Random(0)
    for position in rng.sample(range(len(problem.target)), 40):
        old = problem.target[position]
        new = rng.choice([c for c in "AB0123456789 xyZ" if c != old])
        bad = problem.target[:position] + new + problem.target[position + 1 :]
        result = check_answer(problem.prompt, bad, 30, tally=tally)
        assert not result.exact
        assert result.hops_correct == position // 4


# Pinned problem 0 of family 0 with 4 keys and 3 hops (task v3); checked by hand: Z -> K -> Z,
# tallies Z 8, K 5, Z (8 + 8) mod 10 = 6.
PINNED_PROMPT = "K5z C2v V2c Z8k |Z\n"
PINNED_TARGET = "Z8k K5z Z8k "
PINNED_TALLY = "Z88 K55 Z86 "


def test_generator_is_seeded_and_versioned():
    task = TaskConfig(num_keys=10, hops=20)
    assert make_problem(1, 2, task) == make_problem(1, 2, task)
    assert make_problem(1, 2, task).prompt != make_problem(1, 3, task).prompt
    assert make_problem(1, 2, task).prompt != make_problem(2, 2, task).prompt
    # Pinned: a change here means TASK_VERSION must be bumped.
    pinned = make_problem(0, 0, TaskConfig(num_keys=4, hops=3))
    assert pinned.prompt == PINNED_PROMPT and pinned.target == PINNED_TARGET
    # The knob changes the answer, never the prompt.
    tally = make_problem(0, 0, TaskConfig(num_keys=4, hops=3, tally=True))
    assert tally.prompt == PINNED_PROMPT and tally.target == PINNED_TALLY


# --------------------------------------------------------------------------- statistics


def test_statistics_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k, n in [(0, 10), (3, 10), (50, 100), (128, 128)]:
        ci = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    diffs = [1] * 9 + [-1] * 2 + [0] * 5
    p, better, worse = sign_test(diffs)
    assert (better, worse) == (9, 2)
    assert p == pytest.approx(stats.binomtest(9, 11).pvalue, abs=1e-12)
    paired = paired_comparison([1, 1, 0, 0], [1, 0, 0, 0])
    assert paired["mean_difference"] == -0.25 and paired["problems_worse"] == 1


# --------------------------------------------------------------------------- evictors


@dataclass(frozen=True)
class _SpecSelector(Selector):
    """A selector that asks the spec, one (row, layer, head) at a time, from what the view
    says: must reproduce selector=None bit for bit."""

    def select(self, view):
        def holes(row: int, layer: int, head: int) -> tuple[int, ...]:
            return spec.evicted_slots(
                view.config,
                prompt_length=int(view.prompt_lengths[row]),
                request_key=int(view.request_keys[row]) & spec.MASK64,
                round_index=int(view.round_indices[row]),
                layer=layer,
                kv_head=head,
            )

        rows = range(len(view.rows))
        table = [[[holes(b, i, h) for h in view.kv_heads] for i in view.layers] for b in rows]
        return torch.tensor(table, dtype=torch.int64)


def test_selector_path_reproduces_randkv_exactly(eager):
    ids, mask = left_pad(PROMPTS)
    plain = rh.generate(eager, ids, mask, randkv=CONFIG, max_new_tokens=NEW_TOKENS)
    cache = rh.RandKVCache.from_inputs(eager, ids, mask, randkv=CONFIG, selector=_SpecSelector())
    routed = rh.generate(eager, ids, mask, randkv=None, cache=cache, max_new_tokens=NEW_TOKENS)
    assert torch.equal(plain, routed)
    assert cache.rounds_applied > 0


def _generate_with(eager, name: str):
    ids, mask = left_pad(PROMPTS)
    evictor = make_selector(name)
    cache = rh.RandKVCache.from_inputs(eager, ids, mask, randkv=CONFIG, selector=evictor)
    with rh.attention_hooks(eager, cache, evictor):
        out = rh.generate(eager, ids, mask, randkv=None, cache=cache, max_new_tokens=NEW_TOKENS)
    return ids, out, cache


def _dense_layer0_keys(eager, sequence: list[int]) -> torch.Tensor:
    """Layer-0 keys (after RoPE) of every position: a function of token and position only."""
    dense = DynamicCache(config=eager.config)
    params = inspect.signature(eager.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in 5.24
    with torch.inference_mode():
        eager(torch.tensor([sequence]), **{cache_kw: dense}, use_cache=True)
    return dense.layers[0].keys[0]  # (kv_heads, T, head_dim)


@pytest.mark.parametrize("name", SELECTORS)
def test_evictors_keep_exactly_their_budget(eager, name):
    """After the run, every (row, layer, head) holds exactly K + r - 1 + 1 distinct tokens per
    the cadence, whose layer-0 keys are the dense keys of the positions it claims to hold."""
    ids, out, cache = _generate_with(eager, name)
    evictor = make_selector(name)
    k, r = CONFIG.budget, CONFIG.buffer_size
    for row, prompt in enumerate(PROMPTS):
        sequence = prompt + out[row, ids.shape[1] :].tolist()
        seen = cache.tokens_seen(row)
        assert seen == len(sequence) - 1  # the last token was never fed back
        # Cadence: physical length K + r + ((T - K - 2r) mod r) once rounds have fired.
        want_length = k + r + (seen - k - 2 * r) % r
        dense_keys = _dense_layer0_keys(eager, sequence[:seen])
        for layer in range(cache.num_layers):
            for head in range(cache.num_kv_heads):
                held = cache.retained_positions(row, layer, head)
                assert len(held) == len(set(held)) == want_length
                assert set(range(seen - r, seen)) <= set(held)  # the r newest stay
                if evictor.protects_prompt:
                    assert set(range(len(prompt))) <= set(held)
                if layer == 0:
                    keys, _ = cache.kv(row, 0)
                    slots = cache.slot_positions(row, 0, head)
                    torch.testing.assert_close(
                        keys[head], dense_keys[head, list(slots)], atol=1e-5, rtol=0
                    )


@pytest.mark.parametrize("name", ["streamingllm", "window"])
def test_recency_evictors_keep_the_oracle_sets(eager, name):
    ids, out, cache = _generate_with(eager, name)
    k, r = CONFIG.budget, CONFIG.buffer_size
    for row, prompt in enumerate(PROMPTS):
        seen = cache.tokens_seen(row)
        length = k + r + (seen - k - 2 * r) % r
        pinned = 4 if name == "streamingllm" else len(prompt)
        want = set(range(pinned)) | set(range(seen - (length - pinned), seen))
        for layer in range(cache.num_layers):
            for head in range(cache.num_kv_heads):
                assert set(cache.retained_positions(row, layer, head)) == want


def test_randkv_noprompt_draws_over_the_prompt_too(eager):
    """Over a run, the ablation evicts prompt tokens somewhere; RandKV never does."""
    ids, out, cache = _generate_with(eager, "randkv-noprompt")
    lost = 0
    for row, prompt in enumerate(PROMPTS):
        for layer in range(cache.num_layers):
            for head in range(cache.num_kv_heads):
                held = set(cache.retained_positions(row, layer, head))
                lost += len(set(range(len(prompt))) - held)
    assert lost > 0


def _choose(policy, positions: torch.Tensor, prompt: int, query_slots, weights) -> torch.Tensor:
    """Feed layer-0 `weights` to the policy as the cache does, then let it choose a round."""
    rows, layers, heads, cap = positions.shape
    statistic = torch.zeros(rows, layers, heads, cap)
    for w in weights:
        policy.observe(AttentionStep(CONFIG, 0, w, query_slots, heads), statistic[:, 0])
    view = RoundView(
        config=CONFIG,
        rows=torch.arange(rows),
        round_indices=torch.zeros(rows, dtype=torch.int64),
        prompt_lengths=torch.full((rows,), prompt),
        request_keys=torch.zeros(rows, dtype=torch.int64),
        layers=tuple(range(layers)),
        kv_heads=tuple(range(heads)),
        device=torch.device("cpu"),
        positions=positions,
        attention=statistic,
    )
    return policy.select(view)


def _oracle_lowest(scores: list[float], allowed: list[int], count: int) -> list[int]:
    return sorted(sorted(allowed), key=lambda s: scores[s])[:count]


def test_scored_selection_rules_against_python_oracles():
    """H2O, SnapKV and TOVA on synthetic attention, against plain-Python recomputations."""
    rng = torch.Generator().manual_seed(0)
    k, r, cap = CONFIG.budget, CONFIG.buffer_size, CONFIG.max_physical_length
    prompt = 5
    # One row, one layer, two KV heads (two query heads each); slots hold shuffled positions.
    perm = torch.cat([torch.arange(prompt), prompt + torch.randperm(cap - prompt, generator=rng)])
    positions = torch.stack([perm, perm.flip(0).roll(prompt)])[None, None].clone()
    positions[0, 0, 1, :prompt] = torch.arange(prompt)
    positions[0, 0, 1, prompt:] = prompt + torch.randperm(cap - prompt, generator=rng)
    weights = [torch.rand(1, 4, 1, cap, generator=rng) for _ in range(r)]
    query_slots = torch.tensor([[cap - 1]])
    sums = sum(w[0] for w in weights)  # (4, 1, cap)
    group = [(sums[0, 0] + sums[1, 0]).tolist(), (sums[2, 0] + sums[3, 0]).tolist()]

    chosen = _choose(H2O(), positions, prompt, query_slots, weights)[0, 0]
    for head in range(2):
        pos = positions[0, 0, head].tolist()
        candidates = list(range(prompt, k + r))
        recent = int((k + r - prompt) * 0.5) - r
        newest = sorted(candidates, key=lambda s: -pos[s])[:recent]
        allowed = [s for s in candidates if s not in newest]
        assert chosen[head].tolist() == _oracle_lowest(group[head], allowed, r)

    # The query sits in a buffer slot, so every step votes.
    chosen = _choose(SnapKV(kernel=3), positions, prompt, query_slots, weights)[0, 0]
    for head in range(2):
        pos = positions[0, 0, head].tolist()
        by_position = {p: group[head][s] for s, p in enumerate(pos)}
        # Average of the three neighbours in position order; missing neighbours count as 0.
        pooled = [sum(by_position.get(pos[s] + d, 0.0) for d in (-1, 0, 1)) / 3 for s in range(cap)]
        assert chosen[head].tolist() == _oracle_lowest(pooled, list(range(prompt, k + r)), r)

    chosen = _choose(TOVA(), positions, prompt, query_slots, weights)[0, 0]
    last = weights[-1][0, :, 0].mean(0).tolist()
    for head in range(2):
        assert chosen[head].tolist() == _oracle_lowest(last, list(range(prompt, k + r)), r)


# --------------------------------------------------------------------------- end to end


def test_tiny_evaluation_runs_every_evictor(tmp_path, ckpt):
    config = quality_eval.EvalConfig(
        budgets=(28, 40),
        buffer=4,
        seeds=(0, 1),
        problems=3,
        num_keys=6,
        hops=12,
        batch_size=2,
        threads=1,
    )
    result = quality_eval.evaluate(config, model_path=ckpt, out_dir=tmp_path, show_progress=False)
    saved = json.loads((tmp_path / "quality.json").read_text())
    assert saved["schema_version"] == quality_eval.SCHEMA_VERSION
    assert (tmp_path / "quality.png").stat().st_size > 1000
    table = (tmp_path / "quality.md").read_text()
    assert "| randkv |" in table and "| h2o |" in table and "K = 40" in table
    names = {(row["evictor"], row["budget"]) for row in saved["results"]}
    assert (DENSE, None) in names
    for name in COMPARED:
        for budget in (28, 40):
            assert (name, budget) in names
    for row in saved["results"]:
        assert 0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1
        if row["evictor"] not in (DENSE, "randkv"):
            assert "vs_randkv" in row
    seeds = {(run["evictor"], run["seed"]) for run in saved["per_problem"]}
    assert ("randkv", 1) in seeds and ("h2o", None) in seeds
    assert result["results"] == saved["results"]


def test_pointer_holm_and_cycle_strata_from_a_stored_result():
    from studies.pointer.strata import add_holm, by_cycle_length

    result = {
        "task": {"cycle_lengths": [1, 2, 3, 8]},
        "results": [
            {"evictor": "randkv", "budget": 40},
            {"evictor": "h2o", "budget": 40, "vs_randkv": {"sign_test_p": 0.01}},
            {"evictor": "tova", "budget": 40, "vs_randkv": {"sign_test_p": 0.04}},
            {"evictor": "window", "budget": 40, "vs_randkv": {"sign_test_p": 0.03}},
        ],
        "per_problem": [
            {"evictor": "randkv", "budget": 40, "seed": 0, "exact": [1, 0, 1, 1]},
            {"evictor": "randkv", "budget": 40, "seed": 1, "exact": [1, 1, 0, 1]},
            {"evictor": "h2o", "budget": 40, "seed": None, "exact": [0, 0, 1, 0]},
        ],
    }
    assert add_holm(result) == 3
    # Holm by hand: sorted p 0.01, 0.03, 0.04 -> 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 0.04).
    got = [row["vs_randkv"]["holm_p"] for row in result["results"][1:]]
    assert got == pytest.approx([0.03, 0.06, 0.06])
    rows = {(r["evictor"], tuple(r["cycles"])): r for r in by_cycle_length(result)}
    assert rows[("randkv", (1, 2))]["accuracy"] == pytest.approx(0.75)  # (1 + 0.5) / 2
    assert rows[("randkv", (3, 4))]["accuracy"] == pytest.approx(0.5)
    assert rows[("randkv", (7, 10))]["problems"] == 1
    assert ("randkv", (5, 6)) not in rows
    assert rows[("h2o", (1, 2))]["accuracy"] == 0.0
