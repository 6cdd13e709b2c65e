"""`randkv check` without vLLM: the planner, the compactors, attention over compacted
caches, CUDA-graph replay, compile cost, host syncs, launches and speed.

Each function takes the `Setup` and returns a `CheckLine` (see `randkv.check.report`).
Caches, the reference compaction and the timer are `randkv.kernels.reference`'s and
`randkv.bench.timing`'s, the same the kernel tests and benchmarks use.
On CUDA the shapes are real; elsewhere they are tiny and the Triton kernels run in
Triton's interpreter (the command sets TRITON_INTERPRET=1 before Triton is imported).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import platform
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from randkv import spec
from randkv.bench.records import OMITTED_WHEN_NONE, Json, to_json
from randkv.bench.timing import Timing, time_calls
from randkv.check.report import CheckLine, Status
from randkv.kernels.compactor import Compactor, KVLayout, PagedCompactor
from randkv.kernels.planner import RoundPlanner
from randkv.kernels.reference import (
    LAYOUTS,
    CacheLayout,
    kv_layout,
    poisoned_caches,
    reference_compact,
    same_bits,
)
from randkv.spec.config import RandKVConfig
from randkv.spec.rounds import RoundPlan

KEYS = (0, 2**63, 2**64 - 1)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEAD_SIZES = (64, 80, 96, 128, 256)
BLOCK_SIZES = (16, 32)


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


def timer(setup: Setup, fn: Callable[[], object], repeats: int) -> Timing:
    """Median and min milliseconds (`randkv.bench.timing.time_calls`: CUDA events on CUDA,
    the host clock elsewhere), rounded for the report."""
    return time_calls(fn, repeats=repeats, device=setup.device).rounded(4)


def _result(failures: Sequence[Json], cases: int, what: str, **details: Json) -> CheckLine:
    if failures:
        return CheckLine(
            status="fail",
            summary=f"{len(failures)}/{cases} {what} differ, first: {failures[0]}",
            details={"failures": list(failures[:20]), **details},
        )
    return CheckLine(summary=f"{cases} {what} identical", details=details)


def _with_summary(line: CheckLine, summary: str) -> CheckLine:
    return dataclasses.replace(line, summary=summary)


# --------------------------------------------------------------------------- platform


def platform_info(setup: Setup) -> CheckLine:
    details: dict[str, Json] = {
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
    return CheckLine(status="info", summary=summary, details=details)


# --------------------------------------------------------------------------- planner


def planner_bit_identity(setup: Setup) -> CheckLine:
    """The planner on this device (Triton backend where it runs) against the torch planner
    on CPU, every row, and against the pure-Python spec on spot checks."""
    backend = "auto" if setup.cuda else "triton"
    configs = [(64, 8, 0), (100, 7, 2**64 - 1), (1, 1, 3), (300, 100, 5)]
    if setup.cuda:
        configs += [(2048, 64, 12345), (4096, 128, 2**63), (4096, 512, 9)]
    layers, heads = (range(36), range(8)) if setup.cuda else (range(2), range(2))
    sizes = (1, 8, 64) if setup.cuda else (1, 3)
    rng = random.Random(1)
    failures: list[Json] = []
    cases, backends = 0, set()
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
    return _with_summary(
        line,
        f"{line.summary} (planner backend {', '.join(sorted(backends))} vs CPU torch and spec)",
    )


def planner_slices(setup: Setup) -> CheckLine:
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
    failures: list[Json] = [name for name, ok in cases.items() if not ok]
    return _result(failures, len(cases), "TP/PP slices", slices=cases)


# --------------------------------------------------------------------------- compactors


def compactor_matrix(setup: Setup) -> CheckLine:
    """Torch and Triton compactors bitwise against `reference_compact` for every dtype, head
    size, block size and layout vLLM's GPU backends use."""
    from randkv.kernels.triton_compactor import TritonCompactor

    device = setup.device
    config = RandKVConfig(budget=40, buffer_size=8, seed=5)
    requests, layers = 3, 2
    heads_for = {"NHD": 4, "HND": 4, "split": 4} if setup.cuda else {"NHD": 2, "HND": 1, "split": 1}
    head_sizes = HEAD_SIZES
    failures: list[Json] = []
    cases = 0
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
                    base = poisoned_caches(
                        layout, layers, blocks, block_size, heads, head, dtype, device
                    )
                    want = [c.clone() for c in base]
                    reference_compact(kv_layout(layout), plan, want, tables)
                    compactors: tuple[tuple[str, Compactor], ...] = (
                        ("torch", PagedCompactor(kv_layout(layout), block_size)),
                        ("triton", TritonCompactor(kv_layout(layout), block_size)),
                    )
                    for name, compactor in compactors:
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
    return _with_summary(
        line,
        f"{line.summary} ({'/'.join(DTYPES)}, D {','.join(map(str, head_sizes))}, "
        f"block {'/'.join(map(str, BLOCK_SIZES))}, {'/'.join(LAYOUTS)}; torch and Triton)",
    )


