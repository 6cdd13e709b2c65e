"""RandKV as a vLLM plugin: with this package installed (from a checkout: README, "Install"),
stock vLLM with `--additional-config '{"randkv": {"budget": 2048, "buffer_size": 64}}'` (or
`vllm.LLM(..., additional_config={"randkv": {...}})`) runs RandKV.

vLLM loads every `vllm.general_plugins` entry point in every one of its processes
(`VLLM_PLUGINS` filters them), so `register` must be cheap and must never change a
deployment that does not use RandKV. It wraps one vLLM method, `EngineArgs.create_engine_config`,
where a deployment's options become its configuration: when the options carry "randkv" in
`additional_config`, the wrap parses them once into a `RandKVConfig`, fills in RandKV's
scheduler and the worker for the platform (and, where RandKV supports only vLLM's V1 model
runner, asks for it: vLLM 0.28; a user's contrary choice is refused with the setting to
change), leaves vLLM's scheduling mode as vLLM chose it, installs RandKV's front-door
checks (`randkv.vllm.entrypoints.front_door`), and leaves the parsed config on the `VllmConfig` it
returns, where every engine process reads it (`randkv.vllm.options`). Without "randkv" the
wrap passes straight through, under any vLLM. Under a vLLM release RandKV does not support
(`randkv.vllm.release.versions`), asking for RandKV fails with the supported releases and
the command that installs one, never silently serves plain vLLM.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from randkv.spec.config import RandKVConfig
from randkv.vllm.options import RandKVAdditionalConfig, options_in

logger = logging.getLogger("vllm.randkv.plugin")

METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def register() -> None:
    """The `vllm.general_plugins` entry point (idempotent)."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:  # pragma: no cover - vLLM is what loads this
        return
    create = getattr(EngineArgs, "create_engine_config", None)
    if create is None or getattr(create, "__randkv_wrapped__", False):
        return
    setattr(EngineArgs, "create_engine_config", _with_randkv(create))  # noqa: B010


def _with_randkv(create: Any) -> Any:
    @functools.wraps(create)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        usage = kwargs.get("usage_context", args[0] if args else None)
        # The offline LLM class has no HTTP front door and no /metrics endpoint.
        config = apply_to_engine_args(self, serving=getattr(usage, "name", None) != "LLM_CLASS")
        vllm_config = create(self, *args, **kwargs)
        if config is not None:  # it travels on in vLLM's slot for out-of-tree settings
            vllm_config.additional_config = RandKVAdditionalConfig.of(
                vllm_config.additional_config, config
            )
        return vllm_config

    create_engine_config.__randkv_wrapped__ = True  # type: ignore[attr-defined]
    return create_engine_config


def apply_to_engine_args(engine_args: Any, *, serving: bool = True) -> RandKVConfig | None:
    """Validate RandKV's options in `engine_args.additional_config` and fill in what RandKV
    needs (raises UnsupportedModeError / ValueError naming what to change). Returns the
    RandKVConfig, which also replaces the options there, so nothing parses them again (None,
    touching nothing, when RandKV is off). `serving`: the engine will back an HTTP server
    (install the front door; warn once if RandKV's series cannot reach /metrics)."""
    options = options_in(getattr(engine_args, "additional_config", None))
    config = RandKVConfig.coerce(options)  # the one parse (a RandKVConfig passes as it is)
    if config is None:
        return None
    from randkv.vllm.release.support import check_vllm_version

    check_vllm_version()  # refuses an unsupported release before anything else happens
    from randkv.vllm.entrypoints import front_door
    from randkv.vllm.entrypoints.engine_args import (
        INSTALLED_ENGINE_ARGS,
        SCHEDULER_CLS,
        randkv_engine_kwargs,
    )
    from randkv.vllm.refusals import REFUSED_ENGINE_ARGS

    names = dict.fromkeys((*INSTALLED_ENGINE_ARGS, *REFUSED_ENGINE_ARGS))
    current = {name: getattr(engine_args, name, None) for name in names}
    if current["scheduler_cls"] == SCHEDULER_CLS:  # already applied (e.g. a second config)
        current["scheduler_cls"] = current["worker_cls"] = None
    for name, value in randkv_engine_kwargs(config, current).items():
        setattr(engine_args, name, value)
    if serving:  # the HTTP checks and the /metrics advice concern servers only
        front_door.install(config)
        if METRICS_ENV not in os.environ:
            _warn_once_about_metrics()
    return config


@functools.cache
def _warn_once_about_metrics() -> None:
    logger.warning(
        "RandKV: %s is not set, so RandKV's Prometheus series (written by the engine and "
        "worker processes) will not appear on /metrics; set it to an empty directory before "
        "starting vLLM (see docs/serving.md, 'Metrics under stock vLLM')",
        METRICS_ENV,
    )
