"""RandKV's request checks at vLLM's OpenAI-compatible front door.

A prompt longer than K, or a malformed `randkv_*` request field, is answered with HTTP 400
and RandKV's message before the engine sees the request, for completions and chat, streaming
or not. vLLM's own length check sits in the same place (after the prompt is rendered, before
a stream starts); later checks would answer a stream with HTTP 200 and an in-band error.

vLLM offers no hook for extra request validation, so this wraps the two methods that render
a request, `OpenAIServingCompletion.render_completion_request` and
`OpenAIServingChat.render_chat_request` (listed with their upgrade risk in
docs/vllm-integration.md). The wrap reads the engine's RandKVConfig on every call (the one
the plugin parsed, an attribute read), so it does nothing for an engine without RandKV.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from vllm.logger import init_logger

from randkv.config import PromptTooLongError, RandKVConfig
from randkv.vllm.options import config_from_vllm
from randkv.vllm.request_key import check_request_fields

logger = init_logger("vllm.randkv.front_door")

RAISE_BUDGET = (
    'with --additional-config \'{"randkv": {"budget": ...}}\' (randkv serve: --randkv-budget)'
)


def request_problem(
    config: RandKVConfig, extra_args: dict[str, Any] | None, prompt_lengths: list[int]
) -> tuple[str, str] | None:
    """(message, parameter) of what RandKV refuses in a request, or None."""
    try:
        check_request_fields(extra_args)
    except (TypeError, ValueError) as error:
        return str(error), "vllm_xargs"
    for length in prompt_lengths:
        try:
            config.check_prompt(length)
        except PromptTooLongError as error:
            return f"{error} {RAISE_BUDGET}", "prompt"
    return None


def _checked(render: Callable[..., Any], engine_inputs: Callable[[Any], list[Any]]) -> Any:
    @functools.wraps(render)
    async def render_and_check(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = await render(self, request, *args, **kwargs)
        config = config_from_vllm(self.engine_client.vllm_config)
        if config is None or not isinstance(result, list | tuple):  # off, or an ErrorResponse
            return result
        lengths = [self._extract_prompt_len(item) for item in engine_inputs(result)]
        problem = request_problem(config, getattr(request, "vllm_xargs", None), lengths)
        if problem is None:
            return result
        message, parameter = problem
        logger.warning("RandKV rejects a request: %s", message)
        if parameter == "prompt":
            _count_rejection(self.engine_client.vllm_config)
        return self.create_error_response(
            message, err_type="BadRequestError", status_code=HTTPStatus.BAD_REQUEST,
            param=parameter,
        )  # fmt: skip

    render_and_check.__randkv_wrapped__ = True  # type: ignore[attr-defined]
    return render_and_check


def _count_rejection(vllm_config: Any) -> None:
    from randkv.vllm.metrics import RandKVRecorder, Source

    RandKVRecorder(vllm_config, Source.SCHEDULER, publishes_once=True).add("rejected_prompts", 1)


def install() -> None:
    """Wrap the completion and chat renderers (idempotent)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    targets = (
        (OpenAIServingCompletion, "render_completion_request", lambda inputs: inputs),
        # A chat render returns (conversation, engine inputs).
        (OpenAIServingChat, "render_chat_request", lambda result: result[1]),
    )
    for cls, name, engine_inputs in targets:
        render = getattr(cls, name)
        if not getattr(render, "__randkv_wrapped__", False):
            setattr(cls, name, _checked(render, engine_inputs))
