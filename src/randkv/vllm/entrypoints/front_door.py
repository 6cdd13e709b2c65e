"""RandKV's request checks at vLLM's OpenAI-compatible server: HTTP 400, never a 500, a cut
stream or an error inside a 200, on every route that generates text.

Every generating route (completions, chat, batch chat, responses, `/v1/messages`,
`/inference/v1/generate`, ...) hands its rendered prompt and final sampling parameters to
one method, `AsyncLLM.generate`, before any stream starts; beam search and the responses
route's tool loop call it later, from inside their own generators. RandKV wraps those three
so that the check runs when they are *called* (while the route still handles the request),
and raises `RandKVRequestError`, a `VLLMValidationError`, which vLLM's own error handling
answers with 400 and RandKV's message:

- a prompt RandKV cannot serve (longer than K without `min_generated`, or than a request's
  own `randkv_budget`), naming the setting that serves it;
- a malformed `randkv_*` field (`randkv_key`, `randkv_budget`), naming what is accepted;
- beam search whose beams would outgrow the budget (vLLM resubmits prompt + beam as a new
  prompt at every step, so every beam token becomes a prompt token).

vLLM's pydantic request models turn JSON booleans in `vllm_xargs` into 0/1 before any of
that runs, so `RandKVRequestFields`, an ASGI middleware on the server's app, refuses a
boolean `randkv_*` field from the request body first.

The scheduler refuses the same requests inside the engine (finish reason "error"): the
backstop for callers that do not come through this server (the offline `LLM`). Each wrap
reads the engine's parsed RandKVConfig on every call (an attribute read), so it does nothing
for an engine without RandKV.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger

from randkv.spec.config import PromptTooLongError, RandKVConfig, RequestBudgetError
from randkv.vllm.options import config_from_vllm
from randkv.vllm.sched.request_identity import check_request_fields, requested_budget

logger = init_logger("vllm.randkv.front_door")

SERVE_LONG_PROMPTS = (
    "serve such prompts with min_generated (the prompt is kept whole, eviction runs among "
    'the generated tokens): --additional-config \'{"randkv": {"min_generated": ...}}\' '
    "(randkv serve: --randkv-min-generated); or raise the budget (--randkv-budget)"
)


class RandKVRequestError(VLLMValidationError):
    """A request RandKV refuses; vLLM answers it with HTTP 400 and exactly this message."""

    def __str__(self) -> str:
        return str(self.args[0])


def request_problem(
    config: RandKVConfig, extra_args: dict[str, Any] | None, prompt_length: int | None
) -> RandKVRequestError | None:
    """What RandKV refuses in one engine request (None: nothing); `prompt_length` None:
    the fields only."""
    try:
        check_request_fields(extra_args)
        config.request_budget(prompt_length or 0, requested_budget(extra_args))
    except PromptTooLongError as error:
        return RandKVRequestError(
            f"prompt of {error.prompt_length} tokens exceeds the RandKV budget "
            f"K={error.budget}; {SERVE_LONG_PROMPTS}",
            parameter="prompt",
        )
    except RequestBudgetError as error:
        return RandKVRequestError(str(error), parameter="vllm_xargs")
    except (TypeError, ValueError) as error:
        return RandKVRequestError(str(error), parameter="vllm_xargs")
    return None


def _refuse(vllm_config: Any, problem: RandKVRequestError) -> None:
    logger.warning("RandKV rejects a request: %s", problem)
    if problem.parameter == "prompt":
        from randkv.vllm.metrics import RandKVRecorder, Source

        RandKVRecorder(vllm_config, Source.SCHEDULER, publishes_once=True).add(
            "rejected_prompts", 1
        )
    raise problem


def _prompt_length(model_config: Any, prompt: Any) -> int | None:
    """Tokens of a rendered engine prompt; None when it is not known before the engine
    tokenizes it (the scheduler then checks it)."""
    ids = getattr(prompt, "prompt_token_ids", None)  # an EngineCoreRequest
    if ids is not None:
        return len(ids)
    try:
        from vllm.renderers.inputs.preprocess import extract_prompt_len

        return int(extract_prompt_len(model_config, prompt))
    except Exception:  # noqa: BLE001 - text or streaming prompts: left to the scheduler
        return None


def _argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _check_generate(engine: Any, args: tuple, kwargs: dict) -> None:
    """AsyncLLM.generate(prompt, sampling_params, request_id, ...)."""
    config = config_from_vllm(engine.vllm_config)
    if config is None:
        return
    prompt = _argument(args, kwargs, 0, "prompt")
    params = _argument(args, kwargs, 1, "sampling_params")
    length = _prompt_length(engine.model_config, prompt)
    problem = request_problem(config, getattr(params, "extra_args", None), length)
    if problem is not None:
        _refuse(engine.vllm_config, problem)


def _check_beam_search(serving: Any, args: tuple, kwargs: dict) -> None:
    """beam_search(prompt, request_id, params, ...) on a serving class."""
    engine = serving.engine_client
    config = config_from_vllm(engine.vllm_config)
    if config is None:
        return
    prompt = _argument(args, kwargs, 0, "prompt")
    params = _argument(args, kwargs, 2, "params")
    length = _prompt_length(engine.model_config, prompt)
    if length is None:
        return
    longest = length + max(1, int(getattr(params, "max_tokens", 1) or 1)) - 1
    try:
        config.request_budget(longest)
    except PromptTooLongError:
        _refuse(
            engine.vllm_config,
            RandKVRequestError(
                f"beam search of {params.max_tokens} tokens on a prompt of {length} tokens "
                f"needs prompts of up to {longest} tokens, which exceeds the RandKV budget "
                f"K={config.budget}: vLLM runs beam search by resubmitting the prompt and "
                "each beam as a new prompt at every step, so every beam token becomes a "
                "prompt token (RandKV keeps prompts whole and evicts nothing during beam "
                f"search). Lower max_tokens, or {SERVE_LONG_PROMPTS}",
                parameter="use_beam_search",
            ),
        )


def _check_engine_input(serving: Any, args: tuple, kwargs: dict) -> None:
    """OpenAIServingResponses._generate_with_builtin_tools(request_id=, engine_input=,
    sampling_params=, ...): the responses route's own loop around generate."""
    engine = serving.engine_client
    prompt = kwargs.get("engine_input", args[1] if len(args) > 1 else None)
    params = kwargs.get("sampling_params", args[2] if len(args) > 2 else None)
    _check_generate(engine, (prompt, params), {})


