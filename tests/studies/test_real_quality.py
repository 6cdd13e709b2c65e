"""The real-model study's machinery on SmolLM2-135M-Instruct (short shapes; the full run is
`python -m studies eval --task real`): chunked scoring against token-by-token decoding and a
plain forward, the planted facts, and a short end-to-end evaluation."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from randkv.hf import RandKVCache, forced_decode, teacher_forced_logprobs  # noqa: E402
from randkv.hf.scoring import score_sequences  # noqa: E402
from randkv.selectors.registry import make_selector  # noqa: E402
from randkv.spec.config import RandKVConfig  # noqa: E402

PROMPT = 16
CONFIG = RandKVConfig(budget=48, buffer_size=8, seed=0)


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from randkv.models.shipped import ModelFetchError, fetch_model

    try:
        folder = fetch_model()
    except ModelFetchError as error:
        pytest.skip(f"SmolLM2 not available: {error}")
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def text_ids(smol):
    _, tokenizer = smol
    text = (
        "The lighthouse keeper climbed the stairs every evening to light the lamp. "
        "Ships passed in the night, and the sea was never quiet. One morning he found a "
        "bottle on the rocks with a letter inside, written in a hand he did not know. "
    ) * 4
    ids = tokenizer.encode(text, add_special_tokens=False)[:160]
    return torch.tensor([ids, ids[::-1]])


def _cache(model, rows, name):
    return RandKVCache(
        model,
        CONFIG,
        request_keys=[f"row{b}" for b in range(rows)],
        prompt_lengths=[PROMPT] * rows,
        selector=make_selector(name),
    )


def _scored(model, ids, name):
    cache = _cache(model, ids.shape[0], name)
    nll = torch.full(ids.shape, float("nan"))

    def on_chunk(start, logprobs):
        at = slice(start + 1, start + 1 + logprobs.shape[1])
        nll[:, at] = -logprobs.gather(-1, ids[:, at, None])[..., 0]

    score_sequences(model, ids, cache, on_chunk)
    return cache, nll


@pytest.mark.parametrize("name", ["randkv", "tova", "h2o"])
def test_chunked_scoring_keeps_what_token_by_token_decoding_keeps(smol, text_ids, name):
    model, _ = smol
    chunked, _ = _scored(model, text_ids, name)
    stepped = _cache(model, text_ids.shape[0], name)
    forced_decode(model, text_ids[:, :PROMPT], None, text_ids[:, PROMPT:].clone(), cache=stepped)
    assert chunked.rounds(0) == stepped.rounds(0) >= 8
    same = (chunked.positions == stepped.positions).float().mean().item()
    # RandKV and TOVA never read near-tied float scores the same way twice; H2O sums attention
    # over queries in another order, so a near-tie may flip (about 1 slot in 10^4 measured).
    assert same == 1.0 if name != "h2o" else same > 0.995


def test_chunked_nll_equals_the_batch1_reference(smol, text_ids):
    """`teacher_forced_logprobs` (one token per forward, batch 1) is the oracle."""
    model, _ = smol
    _, nll = _scored(model, text_ids, "randkv")
    ids = text_ids[0].tolist()
    reference = teacher_forced_logprobs(
        model, ids[:PROMPT], ids[PROMPT:], randkv=CONFIG, request_key="row0"
    )
    got = nll[0, PROMPT:]
    assert torch.allclose(got, -reference.token_logprobs, atol=2e-3)
    assert got.std() > 0.5  # real text: the NLL varies from token to token


def test_dense_arm_equals_a_plain_forward(smol, text_ids):
    from studies.arms import find_arm
    from studies.real.run import score_arm
    from studies.real.traces import Trace

    model, _ = smol
    traces = [Trace(f"t{b}", row.tolist(), PROMPT) for b, row in enumerate(text_ids)]
    dense, _ = score_arm(model, traces, find_arm("dense"), "dense", budget=48, buffer=8, seed=0)
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=text_ids).logits.float(), -1)
    plain = -logprobs[:, :-1].gather(-1, text_ids[:, 1:, None])[..., 0]
    assert torch.allclose(dense.nll[:, 1:], plain, atol=1e-3)
    assert dense.rounds == [0, 0]
    evicting, _ = score_arm(model, traces, find_arm("window"), "window", budget=48, buffer=8,
                            seed=0)  # fmt: skip
    assert min(evicting.rounds) >= 8
    assert not torch.allclose(evicting.nll[:, 100:], dense.nll[:, 100:], atol=1e-2)


def test_planted_facts_and_questions(smol):
    from studies.real.traces import own_generations

    model, tokenizer = smol
    traces = own_generations(model, tokenizer, count=2, new_tokens=48)
    assert len({len(t.ids) for t in traces}) == 1
    for trace in traces:
        text = tokenizer.decode(trace.ids)
        passcode = "".join(tokenizer.decode([trace.ids[p]]) for p in trace.recall["passcode"])
        room = "".join(tokenizer.decode([trace.ids[p]]) for p in trace.recall["room"])
        assert len(passcode) == 5 and passcode.isdigit() and len(room) == 3
        assert text.count(f"passcode is {passcode}") == 2  # stated once, answered once
        assert text.count(f"room {room}") == 5  # stated four times, answered once
        assert trace.prompt == min(trace.generated) and max(trace.generated) < trace.body_end
    codes = [[t.ids[p] for p in t.recall["passcode"]] for t in traces]
    assert codes[0] != codes[1]  # each trace has its own facts
    assert [t.sampled for t in traces] == [False, True]


def test_short_real_evaluation_writes_the_report(smol, tmp_path):
    from studies.real.evaluate import RealEvalConfig, evaluate_real

    config = RealEvalConfig(
        budgets=(48,), buffer=8, seeds=(0, 1), documents=2, document_tokens=256,
        document_prompt=16, generations=2, new_tokens=64,
        evictors=("dense", "randkv", "window", "h2o"), threads=1,
    )  # fmt: skip
    runs = tmp_path / "runs"
    result = evaluate_real(config, out_dir=tmp_path, runs_dir=runs, show_progress=False)
    saved = json.loads((tmp_path / "real.json").read_text())
    assert saved["hypotheses"].keys() == {"H1", "H2", "H3", "H4"}
    assert "## Own generations" in (tmp_path / "real.md").read_text()
    own = {(r["evictor"], r["budget"]): r for r in result["parts"]["own"]["results"]}
    # Dense holds every statement; the window drops the passcode's, said once near the start.
    assert own[("dense", None)]["metrics"]["passcode_held"]["mean"] == 1.0
    assert own[("window", 48)]["metrics"]["passcode_held"]["mean"] == 0.0
    assert own[("randkv", 48)]["metrics"]["kl"]["mean"] > 0.0
    assert len(result["parts"]["text"]["paired"]) == 2  # window and h2o against randkv

    # A second invocation takes every policy run from the store and reports the same numbers.
    again = evaluate_real(config, out_dir=tmp_path / "again", runs_dir=runs, show_progress=False)
    planned = 2 + 1 + 1  # randkv (2 seeds), window and h2o
    for part, count in {"text": planned, "own": planned}.items():
        assert result["parts"][part]["reused_runs"] == 0
        assert again["parts"][part]["reused_runs"] == count
        assert again["parts"][part]["per_document"] == result["parts"][part]["per_document"]


def test_run_store_keeps_a_run_only_for_the_same_traces(tmp_path):
    from studies.real.run import ArmScores
    from studies.real.store import RunStore
    from studies.real.traces import Trace

    traces = [Trace("a", [1, 2, 3, 4], 2), Trace("b", [5, 6, 7, 8], 2)]
    scores = ArmScores(
        "randkv", 48, 1, nll=torch.rand(2, 4), top1=torch.randint(0, 9, (2, 4)),
        held={"passcode": [0.5, 1.0]}, rounds=[3, 4], eviction_seconds=0.25,
    )  # fmt: skip
    store = RunStore(tmp_path, "text", traces, buffer=8, context={"model": "m"})
    assert store.load("randkv", 48, 1) is None
    store.save(scores, 48, 1)
    back = RunStore(tmp_path, "text", traces, buffer=8, context={"model": "m"}).load(
        "randkv", 48, 1
    )
    assert back is not None and torch.equal(back.nll, scores.nll)
    assert (back.held, back.rounds, back.kl, back.seed) == (
        {"passcode": [0.5, 1.0]},
        [3, 4],
        None,
        1,
    )
    assert store.load("randkv", 48, 2) is None  # another seed is another run
    changed = [traces[0], Trace("b", [5, 6, 7, 9], 2)]  # one token differs
    for other in (
        RunStore(tmp_path, "text", changed, buffer=8, context={"model": "m"}),
        RunStore(tmp_path, "text", traces, buffer=4, context={"model": "m"}),
        RunStore(tmp_path, "text", traces, buffer=8, context={"model": "other"}),
        RunStore(tmp_path, "own", traces, buffer=8, context={"model": "m"}),
    ):
        assert other.load("randkv", 48, 1) is None
