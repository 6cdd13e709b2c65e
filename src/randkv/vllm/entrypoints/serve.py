"""`randkv serve MODEL [RandKV options] [any vllm serve flag]`: vLLM's OpenAI-compatible
server with RandKV on (through the same path as the plugin, `randkv.vllm.plugin`), and
RandKV's series on /metrics.

The `randkv` command sets PROMETHEUS_MULTIPROC_DIR before vLLM is imported (see
`randkv.cli`), so the engine and worker processes' RandKV series reach the endpoint.

vLLM's own command line parses every flag RandKV does not own, so a user's `vllm serve`
invocation works unchanged with `randkv serve` in front of it.
"""

from __future__ import annotations

import argparse
from typing import Any

from randkv.spec.config import ADMISSION_MODES, RandKVConfig


def randkv_option_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    group = parser.add_argument_group("RandKV")
    group.add_argument(
        "--randkv",
        action="store_true",
        help="RandKV on with its defaults (it is on unless --no-randkv is given)",
    )
    group.add_argument(
        "--no-randkv",
        action="store_true",
        help="serve plain vLLM (same server and /metrics; a baseline for comparisons)",
    )
    defaults = RandKVConfig()
    group.add_argument(
        "--randkv-budget", type=int, metavar="K", help=f"KV budget K (default {defaults.budget})"
    )
    group.add_argument(
        "--randkv-buffer",
        type=int,
        metavar="R",
        help=f"buffer r (default {defaults.buffer_size})",
    )
    group.add_argument("--randkv-seed", type=int, metavar="S", help="default 0")
    group.add_argument(
        "--randkv-min-generated",
        type=int,
        metavar="G",
        help="serve prompts longer than K - G: such a request keeps its whole prompt and at "
        "least G sampled generated tokens (its own K is max(K, P + G)); default off: a "
        "prompt longer than K gets HTTP 400",
    )
    group.add_argument(
        "--randkv-max-request-budget",
        type=int,
        metavar="K_MAX",
        help="the largest budget a request may ask for with vllm_xargs randkv_budget (default: K)",
    )
    group.add_argument(
        "--randkv-admission",
        choices=ADMISSION_MODES,
        help="footprint (default): admit only what fits with every admitted request at its "
        "largest footprint, never preempting for foreseeable growth; vllm: vLLM's admission "
        "(on what a request needs now; preempts when the pool runs out)",
    )
    return parser


def config_from_options(options: argparse.Namespace) -> RandKVConfig | None:
    """The RandKVConfig the RandKV options ask for, or None for `--no-randkv`."""
    tuned = {
        "budget": options.randkv_budget,
        "buffer_size": options.randkv_buffer,
        "seed": options.randkv_seed,
        "min_generated": options.randkv_min_generated,
        "max_request_budget": options.randkv_max_request_budget,
        "admission": options.randkv_admission,
    }
    tuned = {key: value for key, value in tuned.items() if value is not None}
    if options.no_randkv:
        if tuned or options.randkv:
            raise SystemExit("randkv serve: --no-randkv cannot be combined with RandKV options")
        return None
    return RandKVConfig(**tuned)


def apply_randkv(args: argparse.Namespace, config: RandKVConfig | None) -> None:
    """Put RandKV into vLLM's parsed serve arguments, the way the plugin does for stock
    `vllm serve --additional-config '{"randkv": ...}'` (one path into vLLM)."""
    from randkv.vllm.options import ADDITIONAL_CONFIG_KEY
    from randkv.vllm.plugin import apply_to_engine_args, register

    if config is None:
        return
    # The config parsed from the RandKV options, taken as it is by the plugin.
    args.additional_config = {
        **(getattr(args, "additional_config", None) or {}),
        ADDITIONAL_CONFIG_KEY: config,
    }
    register()
    apply_to_engine_args(args)


def build_serve_parser() -> tuple[Any, Any]:
    """vLLM's own `serve` parser, under the name `randkv serve`."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="randkv", description="RandKV on vLLM's server")
    subparsers = parser.add_subparsers(dest="subparser")
    command = ServeSubcommand()
    serve_parser = command.subparser_init(subparsers)
    serve_parser.usage = "randkv serve [model_tag] [RandKV options] [vllm serve options]"
    return parser, command


def main(argv: list[str]) -> None:
    options, rest = randkv_option_parser().parse_known_args(argv)
    if any(arg in ("-h", "--help") or arg.startswith("--help=") for arg in rest):
        print(randkv_option_parser().format_help().split("\n", 2)[-1].strip(), "\n")
    try:
        config = config_from_options(options)
    except ValueError as error:
        raise SystemExit(f"randkv serve: {error}") from error

    from randkv.vllm.entrypoints.engine_args import UnsupportedModeError
    from randkv.vllm.release.compat.entrypoints import find_cli_env_setup

    find_cli_env_setup()()
    parser, command = build_serve_parser()
    args = parser.parse_args(["serve", *rest])
    command.validate(args)
    try:
        apply_randkv(args, config)
    except UnsupportedModeError as error:
        raise SystemExit(f"randkv serve: {error}") from error
    command.cmd(args)
