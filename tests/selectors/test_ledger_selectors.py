"""The second study's comparators: one shared RandKV draw per layer, R-KV and the Belady
oracle, each against a hand-computed or loop-by-loop reference; and forced decoding through
RandKVCache against dense teacher forcing."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from transformers import AutoModelForCausalLM

import randkv.hf as rh
from randkv import RandKVConfig
from randkv.models.tiny import PAD_ID
from randkv.selectors import RandKV, RoundView
from randkv.selectors.oracle import Belady, Need
from randkv.selectors.randkv import SharedRandKV
from randkv.selectors.rkv import RKV

CONFIG = RandKVConfig(budget=12, buffer_size=2, seed=1)  # K + r = 14 candidates, r = 2 go
left_pad = partial(rh.left_pad, pad_id=PAD_ID)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def view(n: int = 1, layers: int = 2, heads: int = 2, **fields: torch.Tensor) -> RoundView:
    return RoundView(
        config=CONFIG,
        rows=torch.arange(n),
        round_indices=torch.zeros(n, dtype=torch.int64),
        prompt_lengths=torch.full((n,), 2, dtype=torch.int64),
        request_keys=torch.arange(n, dtype=torch.int64) + 7,
        layers=tuple(range(layers)),
        kv_heads=tuple(range(heads)),
        device=torch.device("cpu"),
        **fields,
    )


def test_shared_draw_is_head_zero_of_randkv_in_every_head():
    v = view(n=3, heads=4)
    independent = RandKV().select(v)
    shared = SharedRandKV().select(v)
    assert SharedRandKV().name == "randkv-shared" and SharedRandKV().random
    for head in range(4):
        assert torch.equal(shared[:, :, head], independent[:, :, 0])
    assert not torch.equal(independent[:, :, 0], independent[:, :, 1])  # heads do differ


def _rkv_reference(votes, keys, positions, lam, kernel, threshold):
    """R-KV's score of one head, written as loops over tokens."""
    n = len(positions)
    order = sorted(range(n), key=lambda s: positions[s])
    pooled = [0.0] * n
    for rank, s in enumerate(order):
        near = order[max(0, rank - kernel // 2) : rank + kernel // 2 + 1]
        pooled[s] = max(votes[t] for t in near)
    mean_sim = []
    for i in range(n):
        sims = [
            0.0 if i == j else float(torch.nn.functional.cosine_similarity(keys[i], keys[j], 0))
            for j in range(n)
        ]
        similar = [j for j in range(n) if sims[j] > threshold]
        if similar:
            sims[max(similar, key=lambda j: positions[j])] = 0.0
        mean_sim.append(sum(sims) / n)
    redundancy = torch.tensor(mean_sim).softmax(0)
    return [lam * pooled[s] - (1 - lam) * float(redundancy[s]) for s in range(n)]


def test_rkv_score_matches_a_loop_reference():
    torch.manual_seed(0)
    slots = CONFIG.max_physical_length
    positions = torch.stack([torch.randperm(slots) for _ in range(4)]).view(1, 2, 2, slots)
    attention = torch.rand(1, 2, 2, slots)
    keys = torch.randn(1, 2, 2, slots, 8)
    keys[..., 3, :] = keys[..., 5, :] * 2  # an exact duplicate direction
    v = view(positions=positions, attention=attention, keys=keys)
    policy = RKV()
    got = policy.score(v)
    limit = CONFIG.compacted_length
    for layer in range(2):
        for head in range(2):
            want = _rkv_reference(
                attention[0, layer, head, :limit].tolist(),
                keys[0, layer, head, :limit],
                positions[0, layer, head, :limit].tolist(),
                policy.lam,
                policy.kernel,
                policy.threshold,
            )
            assert got[0, layer, head].tolist() == pytest.approx(want, abs=1e-6)
    assert policy.select(v).shape == (1, 2, 2, CONFIG.buffer_size)


def test_belady_keeps_the_newest_copy_needed_soonest():
    slots = CONFIG.max_physical_length  # 16; positions 0..15 in slot order, now = 15
    positions = torch.arange(slots).view(1, 1, 1, slots)
    future = (
        (
            Need(20, ((4,), (9,))),  # two copies: 9 serves, 4 is spare
            Need(30, ((6, 7),)),  # a two-token copy needed later
            Need(10, ((3,),)),  # in the past: ignored
        ),
    )
    oracle = Belady(future=future)
    scores = oracle.score(view(layers=1, heads=1, positions=positions))[0, 0, 0]
    assert scores[9] == pytest.approx(1 / 6) and scores[6] == scores[7] == pytest.approx(1 / 16)
    assert max(scores[s] for s in range(slots) if s not in (6, 7, 9)) < 0
    # Unneeded tokens go oldest first; the prompt (slots 0, 1) is protected.
    evicted = sorted(oracle.select(view(layers=1, heads=1, positions=positions)).flatten().tolist())
    assert evicted == [2, 3]


@pytest.fixture(scope="module")
def eager(tiny_model_path: str):
    return AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def test_forced_decode_writes_forced_tokens_and_greedy_elsewhere(eager):
    prompts = [list(b"ledger"), list(b"hi")]
    ids, mask = left_pad(prompts)
    steps = 12
    forced = torch.full((2, steps), -1, dtype=torch.long)
    forced[:, ::3] = ord("x")
    big = RandKVConfig(budget=64, buffer_size=4, seed=0)  # no round is reached: dense
    cache = rh.RandKVCache.from_inputs(eager, ids, mask, randkv=big)
    out = rh.forced_decode(eager, ids, mask, forced, cache=cache)
    assert (out[:, ::3] == ord("x")).all()
    for b, prompt in enumerate(prompts):  # every greedy token is the dense argmax
        text = prompt + out[b].tolist()
        with torch.inference_mode():
            logits = eager(input_ids=torch.tensor([text])).logits[0]
        for step in range(steps):
            if forced[b, step] < 0:
                assert int(logits[len(prompt) + step - 1].argmax()) == out[b, step]
