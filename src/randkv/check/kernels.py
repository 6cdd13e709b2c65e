"""`randkv check` without vLLM: the planner, the compactors, attention over compacted
caches, CUDA-graph replay, compile cost, host syncs, launches and speed.

Each function takes the `Setup` and returns a report line (see `randkv.check.report`).
On CUDA the shapes are real; elsewhere they are tiny and the Triton kernels run in
Triton's interpreter (the command sets TRITON_INTERPRET=1 before Triton is imported).
"""

from __future__ import annotations

import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from randkv import spec
from randkv.kernels.compactor import KVLayout, PagedCompactor
from randkv.kernels.planner import RoundPlanner
from randkv.spec.config import RandKVConfig
from randkv.spec.rounds import RoundPlan

KEYS = (0, 2**63, 2**64 - 1)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEAD_SIZES = (64, 80, 96, 128, 256)
BLOCK_SIZES = (16, 32)
LAYOUTS = ("NHD", "HND", "split")


@dataclass(frozen=True)
class Setup:
    device: torch.device

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def tolerance(self) -> float:
        """Float32 attention error allowed between two summation orders; a wrong token
        changes the output by ~1/length (> 1e-2 here). CUDA kernels may use TF32-like
        reduced-precision paths, hence the looser bound."""
        return 1e-3 if self.cuda else 1e-5

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


# --------------------------------------------------------------------------- helpers


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Random bit patterns (NaN payloads included) of `dtype`: any stray write shows."""
    words = shape[-1] * dtype.itemsize // 2
    bits = torch.randint(-(2**15), 2**15, (*shape[:-1], words), dtype=torch.int16, device=device)
    return bits.view(dtype)


def make_caches(
    layout: str,
    layers: int,
    blocks: int,
    block_size: int,
    heads: int,
    head: int,
    dtype: Any,
    device: torch.device,
) -> list[torch.Tensor]:
    """FlashAttention caches (NHD or HND stride order) or split K/V ones, poisoned."""
    caches = []
    for _ in range(layers):
        if layout == "split":
            caches.append(poisoned((2, blocks, block_size, heads, head), dtype, device))
        elif layout == "NHD":  # physical (blocks, slots, heads, 2D)
            base = poisoned((blocks, block_size, heads, 2 * head), dtype, device)
            caches.append(base.permute(0, 2, 1, 3))
        else:
            caches.append(poisoned((blocks, heads, block_size, 2 * head), dtype, device))
    return caches


def kind_of(layout: str) -> KVLayout:
    return KVLayout.KV_BLOCK_SLOT_HEAD if layout == "split" else KVLayout.BLOCK_HEAD_SLOT


def reference_apply(layout: str, plan: RoundPlan, caches: list[torch.Tensor], tables: Any) -> None:
    """The moves straight from the plan's definition: per (request, layer, head), r rows."""
    device = caches[0].device
    block_size = caches[0].shape[2]
    evicted, sources, tables = plan.evicted.cpu(), plan.sources.cpu(), tables.cpu()
    batch, layers, heads, _ = evicted.shape
    for b in range(batch):
        src_blk = tables[b, sources // block_size].to(device)
        src_off = (sources % block_size).to(device)
        for layer in range(layers):
            cache = caches[layer]
            for h in range(heads):
                holes = evicted[b, layer, h]
                dst_blk = tables[b, holes // block_size].to(device)
                dst_off = (holes % block_size).to(device)
                if layout == "split":
                    for half in (0, 1):
                        cache[half][dst_blk, dst_off, h] = cache[half][src_blk, src_off, h]
                else:
                    cache[dst_blk, h, dst_off] = cache[src_blk, h, src_off]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(view), b.view(view))


def batch_inputs(config: RandKVConfig, size: int, rng: random.Random) -> tuple[list[int], ...]:
    """Prompts (exactly K first, 0 last), keys (the extremes first), round indices (some
    above 2**31)."""
    prompts = [rng.randint(0, config.budget) for _ in range(size)]
    prompts[0] = config.budget
    if size > 1:
        prompts[-1] = 0
    keys = [KEYS[i] if i < len(KEYS) else rng.getrandbits(64) for i in range(size)]
    rounds = [rng.choice((0, 2**31 + 7, 2**40 + 3, rng.randint(0, 1000))) for _ in range(size)]
    return prompts, keys, rounds


def timer(setup: Setup, fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median and min milliseconds: CUDA events on CUDA, perf_counter elsewhere."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if setup.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return {"median_ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4)}


