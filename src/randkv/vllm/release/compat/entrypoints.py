"""vLLM's server entry points that moved between releases: the command-line environment set-up,
and where the API server app gets its middleware."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, cast


def find_cli_env_setup() -> Callable[[], None]:
    """vLLM's `cli_env_setup` (`vllm.entrypoints.common.startup` from 0.34,
    `vllm.entrypoints.serve.utils.api_utils` before)."""
    try:
        from vllm.entrypoints.common.startup import (  # type: ignore[import-not-found]
            cli_env_setup as setup,  # vLLM 0.34; the installed release may predate it
        )
    except ImportError:
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup as setup
    return setup


def add_app_middleware(middleware: type, **options: Any) -> None:
    """Add `middleware` to the API server app vLLM builds from now on in this process.

    vLLM adds its own middleware in `init_entrypoints_middleware(args, app, tasks)`, looked up
    in `vllm.entrypoints.launchers.app` when the app is built (0.32 and 0.34); vLLM 0.28
    builds the app in `vllm.entrypoints.openai.api_server.build_app(args, ...)`, looked up in
    that module, which is also `__main__` under `python -m vllm.entrypoints.openai.api_server`.
    The wrap adds RandKV's after vLLM's (idempotent).
    """
    module: Any
    try:
        import vllm.entrypoints.launchers.app as launcher_app

        module, name, returns_app = launcher_app, "init_entrypoints_middleware", False
    except ImportError:
        import vllm.entrypoints.openai.api_server as api_server

        module, name, returns_app = api_server, "build_app", True
    main = sys.modules.get("__main__")
    same_module_as_main = getattr(getattr(main, "__spec__", None), "name", None) == module.__name__
    for target in [module, main] if same_module_as_main else [module]:
        _wrap_app_builder(target, name, returns_app, middleware, options)


def _wrap_app_builder(
    module: Any, name: str, returns_app: bool, middleware: type, options: dict[str, Any]
) -> None:
    original = getattr(module, name)
    if getattr(original, "__randkv_middleware__", None) is middleware:
        original.__randkv_options__.update(options)  # the latest engine's settings
        return
    current = dict(options)

    @functools.wraps(original)
    def with_middleware(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        app = result if returns_app else kwargs.get("app", args[1] if len(args) > 1 else None)
        _add_outermost(app, middleware, current)
        return result

    with_middleware.__randkv_middleware__ = middleware  # type: ignore[attr-defined]
    with_middleware.__randkv_options__ = current  # type: ignore[attr-defined]
    setattr(module, name, with_middleware)


def _add_outermost(app: Any, middleware: type, options: dict[str, Any]) -> None:
    """Starlette's `add_middleware`, also on an app whose middleware stack is already built:
    vLLM 0.28's `build_app` ends with the SageMaker standards bootstrap, which builds it (and
    Starlette then refuses new middleware). Rebuilt the way that bootstrap does."""
    if app.middleware_stack is None:
        app.add_middleware(middleware, **options)
        return
    from starlette.middleware import Middleware

    app.user_middleware.insert(0, Middleware(cast(Any, middleware), **options))
    app.middleware_stack = app.build_middleware_stack()