def _write_token(
    cache: torch.Tensor, layout: CacheLayout, block: int, offset: int, kv: torch.Tensor
) -> None:
    """Write one token's (heads, 2D) keys|values into `cache` at (block, offset)."""
    if layout == "split":
        half = kv.shape[-1] // 2
        cache[0, block, offset] = kv[:, :half]
        cache[1, block, offset] = kv[:, half:]
    else:
        cache[block, :, offset] = kv


def _fill_and_compact(
    config: RandKVConfig,
    layout: CacheLayout,
    compactor: Compactor,
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


def _physical(
    cache: torch.Tensor, layout: CacheLayout, table: torch.Tensor, length: int
) -> torch.Tensor:
    """(heads, length, 2D) keys|values in physical slot order."""
    block_size = cache.shape[2]
    slots = torch.arange(length)
    blocks = table[0, slots // block_size].to(cache.device)
    offsets = (slots % block_size).to(cache.device)
    if layout == "split":
        return torch.cat((cache[0, blocks, offsets], cache[1, blocks, offsets]), -1).transpose(0, 1)
    return cache[blocks, :, offsets].transpose(0, 1)


def attention_semantic(setup: Setup) -> CheckLine:
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
    failures: list[Json] = []
    cases, worst = 0, 0.0
    for dtype_name, dtype in DTYPES.items():
        dense = torch.randn(layers, tokens, heads, 2 * head, generator=generator).to(dtype)
        dense = dense.to(device)
        query = torch.randn(heads, 1, head, generator=generator).to(device)
        layouts: tuple[CacheLayout, ...] = ("NHD", "split")
        for layout in layouts:
            compactor = TritonCompactor(kv_layout(layout), block_size)
            caches = poisoned_caches(
                layout, layers, 2 * blocks, block_size, heads, head, dtype, device
            )
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
    if failures:
        return line
    return _with_summary(
        line,
        f"{cases} attentions over compacted slots equal attention over the retained "
        f"positions (max error {worst:.1e}; slot contents bitwise)",
    )


def _attend(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """SDPA in float32 of one head's (1, D) query over (n, 2D) keys|values."""
    head = query.shape[-1]
    keys, values = kv[:, :head].float(), kv[:, head:].float()
    return torch.nn.functional.scaled_dot_product_attention(
        query.float()[None, None], keys[None, None], values[None, None]
    )[0, 0]


# --------------------------------------------------------------------------- CUDA graphs


def cuda_graph_replay(setup: Setup) -> CheckLine:
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
        run: Callable[[], None] = graph.replay
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
    failures: list[Json] = []
    worst = 0.0
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
    if failures:
        return line
    if not setup.cuda:
        return dataclasses.replace(
            line,
            status="skip",
            summary="no CUDA: the graph body ran eagerly and matched; nothing captured",
        )
    return _with_summary(
        line,
        f"graph replayed after in-place compaction and seq_lens edit: equals attention "
        f"over retained positions (max error {worst:.1e})",
    )


# --------------------------------------------------------------------------- compile


def compile_once(setup: Setup) -> CheckLine:
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
    caches = poisoned_caches("NHD", layers, blocks, block_size, heads, head, torch.bfloat16, device)
    kernels = {"compactor": triton_compactor.KERNEL, "planner": triton_planner.KERNEL}
    saved = {n: (k.warmed, k.launched) for n, k in kernels.items()}
    tracking = Kernel.tracking
    Kernel.tracking = True
    try:
        for kernel in kernels.values():
            kernel.warmed, kernel.launched = set(), collections.Counter()
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
    details: dict[str, Json] = {
        "compile_seconds": seconds,
        "variants": after,
        "unwarmed": unwarmed,
    }
    if failures:
        return CheckLine(status="fail", summary="; ".join(failures), details=details)
    if setup.cuda:
        summary = (
            f"warm-up compiled compactor in {seconds['compactor']:.2f} s, planner in "
            f"{seconds['planner']:.2f} s (a Triton disk-cache hit is faster); "
            "serving-like steps compiled nothing"
        )
    else:
        summary = "serving-like steps meet only the warmed variants (interpreter: no compile)"
    return CheckLine(summary=summary, details=details)


# --------------------------------------------------------------------------- host work


def host_syncs(setup: Setup) -> CheckLine:
    """One step's RandKV work (plan + compaction) reads nothing back to the host."""
    from randkv.kernels.hostsync import count_host_syncs
    from randkv.kernels.triton_compactor import TritonCompactor

    device = setup.device
    config = RandKVConfig(budget=2048 if setup.cuda else 32, buffer_size=64 if setup.cuda else 4)
    layers, heads, head, requests = (4, 8, 128, 8) if setup.cuda else (2, 2, 64, 2)
    block_size = 16
    per = math.ceil(config.max_physical_length / block_size)
    tables = torch.randperm(requests * per).view(requests, per)  # a host tensor
    caches = poisoned_caches(
        "NHD", layers, requests * per, block_size, heads, head, torch.bfloat16, device
    )
    planner = RoundPlanner(config, range(layers), range(heads), device)
    compactors: dict[str, Compactor] = {
        "triton": TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
        "torch": PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
    }
    prompts, keys, rounds = batch_inputs(config, requests, random.Random(5))

    def step(compactor: Compactor) -> None:
        compactor.apply(planner.plan(prompts, keys, rounds), caches, tables)

    for compactor in compactors.values():
        step(compactor)  # warm up: compile, pinned buffers
    setup.synchronize()
    counts: dict[str, Json] = {}
    failures: list[Json] = []
    for name, compactor in compactors.items():
        with count_host_syncs() as syncs:
            step(compactor)
        by_op = dict(syncs.counts)
        counts[name] = {"total": syncs.total, "by_op": by_op}
        if syncs.total:
            failures.append(f"plan+{name}: {by_op}")
    details: dict[str, Json] = {"counts": counts}
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
    if failures:
        return line
    return _with_summary(
        line,
        "0 host syncs per step (plan + Triton or torch compaction)"
        + (", none under CUDA's sync debug mode" if setup.cuda else ""),
    )


def _compaction_launches(setup: Setup) -> tuple[int, collections.Counter[str]]:
    """Launches of one Triton compaction of a step's rounds (the count does not depend on
    the shape: one kernel for every request, layer and head, besides its copies)."""
    from randkv.kernels.launches import count_launches
    from randkv.kernels.triton_compactor import TritonCompactor

    device, block_size = setup.device, 16
    if setup.cuda:
        config, requests, layers, heads, head = (
            RandKVConfig(budget=256, buffer_size=16),
            64,
            2,
            8,
            128,
        )
    else:
        config, requests, layers, heads, head = RandKVConfig(budget=32, buffer_size=4), 2, 1, 1, 64
    per = math.ceil(config.max_physical_length / block_size)
    tables = torch.randperm(requests * per).view(requests, per).to(device)  # the engine's
    caches = poisoned_caches(
        "NHD", layers, requests * per, block_size, heads, head, torch.bfloat16, device
    )
    planner = RoundPlanner(config, range(layers), range(heads), device, backend="torch")
    plan = planner.plan(*batch_inputs(config, requests, random.Random(6)))
    compactor = TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size)
    compactor.apply(plan, caches, tables)  # warm up: compile, pinned buffers
    setup.synchronize()
    return count_launches(lambda: compactor.apply(plan, caches, tables))


def launches(setup: Setup) -> CheckLine:
    """Kernel launches per planned step of 64 rounds (this device's planner vs torch's), and
    of one Triton compaction: one kernel whatever the step holds."""
    from randkv.kernels.launches import LAUNCH_LABEL, planner_launches

    config = RandKVConfig(budget=2048, buffer_size=64)
    layers, heads = (range(36), range(8)) if setup.cuda else (range(1), range(1))
    backend = "auto" if setup.cuda else "triton"
    here = RoundPlanner(config, layers, heads, setup.device, backend=backend)
    torch_planner = RoundPlanner(config, layers, heads, setup.device, backend="torch")
    counts: dict[str, Json] = {}
    totals: dict[str, int] = {}
    for name, planner in ((here.backend, here), ("torch", torch_planner)):
        total, by_op = planner_launches(planner, 64)
        counts[name] = {"launches": total, "by_op": dict(by_op)}
        totals[name] = total
    compaction, compaction_ops = _compaction_launches(setup)
    kernels = sum(n for op, n in compaction_ops.items() if op.startswith(LAUNCH_LABEL))
    fast = totals[here.backend]
    status: Status = "pass" if fast <= 4 and kernels == 1 else "fail"
    summary = (
        f"64-round step: {here.backend} planner {fast} launches, torch planner "
        f"{totals['torch']}; compaction {compaction} launch{'' if compaction == 1 else 'es'}"
    )
    details: dict[str, Json] = {
        "counts": counts,
        "compaction": {"launches": compaction, "kernels": kernels, "by_op": dict(compaction_ops)},
    }
    return CheckLine(status=status, summary=summary, details=details)


# --------------------------------------------------------------------------- speed


def speed(setup: Setup) -> CheckLine:
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
    caches = poisoned_caches(
        "NHD", layers, most * per, block_size, heads, head, torch.bfloat16, device
    )
    # Plans come from the torch planner; both planners are timed (a Triton failure is
    # recorded in its row and leaves the compaction figures standing).
    planners = {
        "torch": RoundPlanner(config, range(layers), range(heads), device, backend="torch"),
        "triton": RoundPlanner(
            config, range(layers), range(heads), device, backend="auto" if setup.cuda else "triton"
        ),
    }
    compactors: dict[str, Compactor] = {
        "triton": TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
        "torch": PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
    }
    rng = random.Random(0)
    details: dict[str, Json] = {
        "shape": {"layers": layers, "kv_heads": heads, "head_dim": head, "K": budget, "r": buffer},
    }
    rows: list[SpeedRow] = []
    for rounds in (1, 8, 64) if setup.cuda else (1, 2):
        step = (
            [rng.randint(16, min(1024, budget)) for _ in range(rounds)],
            [rng.getrandbits(64) for _ in range(rounds)],
            [rng.randint(0, 10_000) for _ in range(rounds)],
        )
        row = _speed_row(setup, planners, compactors, caches, tables[:rounds], step, repeats)
        rows.append(row)
        details[f"rounds_{rounds}"] = to_json(row)
    last = rows[-1]
    if setup.cuda:
        summary = (
            f"64 rounds: Triton compaction {last.triton.gb_per_s} GB/s = "
            f"{last.triton.fraction_of_copy:.2f}x a plain copy (torch "
            f"{last.torch.fraction_of_copy:.2f}x); planner Triton "
            f"{_ms(last.planner_triton)} ms, torch {_ms(last.planner_torch)} ms"
        )
    else:
        summary = "CPU timings say nothing about a GPU (recorded in the JSON only)"
    return CheckLine(status="info", summary=summary, details=details)


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """A timed copy or compaction of `SpeedRow.moved_bytes`, milliseconds and GB/s."""

    median_ms: float
    min_ms: float
    repeats: int
    gb_per_s: float
    # Over the plain copy's GB/s (None: the plain copy itself).
    fraction_of_copy: float | None = field(default=None, metadata=OMITTED_WHEN_NONE)


@dataclass(frozen=True, kw_only=True)
class Failed:
    """A timing that could not be taken."""

    error: str


@dataclass(frozen=True, kw_only=True)
class SpeedRow:
    """Planner and compaction times of one step, against a plain copy of the same bytes."""

    moved_bytes: int
    plain_copy: Throughput
    planner_torch: Timing | Failed
    planner_triton: Timing | Failed
    triton: Throughput
    torch: Throughput


def _ms(timing: Timing | Failed) -> str:
    return str(timing.median_ms) if isinstance(timing, Timing) else "error"


def _speed_row(
    setup: Setup,
    planners: dict[str, RoundPlanner],
    compactors: dict[str, Compactor],
    caches: list[torch.Tensor],
    tables: torch.Tensor,
    step: tuple[list[int], list[int], list[int]],
    repeats: int,
) -> SpeedRow:
    """Planner and compaction times of one step, against a plain copy of the same bytes."""
    device = setup.device
    plan = planners["torch"].plan(*step)
    moved = compactors["triton"].moved_bytes(plan, caches)
    source = torch.empty(moved, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = timer(setup, lambda: target.copy_(source), repeats)
    copy_gbps = round(moved / copy.median_ms / 1e6, 2)
    planned: dict[str, Timing | Failed] = {}
    for name, planner in planners.items():
        try:
            planned[name] = timer(setup, functools.partial(planner.plan, *step), repeats)
        except Exception as error:  # recorded in the row; compaction is still timed
            planned[name] = Failed(error=repr(error)[:300])
    compacted: dict[str, Throughput] = {}
    for name, compactor in compactors.items():
        timing = timer(setup, functools.partial(compactor.apply, plan, caches, tables), repeats)
        gbps = moved / timing.median_ms / 1e6
        compacted[name] = Throughput(
            median_ms=timing.median_ms,
            min_ms=timing.min_ms,
            repeats=timing.repeats,
            gb_per_s=round(gbps, 2),
            fraction_of_copy=round(gbps / copy_gbps, 3),
        )
    return SpeedRow(
        moved_bytes=moved,
        plain_copy=Throughput(
            median_ms=copy.median_ms, min_ms=copy.min_ms, repeats=copy.repeats, gb_per_s=copy_gbps
        ),
        planner_torch=planned["torch"],
        planner_triton=planned["triton"],
        triton=compacted["triton"],
        torch=compacted["torch"],
    )


#: (line name, check) in run order: compile first, so its times are cold compiles.
CHECKS: tuple[tuple[str, Callable[[Setup], CheckLine]], ...] = (
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