def _checked_at_call(generator_function: Callable, check: Callable) -> Callable:
    """`generator_function` (an async generator method), checked when it is called: the
    check raises while the route still handles the request, before any stream starts."""

    @functools.wraps(generator_function)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        check(self, args, kwargs)
        return generator_function(self, *args, **kwargs)

    call.__randkv_wrapped__ = True  # type: ignore[attr-defined]
    return call


def _targets() -> list[tuple[Any, str, Callable]]:
    from vllm.v1.engine.async_llm import AsyncLLM

    targets: list[tuple[Any, str, Callable]] = [(AsyncLLM, "generate", _check_generate)]
    try:
        from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
    except ImportError:  # pragma: no cover - every supported release has it
        pass
    else:
        targets.append((BeamSearchOnlineMixin, "beam_search", _check_beam_search))
    try:
        from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
    except ImportError:  # pragma: no cover
        pass
    else:
        targets.append(
            (OpenAIServingResponses, "_generate_with_builtin_tools", _check_engine_input)
        )
    return targets


def install(config: RandKVConfig) -> None:
    """Wrap the server's generating calls and add the request-body check to the app vLLM
    builds next (idempotent)."""
    for cls, name, check in _targets():
        method = getattr(cls, name)
        if not getattr(method, "__randkv_wrapped__", False):
            setattr(cls, name, _checked_at_call(method, check))
    from randkv.vllm.release.compat.entrypoints import add_app_middleware

    add_app_middleware(RandKVRequestFields, config=config)


# --------------------------------------------------------------------------- request bodies


def boolean_field_problem(config: RandKVConfig, body: Any) -> str | None:
    """RandKV's message for a JSON boolean in a `randkv_*` field of a request body's
    `vllm_xargs` (or `sampling_params.extra_args`), which vLLM would read as 0 or 1."""
    if not isinstance(body, dict):
        return None
    places = [body.get("vllm_xargs")]
    sampling = body.get("sampling_params")
    if isinstance(sampling, dict):
        places.append(sampling.get("extra_args"))
    for extra in places:
        if not isinstance(extra, dict):
            continue
        for name, value in extra.items():
            if name.startswith("randkv_") and isinstance(value, bool):
                problem = request_problem(config, {name: value}, None)
                assert problem is not None  # no randkv_* field takes a boolean
                return str(problem)
    return None


class RandKVRequestFields:
    """ASGI middleware: a POST whose JSON body has a boolean `randkv_*` field gets HTTP 400
    (vLLM's error body) before vLLM parses it; every other request passes untouched."""

    def __init__(self, app: Any, config: RandKVConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            if message.get("type") != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        problem = None
        if b"randkv_" in body:
            try:
                problem = boolean_field_problem(self.config, json.loads(body))
            except ValueError:
                problem = None  # not JSON: vLLM answers it
        if problem is not None:
            logger.warning("RandKV rejects a request: %s", problem)
            await _send_error(send, problem)
            return

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _send_error(send: Callable, message: str) -> None:
    payload = {
        "error": {
            "message": message,
            "type": "BadRequestError",
            "param": "vllm_xargs",
            "code": 400,
        }
    }
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
