"""RandKV as a vLLM plugin, in-process: stock `vllm.LLM(additional_config={"randkv": ...})`
runs RandKV, and an engine without "randkv" is plain vLLM although the plugin is loaded."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.v2]

CONFIG = RandKVConfig(budget=40, buffer_size=8, seed=2)
COMMON = dict(
    dtype="float32",
    max_model_len=1024,
    block_size=32,
    gpu_memory_utilization=0.2,
    num_gpu_blocks_override=64,
    enforce_eager=True,
    max_num_seqs=4,
    seed=0,
)
PROMPTS = ["The plugin path and the wrapper path.", "Same decisions, same tokens."]
GREEDY = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)


def _engine_core(llm):
    return llm.llm_engine.engine_core.engine_core


def _tokens(llm) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_the_entry_point_is_registered_for_vllms_loader():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("randkv") == "randkv.vllm.plugin:register"


def test_stock_llm_with_additional_config_equals_randkv_llm(tiny_model_path):
    import vllm
    from v2_runner import v2_requested

    from randkv.vllm import LLM
    from randkv.vllm.sched.scheduler import RandKVScheduler
    from randkv.vllm.worker.runner_class import qualified_name

    stock = vllm.LLM(
        model=tiny_model_path,
        additional_config={"randkv": {"budget": 40, "buffer_size": 8, "seed": 2}},
        **COMMON,
    )
    core = _engine_core(stock)
    assert type(core.scheduler) is RandKVScheduler
    runner_cls = type(core.model_executor.driver_worker.worker.model_runner)
    vllm_runner = qualified_name(runner_cls.__bases__[-1])
    if v2_requested():
        assert runner_cls.randkv_runner_kind == "v2"
        assert vllm_runner == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
    else:
        assert runner_cls.randkv_runner_kind == "v1"
        assert vllm_runner == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    stock_tokens = _tokens(stock)
    rounds = stock.collective_rpc("randkv_stats")[0]["counters"]["rounds"]
    assert rounds > 0
    stock.llm_engine.engine_core.shutdown()  # before the next engine starts (conftest.py)
    del stock, core
    wrapped = LLM(model=tiny_model_path, randkv=CONFIG, **COMMON)
    assert _tokens(wrapped) == stock_tokens
    assert wrapped.randkv_stats().counters["rounds"] == rounds


def test_the_budget_is_parsed_once_from_additional_config_to_the_planner(
    tiny_model_path, monkeypatch
):
    """The options enter as a dict, become one RandKVConfig at the plugin, and that object
    is what the scheduler, the worker and its planner run with (in-process engine: the same
    object; in other processes, its pickled copy)."""
    import vllm

    from randkv.vllm.options import RandKVAdditionalConfig
    from randkv.vllm.sched.output import RandKVSchedulerOutput

    parses = []
    validate = RandKVConfig.__post_init__

    def counted(self):
        parses.append(self)
        validate(self)

    monkeypatch.setattr(RandKVConfig, "__post_init__", counted)
    stock = vllm.LLM(
        model=tiny_model_path,
        additional_config={"randkv": {"budget": 40, "buffer_size": 8, "seed": 2}, "other": 1},
        **COMMON,
    )
    core = _engine_core(stock)
    runner = core.model_executor.driver_worker.worker.model_runner
    extra = core.vllm_config.additional_config
    assert isinstance(extra, RandKVAdditionalConfig) and extra["other"] == 1
    assert len(extra.compute_hash()) == 64 and core.vllm_config.compute_hash()
    steps = []
    before_step = type(runner).randkv_before_step

    def recorded(self, scheduler_output):
        steps.append(scheduler_output)
        before_step(self, scheduler_output)

    monkeypatch.setattr(type(runner), "randkv_before_step", recorded)
    assert stock.collective_rpc("randkv_stats")[0]["counters"]["rounds"] == 0
    _tokens(stock)
    assert stock.collective_rpc("randkv_stats")[0]["counters"]["rounds"] > 0
    assert parses == [CONFIG]  # one parse, at the plugin
    assert core.scheduler.randkv is parses[0]
    assert runner.randkv.config is parses[0]
    assert runner.randkv.rounds.planner.config is parses[0]
    assert steps and all(type(step) is RandKVSchedulerOutput for step in steps)
    assert any(step.randkv.directives for step in steps)


PLAIN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import vllm
    from vllm import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    path, prompts, common = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    llm = vllm.LLM(model=path, **common)
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    print(json.dumps({
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "plain_classes": type(core.scheduler) is Scheduler and type(runner) is CPUModelRunner,
        "randkv_loaded": "randkv.vllm.plugin" in sys.modules,
        "scheduler_cls": str(core.vllm_config.scheduler_config.scheduler_cls),
        "async": core.vllm_config.scheduler_config.async_scheduling,
    }))
    """
)