def _result(failures: list[Any], cases: int, what: str, **details: Any) -> dict[str, Any]:
    if failures:
        return {
            "status": "fail",
            "summary": f"{len(failures)}/{cases} {what} differ, first: {failures[0]}",
            "failures": failures[:20],
            **details,
        }
    return {"status": "pass", "summary": f"{cases} {what} identical", **details}


# --------------------------------------------------------------------------- platform


def platform_info(setup: Setup) -> dict[str, Any]:
    details: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "device": str(setup.device),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    try:
        import triton

        details["triton"] = triton.__version__
    except Exception as error:  # the Triton lines then fail on their own
        details["triton"] = f"unavailable: {error}"
    try:
        import vllm

        details["vllm"] = vllm.__version__
    except Exception:
        details["vllm"] = None
    if setup.cuda:
        props = torch.cuda.get_device_properties(setup.device)
        details.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
        where = f"{props.name} (sm {props.major}.{props.minor}), CUDA {torch.version.cuda}"
    else:
        where = "CPU only (tiny shapes; Triton in its interpreter)"
    summary = (
        f"{where}; torch {torch.__version__}, triton {details['triton']}, "
        f"vLLM {details['vllm'] or 'not installed'}"
    )
    return {"status": "info", "summary": summary, **details}


# --------------------------------------------------------------------------- planner


def planner_bit_identity(setup: Setup) -> dict[str, Any]:
    """The planner on this device (Triton backend where it runs) against the torch planner
    on CPU, every row, and against the pure-Python spec on spot checks."""
    backend = "auto" if setup.cuda else "triton"
    configs = [(64, 8, 0), (100, 7, 2**64 - 1), (1, 1, 3), (300, 100, 5)]
    if setup.cuda:
        configs += [(2048, 64, 12345), (4096, 128, 2**63), (4096, 512, 9)]
    layers, heads = (range(36), range(8)) if setup.cuda else (range(2), range(2))
    sizes = (1, 8, 64) if setup.cuda else (1, 3)
    rng = random.Random(1)
    failures, cases, backends = [], 0, set()
    for budget, buffer, seed in configs:
        config = RandKVConfig(budget=budget, buffer_size=buffer, seed=seed)
        here = RoundPlanner(config, layers, heads, setup.device, backend=backend)
        on_cpu = RoundPlanner(config, layers, heads, "cpu", backend="torch")
        backends.add(here.backend)
        for size in sizes:
            prompts, keys, rounds = batch_inputs(config, size, rng)
            try:
                got = here.plan(prompts, keys, rounds).evicted.cpu()
            except Exception as error:  # one config's failure must not hide the others
                cases += 1
                failures.append(
                    {"K": budget, "r": buffer, "batch": size, "error": repr(error)[:300]}
                )
                continue
            equal = torch.equal(got, on_cpu.plan(prompts, keys, rounds).evicted)
            for b in {0, size - 1}:
                layer, head = rng.choice(list(layers)), rng.choice(list(heads))
                expected = spec.evicted_slots(
                    config,
                    prompt_length=prompts[b],
                    request_key=keys[b],
                    round_index=rounds[b],
                    layer=layer,
                    kv_head=head,
                )
                equal &= tuple(got[b, layer, head].tolist()) == expected
            cases += 1
            if not equal:
                failures.append({"K": budget, "r": buffer, "seed": seed, "batch": size})
    line = _result(failures, cases, "planned steps", backends=sorted(backends))
    line["summary"] += f" (planner backend {', '.join(sorted(backends))} vs CPU torch and spec)"
    return line


