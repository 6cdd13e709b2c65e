"""`randkv serve` option handling, without starting a server: bad input gets a clear error."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from randkv import RandKVConfig  # noqa: E402
from randkv.vllm.entrypoints.serve import (  # noqa: E402
    apply_randkv,
    build_serve_parser,
    config_from_options,
    randkv_option_parser,
)

pytestmark = [pytest.mark.vllm]


def parse(argv):
    options, rest = randkv_option_parser().parse_known_args(argv)
    parser, _ = build_serve_parser()
    return config_from_options(options), parser.parse_args(["serve", *rest])


def test_randkv_options_are_taken_out_and_the_rest_goes_to_vllm():
    config, args = parse(["m", "--randkv-budget", "512", "--max-num-seqs", "4", "--port", "9"])
    assert config == RandKVConfig(budget=512)
    assert args.model_tag == "m" and args.max_num_seqs == 4 and args.port == 9
    apply_randkv(args, config)
    assert args.scheduler_cls == "randkv.vllm.sched.scheduler.RandKVScheduler"
    assert args.worker_cls == "randkv.vllm.worker.RandKVCPUWorker"
    assert args.additional_config["randkv"] is config  # parsed once, here, and passed on
    assert args.async_scheduling is None  # vLLM decides (on by default on GPUs)


def test_flag_alone_and_no_flag_both_mean_defaults():
    assert parse(["m", "--randkv"])[0] == RandKVConfig()
    assert parse(["m"])[0] == RandKVConfig()


def test_no_randkv_leaves_vllm_untouched_and_refuses_mixing():
    config, args = parse(["m", "--no-randkv"])
    assert config is None
    apply_randkv(args, config)
    assert args.scheduler_cls is None and args.additional_config == {}
    with pytest.raises(SystemExit, match="cannot be combined"):
        parse(["m", "--no-randkv", "--randkv-budget", "64"])


def test_bad_values_and_refused_modes_say_what_is_wrong():
    with pytest.raises(ValueError, match="budget must be in"):
        parse(["m", "--randkv-budget", "0"])
    from randkv.vllm.entrypoints.engine_args import UnsupportedModeError

    config, args = parse(["m", "--pipeline-parallel-size", "2"])
    with pytest.raises(UnsupportedModeError, match="pipeline parallelism"):
        apply_randkv(args, config)
    config, args = parse(["m", "--scheduler-cls", "my.Scheduler"])
    with pytest.raises(UnsupportedModeError, match="installs its own scheduler_cls"):
        apply_randkv(args, config)