def _plain_run(tiny_model_path: str, plugins: str | None) -> dict:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
    env.pop("VLLM_PLUGINS", None)
    # The plugin's pass-through, on vLLM's default runner (the V2 test run's Triton
    # interpreter backend is registered in the pytest process only: tests/support/v2_runner.py).
    for name in ("VLLM_USE_V2_MODEL_RUNNER", "TRITON_INTERPRET"):
        env.pop(name, None)
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    out = subprocess.run(
        [sys.executable, "-c", PLAIN_SCRIPT, tiny_model_path, json.dumps(PROMPTS),
         json.dumps(COMMON)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_randkv_the_loaded_plugin_changes_nothing(tiny_model_path):
    loaded = _plain_run(tiny_model_path, plugins=None)
    assert loaded["randkv_loaded"]  # vLLM loaded the plugin into this engine's process
    filtered = _plain_run(tiny_model_path, plugins="")  # VLLM_PLUGINS filters it out
    assert not filtered["randkv_loaded"]
    assert loaded["plain_classes"] and filtered["plain_classes"]
    assert loaded["tokens"] == filtered["tokens"]
    assert loaded["scheduler_cls"] == filtered["scheduler_cls"]
    assert loaded["async"] == filtered["async"]


def test_the_metrics_warning_is_logged_once(monkeypatch):
    from randkv.vllm import plugin

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    plugin._warn_once_about_metrics.cache_clear()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("vllm.randkv.plugin").addHandler(handler)
    try:
        for _ in range(3):
            args = _engine_args_like(additional_config={"randkv": {"budget": 64}})
            plugin.apply_to_engine_args(args)
    finally:
        logging.getLogger("vllm.randkv.plugin").removeHandler(handler)
    assert len(records) == 1
    assert "PROMETHEUS_MULTIPROC_DIR" in records[0].getMessage()
    assert args.scheduler_cls == "randkv.vllm.sched.scheduler.RandKVScheduler"
    # The options are parsed once and replaced by their RandKVConfig.
    assert args.additional_config["randkv"] == RandKVConfig(budget=64)


def _engine_args_like(**fields):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model="unused")
    for name, value in fields.items():
        setattr(args, name, value)
    return args


def test_plugin_refusals_name_the_setting(monkeypatch):
    from randkv.vllm import plugin
    from randkv.vllm.refusals import UnsupportedModeError

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent-unused")
    args = _engine_args_like(additional_config={"randkv": {}}, kv_cache_dtype="fp8")
    with pytest.raises(UnsupportedModeError, match="kv_cache_dtype='auto'"):
        plugin.apply_to_engine_args(args)
    # Async scheduling is vLLM's to choose: asked for, it stays asked for.
    args = _engine_args_like(additional_config={"randkv": {}}, async_scheduling=True)
    plugin.apply_to_engine_args(args)
    assert args.async_scheduling is True
    args = _engine_args_like(additional_config={"randkv": {"budjet": 1}})
    with pytest.raises(ValueError, match="unknown RandKV option"):
        plugin.apply_to_engine_args(args)


def test_the_front_door_passes_requests_through_without_randkv():
    """The wrapped generate reads RandKV's settings from the engine on every call: an engine
    without RandKV (even one whose plain additional_config says "randkv": the plugin never
    built it) gets the request through untouched, however long."""
    import types

    from randkv.vllm.entrypoints import front_door
    from randkv.vllm.options import RandKVAdditionalConfig

    calls = []

    def generate(self, prompt, sampling_params, request_id):
        calls.append(request_id)
        return "the stream"

    checked = front_door._checked_at_call(generate, front_door._check_generate)

    def engine(additional_config):
        model_config = types.SimpleNamespace(served_model_name="m", model="m")
        vllm_config = types.SimpleNamespace(
            additional_config=additional_config,
            model_config=model_config,
            parallel_config=types.SimpleNamespace(data_parallel_index=0),
        )
        return types.SimpleNamespace(vllm_config=vllm_config, model_config=model_config)

    prompt = types.SimpleNamespace(prompt_token_ids=list(range(10_000)))
    params = types.SimpleNamespace(extra_args={"randkv_keyy": 1.5})
    for config in ({}, {"other": 1}, {"randkv": {"budget": 64}}):
        assert checked(engine(config), prompt, params, "r") == "the stream"
    on = RandKVAdditionalConfig.of({"other": 1}, RandKVConfig(budget=64))
    with pytest.raises(front_door.RandKVRequestError, match="randkv_keyy"):
        checked(engine(on), prompt, params, "refused")
    fine = types.SimpleNamespace(extra_args={"randkv_key": "k"})
    with pytest.raises(front_door.RandKVRequestError, match="prompt of 10000 tokens exceeds"):
        checked(engine(on), prompt, fine, "too long")
    short = types.SimpleNamespace(prompt_token_ids=list(range(10)))
    assert checked(engine(on), short, fine, "ok") == "the stream"
    assert calls == ["r", "r", "r", "ok"]  # refused requests never reach the engine
