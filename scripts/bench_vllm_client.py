"""Both arms of `randkv bench serve` (same pool, same settings) measured by vLLM's own
benchmark client, `vllm.benchmarks.serve` (random dataset), for a second opinion on the
throughput and latency ratios.

    .venv/bin/python scripts/bench_vllm_client.py [--repeats 2] [--num-prompts 32]
        [--input-len 32] [--output-len 1024] [--out results/vllm-client]

Arms run alternately (plain, RandKV, RandKV, plain, ...) on fresh servers; every run's
vLLM result JSON is kept, and a summary with each arm's median and range is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from randkv.bench.serve import ServeBench, abba_order
from randkv.bench.server import SERVED_MODEL_NAME, running_server
from randkv.models import build_tiny_checkpoint

# Median ITL is ~0 here: a busy client reads streamed chunks in bursts; TPOT is per request.
FIELDS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "completed")


def _client(base_url: str, args: argparse.Namespace, out: Path) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    client_args = parser.parse_args(
        [
            f"--base-url={base_url}", f"--model={SERVED_MODEL_NAME}",
            f"--tokenizer={args.model}", "--dataset-name=random",
            f"--random-input-len={args.input_len}", f"--random-output-len={args.output_len}",
            f"--num-prompts={args.num_prompts}", "--ignore-eos", "--seed=0",
            "--save-result", f"--result-dir={out.parent}", f"--result-filename={out.name}",
        ]
    )  # fmt: skip
    return main(client_args)


def run(args: argparse.Namespace) -> dict:
    bench = ServeBench(max_model_len=args.input_len + args.output_len + 64)
    results: dict[str, list[dict]] = {"plain": [], "randkv": []}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, (_, arm) in enumerate(abba_order(args.repeats)):
        config = bench.randkv if arm == "randkv" else None
        log = out_dir / f"server-{index}-{arm}.log"
        with running_server(args.model, config, bench.engine_args(), log) as server:
            result = _client(server.base_url, args, out_dir / f"run-{index}-{arm}.json")
        results[arm].append({name: result[name] for name in FIELDS})
        print(arm, {name: round(result[name], 2) for name in FIELDS}, flush=True)
    summary = {}
    for name in FIELDS[:4]:
        for arm, runs in results.items():
            values = [run[name] for run in runs]
            summary[f"{arm}.{name}"] = (statistics.median(values), min(values), max(values))
    ratios = [
        r["output_throughput"] / p["output_throughput"]
        for p, r in zip(results["plain"], results["randkv"], strict=True)
    ]
    summary["ratio.output_throughput"] = (statistics.median(ratios), min(ratios), max(ratios))
    return {"settings": vars(args), "pool_blocks": bench.pool_blocks, "runs": results,
            "summary": summary}  # fmt: skip


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the tiny local checkpoint")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--out", default="results/vllm-client")
    args = parser.parse_args(argv)
    args.model = args.model or str(build_tiny_checkpoint())
    result = run(args)
    Path(args.out, "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    for key, (median, low, high) in result["summary"].items():
        print(f"{key}: median {median:.3g} (range {low:.3g} - {high:.3g})")


if __name__ == "__main__":
    main(sys.argv[1:])