def planner_slices(setup: Setup) -> dict[str, Any]:
    """Tensor-parallel and pipeline slices plan exactly their part of the full plan."""
    config = RandKVConfig(budget=2048 if setup.cuda else 96, buffer_size=64 if setup.cuda else 8)
    num_layers, num_heads = (36, 8) if setup.cuda else (4, 4)
    prompts, keys, rounds = batch_inputs(config, 8 if setup.cuda else 2, random.Random(2))
    device = setup.device
    backend = "auto" if setup.cuda else "triton"

    def plan(layers: range, heads: range) -> torch.Tensor:
        planner = RoundPlanner(config, layers, heads, device, backend=backend)
        return planner.plan(prompts, keys, rounds).evicted

    full = plan(range(num_layers), range(num_heads))
    cases = {}
    for ranks in (2, 4):
        per = num_heads // ranks
        parts = [plan(range(num_layers), range(i * per, (i + 1) * per)) for i in range(ranks)]
        cases[f"tp{ranks}"] = torch.equal(torch.cat(parts, dim=2), full)
    half = num_layers // 2
    cases["pp2_stage1"] = torch.equal(
        plan(range(half, num_layers), range(num_heads)), full[:, half:]
    )
    failures = [name for name, ok in cases.items() if not ok]
    return _result(failures, len(cases), "TP/PP slices", slices=cases)


# --------------------------------------------------------------------------- compactors


def compactor_matrix(setup: Setup) -> dict[str, Any]:
    """Torch and Triton compactors bitwise against `reference_apply` for every dtype, head
    size, block size and layout vLLM's GPU backends use."""
    from randkv.kernels.triton_compactor import TritonCompactor

    device = setup.device
    config = RandKVConfig(budget=40, buffer_size=8, seed=5)
    requests, layers = 3, 2
    heads_for = {"NHD": 4, "HND": 4, "split": 4} if setup.cuda else {"NHD": 2, "HND": 1, "split": 1}
    head_sizes = HEAD_SIZES
    failures, cases = [], 0
    for block_size in BLOCK_SIZES:
        per = math.ceil(config.max_physical_length / block_size)
        blocks = requests * per + 3  # three blocks nobody owns stay poisoned
        tables = torch.randperm(blocks, generator=torch.Generator().manual_seed(block_size))
        tables = tables[: requests * per].view(requests, per)
        for layout in LAYOUTS:
            heads = heads_for[layout]
            prompts, keys, rounds = batch_inputs(config, requests, random.Random(block_size))
            plan = RoundPlanner(config, range(layers), range(heads)).plan(prompts, keys, rounds)
            plan = RoundPlan(plan.evicted.to(device), plan.sources.to(device))
            for dtype_name, dtype in DTYPES.items():
                for head in head_sizes:
                    base = make_caches(
                        layout, layers, blocks, block_size, heads, head, dtype, device
                    )
                    want = [c.clone() for c in base]
                    reference_apply(layout, plan, want, tables)
                    for name, compactor in (
                        ("torch", PagedCompactor(kind_of(layout), block_size)),
                        ("triton", TritonCompactor(kind_of(layout), block_size)),
                    ):
                        where = f"{name} {layout} {dtype_name} D={head} bs={block_size}"
                        got = [c.clone() for c in base]
                        cases += 1
                        try:
                            compactor.apply(plan, got, tables)
                        except Exception as error:  # recorded; the other cases still run
                            failures.append(f"{where}: {error!r}"[:300])
                            continue
                        if not all(same_bits(g, w) for g, w in zip(got, want, strict=True)):
                            failures.append(where)
    line = _result(failures, cases, "compactions", head_sizes=list(head_sizes))
    line["summary"] += (
        f" ({'/'.join(DTYPES)}, D {','.join(map(str, head_sizes))}, "
        f"block {'/'.join(map(str, BLOCK_SIZES))}, {'/'.join(LAYOUTS)}; torch and Triton)"
    )
    return line


def _write_token(cache: torch.Tensor, layout: str, block: int, offset: int, kv: torch.Tensor):
    """Write one token's (heads, 2D) keys|values into `cache` at (block, offset)."""
    if layout == "split":
        half = kv.shape[-1] // 2
        cache[0, block, offset] = kv[:, :half]
        cache[1, block, offset] = kv[:, half:]
    else:
        cache[block, :, offset] = kv


