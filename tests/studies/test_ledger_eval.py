"""`python -m studies eval --task ledger` end to end on a tiny config, against independent
expectations: the dense arm right on every use (the trained checkpoint's gate), the oracle
never behind RandKV on any problem, the survival audit equal to the spec's retained positions,
and the reported accuracies recomputed from the per-use outcomes."""

from __future__ import annotations

import json

import pytest

from randkv import RandKVConfig, spec
from studies.ledger.evaluate import EVAL_FAMILY, LedgerEvalConfig, evaluate_ledger
from studies.ledger.task import make_ledgers
from studies.stats import holm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = LedgerEvalConfig(
    budgets=(48,),
    seeds=(0,),
    problems=4,
    events=40,
    variables=10,
    evictors=("dense", "randkv", "oracle"),
    batch_size=4,
)
LAYERS, KV_HEADS = 3, 2


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ledger")
    evaluate_ledger(CONFIG, out_dir=out, show_progress=False)
    assert (out / "ledger.md").read_text().startswith("Ledger v")
    assert (out / "ledger.png").stat().st_size > 0
    return json.loads((out / "ledger.json").read_text())


def _runs(result: dict, name: str) -> list[dict]:
    return [r for r in result["per_problem"] if r["evictor"] == name]


def test_dense_is_right_on_every_use_and_holds_every_define(result: dict):
    (dense,) = _runs(result, "dense")
    problems = make_ledgers(EVAL_FAMILY, CONFIG.problems, CONFIG.task)
    assert [len(c) for c in dense["correct"]] == [len(p.uses) for p in problems]
    assert all(set(c) == {"1"} for c in dense["correct"])
    every = (1 << LAYERS * KV_HEADS) - 1
    assert all(b == every for row in dense["define_held"] for b in row)


def test_oracle_never_behind_randkv_and_reported_accuracy_recomputes(result: dict):
    (oracle,) = _runs(result, "oracle")
    (randkv,) = _runs(result, "randkv")
    for ours, theirs in zip(randkv["correct"], oracle["correct"], strict=True):
        assert theirs.count("1") >= ours.count("1")
    for run in (oracle, randkv):
        row = next(
            r
            for r in result["results"]
            if r["evictor"] == run["evictor"] and r["budget"] == run["budget"]
        )
        right = sum(c.count("1") for c in run["correct"])
        total = sum(len(c) for c in run["correct"])
        assert row["strata"]["all"]["accuracy"] == pytest.approx(right / total)
    assert result["schema_version"] == 2 and set(result["hypotheses"]) == {"H1", "H2", "H3", "H4"}
    paired = result["paired"]
    assert {p["evictor"] for p in paired} == {"oracle"}
    assert [p["holm_p"] for p in paired] == pytest.approx(holm([p["sign_test_p"] for p in paired]))


def test_survival_audit_matches_the_spec_for_randkv(result: dict):
    (randkv,) = _runs(result, "randkv")
    problems = make_ledgers(EVAL_FAMILY, CONFIG.problems, CONFIG.task)
    config = RandKVConfig(budget=48, buffer_size=CONFIG.buffer, seed=0)
    prompt = 8
    for problem, defines, values in zip(
        problems, randkv["define_held"], randkv["value_held"], strict=True
    ):
        define_at = {
            problem.body[4 * e + 1]: prompt + 4 * e + 2
            for e in range(CONFIG.events)
            if problem.body[4 * e] == "="
        }
        key = spec.coerce_request_key(f"ledger:{problem.seed}:{problem.index}")
        for use, got, value in zip(problem.uses, defines, values, strict=True):
            # The forward that predicts the value reads the cache after token T - 1 is written.
            newest = prompt + use.value_offset - 1
            want = 0
            for layer in range(LAYERS):
                for head in range(KV_HEADS):
                    held = set(
                        spec.retained_positions(
                            config,
                            prompt_length=prompt,
                            tokens_seen=newest,
                            request_key=key,
                            layer=layer,
                            kv_head=head,
                        )
                    ) | {newest}
                    want |= int(define_at[use.variable] in held) << (layer * KV_HEADS + head)
            assert got == want
            assert value & got == got  # the define is one of the right copies
