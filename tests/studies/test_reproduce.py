"""The committed real-model study reproduces from the checkout: a short run (the first text
document, dense and RandKV's three seeds at K = 320) gives the per-document numbers that
`results/quality/real.json` holds for it.

The own-generation part is not rerun here: its answers are generated 12 to a batch with
left padding, so one answer alone is not the committed one; it reproduces only whole
(`make study`, about 25 min)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

RESULT = Path(__file__).resolve().parents[2] / "results" / "quality" / "real.json"
BUDGET = 320
EVICTORS = ("dense", "randkv")
#: Float32 on another CPU or thread count reorders sums; the numbers compared are means of
#: NLLs near 3 nats over about 1,700 tokens.
TOLERANCE = 2e-3
#: The committed run used 2 threads; one keeps this test off the core CI's other lane runs on
#: (two threads beside a busy core ran ten times slower), and TOLERANCE covers the reordering.
THREADS = 1


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(RESULT.read_text())


@pytest.fixture(scope="module")
def rerun(committed, tmp_path_factory) -> dict:
    from randkv.models.shipped import ModelFetchError, fetch_model
    from studies.real.corpus import CorpusError, corpus_archive
    from studies.real.evaluate import RealEvalConfig, evaluate_real

    try:
        fetch_model()
        corpus_archive()
    except (ModelFetchError, CorpusError) as error:
        pytest.skip(f"the study's model or corpus is not set up (make setup): {error}")
    full = committed["config"]
    config = RealEvalConfig(
        budgets=(BUDGET,), buffer=full["buffer"], seeds=tuple(full["seeds"]), documents=1,
        document_tokens=full["document_tokens"], document_prompt=full["document_prompt"],
        evictors=EVICTORS, parts=("text",), threads=THREADS,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("real")
    return evaluate_real(config, out_dir=out, keep_runs=False, show_progress=False)


def _first_document(part: dict) -> dict[tuple[str, int | None], dict[str, float]]:
    return {
        (row["evictor"], row["budget"]): {k: v[0] for k, v in row.items() if isinstance(v, list)}
        for row in part["per_document"]
    }


def test_a_short_run_gives_the_committed_per_document_numbers(committed, rerun):
    want = _first_document(committed["parts"]["text"])
    got = _first_document(rerun["parts"]["text"])
    assert rerun["parts"]["text"]["documents"][0] == committed["parts"]["text"]["documents"][0]
    assert set(got) == {("dense", None), ("randkv", BUDGET)}
    compared = 0
    for arm, metrics in got.items():
        for name, value in metrics.items():
            assert value == pytest.approx(want[arm][name], abs=TOLERANCE), (arm, name)
            compared += 1
    assert compared == 2
    # Eviction moved the numbers: the comparison is not of dense against itself.
    assert got[("randkv", BUDGET)]["nll"] - got[("dense", None)]["nll"] > 10 * TOLERANCE