def _fill_and_compact(
    config: RandKVConfig,
    layout: str,
    compactor: Any,
    planner: RoundPlanner,
    dense: torch.Tensor,  # (layers, tokens, heads, 2D): every token's keys|values
    prompt: int,
    key: int,
    table: torch.Tensor,
    caches: list[torch.Tensor],
) -> int:
    """Decode `dense` token by token into paged caches with RandKV rounds; physical length."""
    block_size = caches[0].shape[2]
    length = 0
    for position in range(dense.shape[1]):
        block, offset = int(table[0, length // block_size]), length % block_size
        for layer, cache in enumerate(caches):
            _write_token(cache, layout, block, offset, dense[layer, position])
        length += 1
        if length == config.max_physical_length:
            index = (position + 1 - config.max_physical_length) // config.buffer_size
            compactor.apply(planner.plan([prompt], [key], [index]), caches, table)
            length = config.compacted_length
    return length


def _physical(cache: torch.Tensor, layout: str, table: torch.Tensor, length: int) -> torch.Tensor:
    """(heads, length, 2D) keys|values in physical slot order."""
    block_size = cache.shape[2]
    slots = torch.arange(length)
    blocks = table[0, slots // block_size].to(cache.device)
    offsets = (slots % block_size).to(cache.device)
    if layout == "split":
        return torch.cat((cache[0, blocks, offsets], cache[1, blocks, offsets]), -1).transpose(0, 1)
    return cache[blocks, :, offsets].transpose(0, 1)


def attention_semantic(setup: Setup) -> dict[str, Any]:
    """Decode with rounds; then each slot holds exactly the spec's position (bitwise), and
    attention (`scaled_dot_product_attention`) over the compacted physical slots equals
    attention over the retained positions of a dense cache."""
    from randkv.kernels.triton_compactor import TritonCompactor

    device = setup.device
    config = RandKVConfig(budget=40, buffer_size=8, seed=11)
    prompt, key, layers, heads, head = 6, 2**64 - 1, 2, 2, 64
    tokens = config.max_physical_length + 3 * config.buffer_size + 5  # 4 rounds, a partial tail
    block_size = 16
    blocks = math.ceil(config.max_physical_length / block_size)
    table = torch.tensor([list(range(blocks, 2 * blocks))[::-1]])  # reversed, offset blocks
    # The torch planner: a Triton planner problem shows in the planner lines, not here.
    planner = RoundPlanner(config, range(layers), range(heads), device, backend="torch")
    generator = torch.Generator().manual_seed(0)
    failures, cases, worst = [], 0, 0.0
    for dtype_name, dtype in DTYPES.items():
        dense = torch.randn(layers, tokens, heads, 2 * head, generator=generator).to(dtype)
        dense = dense.to(device)
        query = torch.randn(heads, 1, head, generator=generator).to(device)
        for layout in ("NHD", "split"):
            compactor = TritonCompactor(kind_of(layout), block_size)
            caches = make_caches(layout, layers, 2 * blocks, block_size, heads, head, dtype, device)
            length = _fill_and_compact(
                config, layout, compactor, planner, dense, prompt, key, table, caches
            )
            for layer in range(layers):
                physical = _physical(caches[layer], layout, table, length)  # (H, len, 2D)
                for h in range(heads):
                    cases += 1
                    where = f"{dtype_name} {layout} layer {layer} head {h}"
                    slots = spec.slot_positions(
                        config,
                        prompt_length=prompt,
                        tokens_seen=tokens,
                        request_key=key,
                        layer=layer,
                        kv_head=h,
                    )
                    if not same_bits(physical[h], dense[layer, list(slots), h]):
                        failures.append(f"slot contents: {where}")
                        continue
                    kept = list(
                        spec.retained_positions(
                            config,
                            prompt_length=prompt,
                            tokens_seen=tokens,
                            request_key=key,
                            layer=layer,
                            kv_head=h,
                        )
                    )
                    ours = _attend(query[h], physical[h])
                    want = _attend(query[h], dense[layer, kept, h])
                    error = float((ours - want).abs().max())
                    worst = max(worst, error)
                    if error > setup.tolerance:
                        failures.append(f"attention: {where}, max error {error:.2e}")
    line = _result(failures, cases, "(layer, head, dtype, layout) attentions", max_error=worst)
    if not failures:
        line["summary"] = (
            f"{cases} attentions over compacted slots equal attention over the retained "
            f"positions (max error {worst:.1e}; slot contents bitwise)"
        )
    return line


def _attend(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """SDPA in float32 of one head's (1, D) query over (n, 2D) keys|values."""
    head = query.shape[-1]
    keys, values = kv[:, :head].float(), kv[:, head:].float()
    return torch.nn.functional.scaled_dot_product_attention(
        query.float()[None, None], keys[None, None], values[None, None]
    )[0, 0]


# --------------------------------------------------------------------------- CUDA graphs


def cuda_graph_replay(setup: Setup) -> dict[str, Any]:
    """A captured graph reads a seq_lens buffer, a slot buffer and the KV cache; after
    RandKV's in-place edits (compaction of the cache, `seq_lens -= shift` as the worker
    does) its replay must equal eager attention over the retained positions.

    Without CUDA the same body runs eagerly (the line is then a skip, not a pass)."""
    from randkv.kernels.triton_compactor import TritonCompactor
    from randkv.spec.cadence import physical_lengths

    device = setup.device
    config = RandKVConfig(budget=40, buffer_size=8, seed=3)
    layers, heads, head, block_size, requests = 1, 2, 64, 16, 2
    per = math.ceil(config.max_physical_length / block_size)
    tables = torch.arange(requests * per).view(requests, per).flip(1)
    dense = torch.randn(requests, config.max_physical_length, heads, 2 * head).to(device)
    base = torch.zeros(requests * per, block_size, heads, 2 * head, device=device)  # NHD
    cache = base.permute(0, 2, 1, 3)
    rows = base.view(-1, heads, 2 * head)
    for b in range(requests):  # fill to K + 2r: the next step fires a round
        slots = torch.arange(config.max_physical_length)
        rows[(tables[b, slots // block_size] * block_size + slots % block_size).to(device)] = dense[
            b
        ]
    slot_rows = torch.stack(
        [tables[b, slots // block_size] * block_size + slots % block_size for b in range(requests)]
    ).to(device)  # (B, max len): the persistent slot buffer
    seq_lens = torch.full((requests,), config.max_physical_length, dtype=torch.int32, device=device)
    query = torch.randn(requests, heads, 1, head, device=device)
    out = torch.zeros(requests, heads, 1, head, device=device)

    def body() -> None:
        kv = rows[slot_rows]  # (B, len, H, 2D)
        keys, values = kv[..., :head].transpose(1, 2), kv[..., head:].transpose(1, 2)
        visible = torch.arange(slot_rows.shape[1], device=device)[None, :] < seq_lens[:, None]
        mask = visible[:, None, None, :]
        out.copy_(torch.nn.functional.scaled_dot_product_attention(query, keys, values, mask))

    if setup.cuda:
        body()  # warm up outside capture (allocations, kernel selection)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        run = graph.replay
    else:
        run = body
    run()
    before = out.clone()
    keys_ = [11, 2**64 - 1]
    planner = RoundPlanner(config, range(layers), range(heads), device, backend="torch")
    plan = planner.plan([4, 0], keys_, [0, 0])
    TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size).apply(plan, [cache], tables)
    shift = config.max_physical_length - physical_lengths(config, config.max_physical_length)
    seq_lens -= shift  # in place, like randkv_physical_inputs
    run()
    setup.synchronize()
    failures, worst = [], 0.0
    for b, prompt in enumerate([4, 0]):
        for h in range(heads):
            kept = list(
                spec.retained_positions(
                    config,
                    prompt_length=prompt,
                    tokens_seen=config.max_physical_length,
                    request_key=keys_[b],
                    layer=0,
                    kv_head=h,
                )
            )
            kv = dense[b, kept, h]
            want = torch.nn.functional.scaled_dot_product_attention(
                query[b, h][None], kv[None, :, :head], kv[None, :, head:]
            )[0]
            error = float((out[b, h] - want).abs().max())
            worst = max(worst, error)
            if error > setup.tolerance:
                failures.append(f"request {b} head {h}: error {error:.2e}")
    if torch.equal(before, out):
        failures.append("the replay after the edits returned the pre-edit output")
    line = _result(failures, requests * heads, "replayed attentions", max_error=worst)
    if not failures:
        line["summary"] = (
            f"graph replayed after in-place compaction and seq_lens edit: equals attention "
            f"over retained positions (max error {worst:.1e})"
        )
        if not setup.cuda:
            line["status"] = "skip"
            line["summary"] = "no CUDA: the graph body ran eagerly and matched; nothing captured"
    return line


# --------------------------------------------------------------------------- compile


def compile_once(setup: Setup) -> dict[str, Any]:
    """Warm-up compiles each Triton kernel's one serving variant (timed on CUDA); then
    serving-like steps (any batch, table widths 1 / 16k / other) meet only warmed keys and,
    on CUDA, add nothing to Triton's cache."""
    from randkv.kernels import triton_compactor, triton_planner
    from randkv.kernels.triton_compactor import TritonCompactor
    from randkv.kernels.triton_jit import Kernel

    device = setup.device
    config = RandKVConfig(budget=2048 if setup.cuda else 40, buffer_size=64 if setup.cuda else 4)
    layers, heads, head, block_size = (4, 8, 128, 16) if setup.cuda else (2, 1, 64, 16)
    blocks = 64
    caches = make_caches("NHD", layers, blocks, block_size, heads, head, torch.bfloat16, device)
    kernels = {"compactor": triton_compactor.KERNEL, "planner": triton_planner.KERNEL}
    saved = {n: (k.warmed, k.launched) for n, k in kernels.items()}
    tracking = Kernel.tracking
    Kernel.tracking = True
    try:
        for kernel in kernels.values():
            kernel.warmed, kernel.launched = set(), __import__("collections").Counter()
        backend = "auto" if setup.cuda else "triton"
        planner = RoundPlanner(config, range(layers), range(heads), device, backend=backend)
        compactor = TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size)
        seconds = {
            "compactor": compactor.warmup(caches, config.buffer_size),
            "planner": planner.warmup(),
        }
        variants = {n: k.compiled_variants(device) for n, k in kernels.items()}
        per = math.ceil(config.max_physical_length / block_size)
        for batch, width in ((1, 1), (2, 16), (3, 17), (1, per)):
            tables = torch.randint(0, blocks, (batch, width))
            plan = planner.plan([0] * batch, list(range(batch)), [width] * batch)
            compactor.apply(plan, caches, tables)  # columns past the width are masked
        setup.synchronize()
        after = {n: k.compiled_variants(device) for n, k in kernels.items()}
        unwarmed = {n: len(set(k.launched) - k.warmed) for n, k in kernels.items()}
    finally:
        Kernel.tracking = tracking
        for name, kernel in kernels.items():
            kernel.warmed, kernel.launched = saved[name]
    failures = [f"{n}: {c} unwarmed variants launched" for n, c in unwarmed.items() if c]
    failures += [
        f"{n}: Triton cache grew {variants[n]} -> {after[n]} after warm-up"
        for n in kernels
        if variants[n] is not None and after[n] != variants[n]
    ]
    details = {"compile_seconds": seconds, "variants": after, "unwarmed": unwarmed}
    if failures:
        return {"status": "fail", "summary": "; ".join(failures), **details}
    if setup.cuda:
        summary = (
            f"warm-up compiled compactor in {seconds['compactor']:.2f} s, planner in "
            f"{seconds['planner']:.2f} s (a Triton disk-cache hit is faster); "
            "serving-like steps compiled nothing"
        )
    else:
        summary = "serving-like steps meet only the warmed variants (interpreter: no compile)"
    return {"status": "pass", "summary": summary, **details}


# --------------------------------------------------------------------------- host work


def host_syncs(setup: Setup) -> dict[str, Any]:
    """One step's RandKV work (plan + compaction) reads nothing back to the host."""
    from randkv.kernels.hostsync import count_host_syncs
    from randkv.kernels.triton_compactor import TritonCompactor

    device = setup.device
    config = RandKVConfig(budget=2048 if setup.cuda else 32, buffer_size=64 if setup.cuda else 4)
    layers, heads, head, requests = (4, 8, 128, 8) if setup.cuda else (2, 2, 64, 2)
    block_size = 16
    per = math.ceil(config.max_physical_length / block_size)
    tables = torch.randperm(requests * per).view(requests, per)  # a host tensor
    caches = make_caches(
        "NHD", layers, requests * per, block_size, heads, head, torch.bfloat16, device
    )
    planner = RoundPlanner(config, range(layers), range(heads), device)
    compactors = {
        "triton": TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
        "torch": PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
    }
    prompts, keys, rounds = batch_inputs(config, requests, random.Random(5))

    def step(compactor: Any) -> None:
        compactor.apply(planner.plan(prompts, keys, rounds), caches, tables)

    for compactor in compactors.values():
        step(compactor)  # warm up: compile, pinned buffers
    setup.synchronize()
    counts = {}
    for name, compactor in compactors.items():
        with count_host_syncs() as syncs:
            step(compactor)
        counts[name] = {"total": syncs.total, "by_op": dict(syncs.counts)}
    failures = [f"plan+{n}: {c['by_op']}" for n, c in counts.items() if c["total"]]
    details: dict[str, Any] = {"counts": counts}
    if setup.cuda:
        torch.cuda.set_sync_debug_mode("error")  # raises on any synchronizing CUDA call
        try:
            step(compactors["triton"])
            details["cuda_sync_debug_mode"] = "no synchronizing call"
        except RuntimeError as error:
            failures.append(f"CUDA sync debug mode: {error}")
        finally:
            torch.cuda.set_sync_debug_mode(0)
    line = _result(failures, len(counts), "steps", **details)
    if not failures:
        line["summary"] = "0 host syncs per step (plan + Triton or torch compaction)" + (
            ", none under CUDA's sync debug mode" if setup.cuda else ""
        )
    return line


def launches(setup: Setup) -> dict[str, Any]:
    """Kernel launches per planned step of 64 rounds: this device's planner vs torch's."""
    from randkv.kernels.launches import planner_launches

    config = RandKVConfig(budget=2048, buffer_size=64)
    layers, heads = (range(36), range(8)) if setup.cuda else (range(1), range(1))
    backend = "auto" if setup.cuda else "triton"
    here = RoundPlanner(config, layers, heads, setup.device, backend=backend)
    torch_planner = RoundPlanner(config, layers, heads, setup.device, backend="torch")
    counts = {}
    for name, planner in ((here.backend, here), ("torch", torch_planner)):
        total, by_op = planner_launches(planner, 64)
        counts[name] = {"launches": total, "by_op": dict(by_op)}
    fast = counts[here.backend]["launches"]
    status = "pass" if fast <= 4 else "fail"
    summary = (
        f"64-round step: {here.backend} planner {fast} launches, torch planner "
        f"{counts['torch']['launches']}; compaction 1 launch"
    )
    return {"status": status, "summary": summary, "counts": counts}


# --------------------------------------------------------------------------- speed


def speed(setup: Setup) -> dict[str, Any]:
    """Compaction GB/s against a plain device copy of the same bytes, and planner time, at
    Qwen3-4B-like shapes (36 layers, 8 KV heads, D 128, bf16) for 1, 8 and 64 rounds."""
    from randkv.kernels.triton_compactor import TritonCompactor

    device = setup.device
    if setup.cuda:
        budget, buffer, layers, heads, head, repeats = 2048, 64, 36, 8, 128, 10
    else:
        budget, buffer, layers, heads, head, repeats = 32, 4, 1, 1, 64, 2
    block_size = 16
    config = RandKVConfig(budget=budget, buffer_size=buffer)
    per = math.ceil(config.max_physical_length / block_size)
    most = 64 if setup.cuda else 2
    tables = torch.randperm(most * per, generator=torch.Generator().manual_seed(0))
    tables = tables.view(most, per)
    caches = make_caches("NHD", layers, most * per, block_size, heads, head, torch.bfloat16, device)
    # Plans come from the torch planner; both planners are timed (a Triton failure is
    # recorded in its row and leaves the compaction figures standing).
    planners = {
        "torch": RoundPlanner(config, range(layers), range(heads), device, backend="torch"),
        "triton": RoundPlanner(
            config, range(layers), range(heads), device, backend="auto" if setup.cuda else "triton"
        ),
    }
    compactors = {
        "triton": TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
        "torch": PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
    }
    rng = random.Random(0)
    details: dict[str, Any] = {
        "shape": {"layers": layers, "kv_heads": heads, "head_dim": head, "K": budget, "r": buffer},
    }
    for rounds in (1, 8, 64) if setup.cuda else (1, 2):
        step = (
            [rng.randint(16, min(1024, budget)) for _ in range(rounds)],
            [rng.getrandbits(64) for _ in range(rounds)],
            [rng.randint(0, 10_000) for _ in range(rounds)],
        )
        details[f"rounds_{rounds}"] = _speed_row(
            setup, planners, compactors, caches, tables[:rounds], step, repeats
        )
    last = details[f"rounds_{64 if setup.cuda else 2}"]
    if setup.cuda:
        summary = (
            f"64 rounds: Triton compaction {last['triton']['gb_per_s']} GB/s = "
            f"{last['triton']['fraction_of_copy']:.2f}x a plain copy (torch "
            f"{last['torch']['fraction_of_copy']:.2f}x); planner Triton "
            f"{last['planner_triton'].get('median_ms', 'error')} ms, torch "
            f"{last['planner_torch'].get('median_ms', 'error')} ms"
        )
    else:
        summary = "CPU timings say nothing about a GPU (recorded in the JSON only)"
    return {"status": "info", "summary": summary, **details}


def _speed_row(
    setup: Setup,
    planners: dict[str, RoundPlanner],
    compactors: dict[str, Any],
    caches: list[torch.Tensor],
    tables: torch.Tensor,
    step: tuple[list[int], list[int], list[int]],
    repeats: int,
) -> dict[str, Any]:
    """Planner and compaction times of one step, against a plain copy of the same bytes."""
    device = setup.device
    plan = planners["torch"].plan(*step)
    moved = compactors["triton"].moved_bytes(plan, caches)
    source = torch.empty(moved, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = timer(setup, lambda: target.copy_(source), repeats)
    row: dict[str, Any] = {
        "moved_bytes": moved,
        "plain_copy": {**copy, "gb_per_s": round(moved / copy["median_ms"] / 1e6, 2)},
    }
    for name, planner in planners.items():
        try:
            row[f"planner_{name}"] = timer(setup, lambda p=planner: p.plan(*step), repeats)
        except Exception as error:  # recorded in the row; compaction is still timed
            row[f"planner_{name}"] = {"error": repr(error)[:300]}
    for name, compactor in compactors.items():
        timing = timer(setup, lambda c=compactor: c.apply(plan, caches, tables), repeats)
        gbps = moved / timing["median_ms"] / 1e6
        row[name] = {
            **timing,
            "gb_per_s": round(gbps, 2),
            "fraction_of_copy": round(gbps / row["plain_copy"]["gb_per_s"], 3),
        }
    return row


#: (line name, check) in run order: compile first, so its times are cold compiles.
CHECKS: tuple[tuple[str, Callable[[Setup], dict[str, Any]]], ...] = (
    ("compile_once", compile_once),
    ("planner_bit_identity", planner_bit_identity),
    ("planner_slices", planner_slices),
    ("compactor_matrix", compactor_matrix),
    ("attention_semantic", attention_semantic),
    ("cuda_graph_replay", cuda_graph_replay),
    ("host_syncs", host_syncs),
    ("launches", launches),
    ("speed", speed),
)
