"""The `randkv` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key}: {json.dumps(value)}")


def _bench_select(args: argparse.Namespace) -> None:
    from randkv.bench import select

    _print(
        select.run(
            layers=args.layers,
            kv_heads=args.kv_heads,
            budget=args.budget,
            buffer=args.buffer,
            prompt=args.prompt,
            batch=args.batch,
            repeats=args.repeats,
            threads=args.threads,
        ),
        args.json,
    )


def _bench_compact(args: argparse.Namespace) -> None:
    from randkv.bench import compact

    _print(
        compact.run(
            layers=args.layers,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            budget=args.budget,
            buffer=args.buffer,
            prompt=args.prompt,
            requests=args.requests,
            block_size=args.block_size,
            dtype=args.dtype,
            repeats=args.repeats,
            threads=args.threads,
        ),
        args.json,
    )


def _bench_hf(args: argparse.Namespace) -> None:
    from randkv.bench import hf

    _print(
        hf.run(
            new_tokens=args.new_tokens,
            budget=args.budget,
            buffer=args.buffer,
            prompt=args.prompt,
            repeats=args.repeats,
            threads=args.threads,
        ),
        args.json,
    )


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
    from randkv.vllm import serve

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
    select.set_defaults(func=_bench_select)
    compact = bench.add_parser("compact", help="compaction bytes and bandwidth")
    _add_shape_args(compact)
    compact.add_argument("--head-dim", type=int, default=128)
    compact.add_argument("--requests", type=int, default=2)
    compact.add_argument("--block-size", type=int, default=16)
    compact.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    compact.set_defaults(func=_bench_compact)
    hf_bench = bench.add_parser("hf", help="dense vs RandKV Transformers generate, tiny model")
    hf_bench.add_argument("--new-tokens", type=int, default=256)
    hf_bench.add_argument("--budget", type=int, default=64)
    hf_bench.add_argument("--buffer", type=int, default=16)
    hf_bench.add_argument("--prompt", type=int, default=32)
    hf_bench.add_argument("--repeats", type=int, default=3)
    hf_bench.add_argument("--threads", type=int, default=1)
    hf_bench.add_argument("--json", action="store_true")
    hf_bench.set_defaults(func=_bench_hf)
    commands.add_parser(
        "serve",
        help="vLLM's OpenAI-compatible server with RandKV (randkv serve MODEL --help)",
        add_help=False,
    )
    demo = commands.add_parser("demo", help="core benchmarks and a short engine comparison")
    demo.add_argument("--model", default=None, help="checkpoint path (default: tiny model)")
    demo.add_argument("--results", default="results/demo", help="folder for JSON results")
    demo.set_defaults(func=_demo)
    from randkv.quality.cli import add_quality_commands

    add_quality_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        _serve(argv[1:])
        return 0
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
