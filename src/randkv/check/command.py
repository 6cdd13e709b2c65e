"""`randkv check` (also `python -m randkv check`): validate RandKV on this machine.

Needs torch (Triton for the kernel lines; vLLM for the engine lines, skipped without it).
Prints one line per check as it runs, then a one-screen verdict; writes every detail
(tracebacks of failed lines included) to the JSON file. Exit status 1 if a line failed.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="randkv check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("results/randkv-check.json"),
        help="where every line's details go (default: results/randkv-check.json)",
    )
    parser.add_argument("--model", default=None, help="vLLM lines: model (default: tiny)")
    parser.add_argument("--no-engine", action="store_true", help="skip the vLLM engine runs")
    parser.add_argument(
        "--budget-s", type=float, default=270.0, help="lines not started by then are skipped"
    )
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch  # torch does not import Triton; the interpreter choice must precede it

    cuda = torch.cuda.is_available() if args.device is None else args.device.startswith("cuda")
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels on CPU tensors
    device = torch.device(args.device or ("cuda" if cuda else "cpu"))

    from randkv.check import engine, kernels
    from randkv.check.report import CheckLine, Report

    setup = kernels.Setup(device)
    report = Report(args.json, args.budget_s)
    torch.manual_seed(0)
    report.run("platform", lambda: kernels.platform_info(setup))
    report.run("vllm_attention_backend", lambda: engine.attention_backend(device))
    for name, check in kernels.CHECKS:
        report.run(name, functools.partial(check, setup))
    if args.no_engine:
        for name in ("engine_modes", "engine_matches_stock", "engine_async_scheduling"):
            report.run(name, lambda: CheckLine(status="skip", summary="--no-engine"))
    else:
        report.run("engine_modes", lambda: engine.engine_modes(device, args.model))
        report.run("engine_matches_stock", lambda: engine.engine_matches_stock(device, args.model))
        report.run(
            "engine_async_scheduling", lambda: engine.engine_async_scheduling(device, args.model)
        )
    status = report.finish()
    print(report.verdict())
    return status


if __name__ == "__main__":
    sys.exit(main())
