"""GPU check of RandKV's planner and compactors: one unattended run, one JSON file.

Needs torch (2.11 or newer) with CUDA, Triton, and this repo's src/ (added to sys.path
here; vLLM is not needed). Checks, each recorded pass/fail with details, none stopping
the others:

- planner: plans on CUDA bit-identical to CPU (and spot-checked against `randkv.spec`)
  over several configs, batches of 1/8/64, keys 0, 2**63, 2**64 - 1, round indices above
  2**31, prompts of exactly K; tensor-parallel and pipeline slices of the full plan;
- compactors: the torch `PagedCompactor` and the Triton kernel bitwise against an
  independent reference on FlashAttention's layout (NHD and HND stride orders, 1 and 8
  KV heads) and the split layout, and a multi-round replay against `randkv.spec`;
- host syncs of one step's RandKV work (plan + compaction), counted with
  `randkv.hostsync` and, on CUDA, under torch's sync debug mode;
- speed at Qwen3-4B-like shapes for 1, 8 and 64 rounds per step, timed with CUDA events,
  with the targets (compaction at 64 rounds >= 50% of a plain copy's GB/s, planner for
  64 rounds < 0.2 ms) reported as met or not.

The JSON is rewritten after every check, so a run cut short leaves partial results. The
exit status is 1 if a correctness check failed, 2 without CUDA (outside --smoke).
`--smoke` runs the same checks on tiny shapes on CPU (Triton in its interpreter).

Usage: python scripts/gpu_check.py [--smoke] [--out results/gpu_check.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402  (TRITON_INTERPRET is decided after torch, before triton)

KEYS = (0, 2**63, 2**64 - 1)


class Run:
    """The results document, rewritten atomically after every check."""

    def __init__(self, out: Path, smoke: bool, budget_s: float) -> None:
        self.out, self.smoke, self.budget_s = out, smoke, budget_s
        self.start = time.monotonic()
        self.doc: dict[str, Any] = {
            "script": "scripts/gpu_check.py",
            "smoke": smoke,
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "finished": False,
            "checks": {},
        }
        self.save()

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        partial = self.out.with_name(self.out.name + ".partial")
        partial.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        os.replace(partial, self.out)

    def check(self, name: str, kind: str, fn: Callable[[], dict[str, Any]]) -> None:
        """Run one check; its dict may set "passed" (default True), the rest is details."""
        entry: dict[str, Any] = {"kind": kind}
        elapsed = time.monotonic() - self.start
        if elapsed > self.budget_s:
            entry.update(passed=None, skipped=f"out of time ({elapsed:.0f} s elapsed)")
        else:
            began = time.monotonic()
            try:
                details = fn()
                entry["passed"] = bool(details.pop("passed", True))
                entry["details"] = details
            except Exception as error:  # a failed check must not stop the others
                entry.update(passed=False, error=f"{type(error).__name__}: {error}")
                entry["traceback"] = traceback.format_exc(limit=8)
            entry["seconds"] = round(time.monotonic() - began, 3)
        self.doc["checks"][name] = entry
        print(f"[gpu_check] {name}: {entry.get('passed')} ({entry.get('seconds', 0)} s)")
        self.save()

    def finish(self) -> int:
        checks = self.doc["checks"]
        failed = [
            n for n, c in checks.items() if c["kind"] == "correctness" and c["passed"] is not True
        ]
        self.doc["summary"] = {
            "correctness_passed": not failed,
            "failed_or_skipped": failed,
            "targets": checks.get("speed", {}).get("details", {}).get("targets"),
            "total_seconds": round(time.monotonic() - self.start, 1),
        }
        self.doc["finished"] = True
        self.save()
        return 1 if failed else 0


# --------------------------------------------------------------------------- helpers


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of random bit patterns (NaN payloads included) of `dtype`."""
    words = shape[-1] * dtype.itemsize // 2  # int16 words per last-dim row (itemsize >= 2)
    bits = torch.randint(-(2**15), 2**15, (*shape[:-1], words), dtype=torch.int16, device=device)
    return bits.view(dtype)


def make_caches(
    layout: str, layers: int, blocks: int, block_size: int, heads: int, head_dim: int, dtype: Any
) -> list[torch.Tensor]:
    """FlashAttention (NHD/HND stride order) or split caches, poisoned."""
    device = DEVICE
    caches = []
    for _ in range(layers):
        if layout == "split":
            caches.append(poisoned((2, blocks, block_size, heads, head_dim), dtype, device))
        elif layout == "NHD":  # physical (blocks, slots, heads, 2D)
            base = poisoned((blocks, block_size, heads, 2 * head_dim), dtype, device)
            caches.append(base.permute(0, 2, 1, 3))
        else:
            caches.append(poisoned((blocks, heads, block_size, 2 * head_dim), dtype, device))
    return caches


def reference_apply(layout: str, plan: Any, caches: list[torch.Tensor], tables: Any) -> None:
    """Moves straight from the plan's definition: per (request, layer, head), r rows."""
    block_size = caches[0].shape[2]
    evicted, sources = plan.evicted.cpu(), plan.sources.cpu()
    batch, layers, heads, _ = evicted.shape
    tables = tables.cpu()
    for b in range(batch):
        src_blk = tables[b, sources // block_size].to(DEVICE)
        src_off = (sources % block_size).to(DEVICE)
        for layer in range(layers):
            cache = caches[layer]
            for h in range(heads):
                holes = evicted[b, layer, h]
                dst_blk = tables[b, holes // block_size].to(DEVICE)
                dst_off = (holes % block_size).to(DEVICE)
                if layout == "split":
                    for half in (0, 1):
                        part = cache[half]
                        part[dst_blk, dst_off, h] = part[src_blk, src_off, h]
                else:
                    cache[dst_blk, h, dst_off] = cache[src_blk, h, src_off]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(view), b.view(view))


def timer(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median and min milliseconds: CUDA events on CUDA, perf_counter on CPU."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if DEVICE.type == "cuda":
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
    return {"median_ms": statistics.median(times), "min_ms": min(times)}


def wall_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Host wall time of `fn` including its device work, median over repeats."""
    times = []
    for _ in range(repeats):
        synchronize()
        began = time.perf_counter()
        fn()
        synchronize()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def batch_inputs(config: Any, size: int, rng: random.Random) -> tuple[list[int], ...]:
    """Prompts (exactly K first, 0 last), keys (the extremes first), round indices (some
    above 2**31)."""
    prompts = [rng.randint(0, config.budget) for _ in range(size)]
    prompts[0] = config.budget
    if size > 1:
        prompts[-1] = 0
    keys = [KEYS[i] if i < len(KEYS) else rng.getrandbits(64) for i in range(size)]
    rounds = [rng.choice((0, 2**31 + 7, 2**40 + 3, rng.randint(0, 1000))) for _ in range(size)]
    return prompts, keys, rounds


# --------------------------------------------------------------------------- checks


def check_environment() -> dict[str, Any]:
    details: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(DEVICE),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if DEVICE.type == "cuda":
        props = torch.cuda.get_device_properties(DEVICE)
        details.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    try:
        import triton

        details["triton"] = triton.__version__
    except Exception as error:  # recorded; the Triton checks then fail on their own
        details["triton"] = f"unavailable: {error}"
    return details


def check_planner() -> dict[str, Any]:
    from randkv import RandKVConfig, spec
    from randkv.planner import RoundPlanner

    configs = [(64, 8, 0), (100, 7, 2**64 - 1), (1, 1, 3)] + (
        [] if SMOKE else [(2048, 64, 12345), (4096, 128, 2**63)]
    )
    layers, heads = (range(3), range(2)) if SMOKE else (range(36), range(8))
    rng = random.Random(1)
    results, mismatches = [], 0
    for budget, buffer, seed in configs:
        config = RandKVConfig(budget=budget, buffer_size=buffer, seed=seed)
        on_device = RoundPlanner(config, layers, heads, DEVICE)
        on_cpu = RoundPlanner(config, layers, heads, "cpu")
        for size in (1, 8, 64):
            prompts, keys, rounds = batch_inputs(config, size, rng)
            got = on_device.plan(prompts, keys, rounds).evicted.cpu()
            want = on_cpu.plan(prompts, keys, rounds).evicted
            equal = torch.equal(got, want)
            for b in {0, size - 1}:  # spot-check against the pure-Python spec
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
            mismatches += not equal
            results.append({"K": budget, "r": buffer, "seed": seed, "batch": size, "ok": equal})
    return {"passed": mismatches == 0, "mismatches": mismatches, "cases": results}


def check_planner_slices() -> dict[str, Any]:
    from randkv import RandKVConfig
    from randkv.planner import RoundPlanner

    config = RandKVConfig(budget=96 if SMOKE else 2048, buffer_size=8 if SMOKE else 64, seed=7)
    num_layers, num_heads = (4, 4) if SMOKE else (36, 8)
    prompts, keys, rounds = batch_inputs(config, 8, random.Random(2))
    whole = RoundPlanner(config, range(num_layers), range(num_heads), DEVICE)
    full = whole.plan(prompts, keys, rounds).evicted
    cases = {}
    for ranks in (2, 4) if SMOKE else (2, 4, 8):
        per = num_heads // ranks
        parts = [
            RoundPlanner(config, range(num_layers), range(i * per, (i + 1) * per), DEVICE)
            .plan(prompts, keys, rounds)
            .evicted
            for i in range(ranks)
        ]
        cases[f"tp{ranks}"] = torch.equal(torch.cat(parts, dim=2), full)
    half = num_layers // 2
    stage = RoundPlanner(config, range(half, num_layers), range(num_heads), DEVICE)
    cases["pp2_stage1"] = torch.equal(stage.plan(prompts, keys, rounds).evicted, full[:, half:])
    return {"passed": all(cases.values()), "cases": cases}


def check_compactors() -> dict[str, Any]:
    from randkv import RandKVConfig
    from randkv.compactor import KVLayout, PagedCompactor
    from randkv.planner import RoundPlanner
    from randkv.triton_compactor import TritonCompactor

    config = RandKVConfig(budget=13 if SMOKE else 256, buffer_size=3 if SMOKE else 16, seed=5)
    block_size, head_dim, requests, layers = (4, 4, 3, 2) if SMOKE else (16, 128, 8, 4)
    dtype = torch.bfloat16
    per = math.ceil(config.max_physical_length / block_size)  # a partial last block
    blocks = requests * per + 5  # five blocks nobody owns stay poisoned
    tables = torch.randperm(blocks, generator=torch.Generator().manual_seed(3))
    tables = tables[: requests * per].view(requests, per)
    cases, failures = [], 0
    for layout in ("NHD", "HND", "split"):
        kind = KVLayout.KV_BLOCK_SLOT_HEAD if layout == "split" else KVLayout.BLOCK_HEAD_SLOT
        for heads in (1, 3) if SMOKE else (1, 8):
            prompts, keys, rounds = batch_inputs(config, requests, random.Random(heads))
            plan = RoundPlanner(config, range(layers), range(heads)).plan(prompts, keys, rounds)
            plan = type(plan)(plan.evicted.to(DEVICE), plan.sources.to(DEVICE))
            base = make_caches(layout, layers, blocks, block_size, heads, head_dim, dtype)
            want = [c.clone() for c in base]
            reference_apply(layout, plan, want, tables)
            row = {"layout": layout, "heads": heads}
            for name, compactor in (
                ("torch", PagedCompactor(kind, block_size)),
                ("triton", TritonCompactor(kind, block_size)),
            ):
                got = [c.clone() for c in base]
                compactor.apply(plan, got, tables)
                row[name] = all(same_bits(g, w) for g, w in zip(got, want, strict=True))
                failures += not row[name]
            cases.append(row)
    return {"passed": failures == 0, "cases": cases}


def check_replay() -> dict[str, Any]:
    """Caches whose values are positions, compacted round after round; compare to spec."""
    from randkv import RandKVConfig, slot_positions
    from randkv.compactor import KVLayout, PagedCompactor
    from randkv.planner import RoundPlanner
    from randkv.triton_compactor import TritonCompactor

    config = RandKVConfig(budget=21 if SMOKE else 200, buffer_size=5 if SMOKE else 24, seed=4)
    prompt, key, heads, layers, block_size = 6, 2**64 - 1, 2, 2, 4 if SMOKE else 16
    rounds = 4
    blocks = math.ceil(config.max_physical_length / block_size)
    table = torch.tensor([list(range(blocks, 2 * blocks))[::-1]])
    planner = RoundPlanner(config, range(layers), range(heads), DEVICE)
    tokens = config.max_physical_length + (rounds - 1) * config.buffer_size
    results = {}
    for name, layout, make in (
        ("torch_nhd", "NHD", PagedCompactor),
        ("triton_nhd", "NHD", TritonCompactor),
        ("triton_split", "split", TritonCompactor),
    ):
        kind = KVLayout.KV_BLOCK_SLOT_HEAD if layout == "split" else KVLayout.BLOCK_HEAD_SLOT
        compactor = make(kind, block_size)
        caches = make_caches(layout, layers, 2 * blocks, block_size, heads, 2, torch.float32)
        length = 0
        for position in range(tokens):
            block, offset = int(table[0, length // block_size]), length % block_size
            for cache in caches:
                if layout == "split":
                    cache[:, block, offset] = float(position)
                else:
                    cache[block, :, offset] = float(position)
            length += 1
            if length == config.max_physical_length:
                index = (position + 1 - config.max_physical_length) // config.buffer_size
                compactor.apply(planner.plan([prompt], [key], [index]), caches, table)
                length = config.compacted_length
        ok = True
        slots = torch.arange(length)
        blocks_of, offsets = table[0, slots // block_size], slots % block_size
        for layer in range(layers):
            for head in range(heads):
                cache = caches[layer].cpu()
                if layout == "split":
                    got = cache[0, blocks_of, offsets, head, 0]
                else:
                    got = cache[blocks_of, head, offsets, 0]
                want = slot_positions(
                    config,
                    prompt_length=prompt,
                    tokens_seen=tokens,
                    request_key=key,
                    layer=layer,
                    kv_head=head,
                )
                ok &= tuple(int(v) for v in got.tolist()) == want
        results[name] = ok
    return {"passed": all(results.values()), "rounds": rounds, "cases": results}


def check_host_syncs() -> dict[str, Any]:
    from randkv import RandKVConfig
    from randkv.compactor import KVLayout, PagedCompactor
    from randkv.hostsync import count_host_syncs
    from randkv.planner import RoundPlanner
    from randkv.triton_compactor import TritonCompactor

    config = RandKVConfig(budget=32 if SMOKE else 2048, buffer_size=4 if SMOKE else 64, seed=1)
    layers, heads, block_size, head_dim, requests = (2, 2, 4, 4, 3) if SMOKE else (4, 8, 16, 128, 8)
    per = math.ceil(config.max_physical_length / block_size)
    tables = torch.randperm(requests * per).view(requests, per)  # a host tensor
    caches = make_caches("NHD", layers, requests * per, block_size, heads, head_dim, torch.bfloat16)
    planner = RoundPlanner(config, range(layers), range(heads), DEVICE)
    triton_compactor = TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size)
    torch_compactor = PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size)
    prompts, keys, rounds = batch_inputs(config, requests, random.Random(5))

    def step(compactor: Any) -> None:
        compactor.apply(planner.plan(prompts, keys, rounds), caches, tables)

    step(triton_compactor)  # warm up: compile, allocate pinned buffers
    step(torch_compactor)
    synchronize()
    counts = {}
    for name, compactor in (("plan+triton", triton_compactor), ("plan+torch", torch_compactor)):
        with count_host_syncs() as syncs:
            step(compactor)
        counts[name] = {"total": syncs.total, "by_op": dict(syncs.counts)}
    details: dict[str, Any] = {"counts": counts}
    passed = all(c["total"] == 0 for c in counts.values())
    if DEVICE.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")  # raises on any synchronizing CUDA call
        try:
            step(triton_compactor)
            details["cuda_sync_debug_mode"] = "no synchronizing call"
        except RuntimeError as error:
            details["cuda_sync_debug_mode"] = f"raised: {error}"
            passed = False
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return {"passed": passed, **details}


def speed_row(
    planner: Any,
    compactors: dict[str, Any],
    caches: list[torch.Tensor],
    tables: torch.Tensor,
    step: tuple[list[int], list[int], list[int]],
    repeats: int,
) -> dict[str, Any]:
    """Planner and compaction times for one step's rounds, against a plain copy."""
    plan = planner.plan(*step)
    row: dict[str, Any] = {
        "planner": timer(lambda: planner.plan(*step), repeats),
        "planner_wall_ms": wall_ms(lambda: planner.plan(*step), repeats),
    }
    moved = compactors["triton"].moved_bytes(plan, caches)
    row["moved_bytes"] = moved
    source = torch.empty(moved, dtype=torch.uint8, device=DEVICE)
    target = torch.empty_like(source)
    copy = timer(lambda: target.copy_(source), repeats)
    row["plain_copy"] = {**copy, "gb_per_s": moved / copy["median_ms"] / 1e6}
    for name, compactor in compactors.items():
        timing = timer(lambda c=compactor: c.apply(plan, caches, tables), repeats)
        row[name] = {**timing, "gb_per_s": moved / timing["median_ms"] / 1e6}
        row[name]["fraction_of_copy"] = row[name]["gb_per_s"] / row["plain_copy"]["gb_per_s"]
    return row


def check_speed() -> dict[str, Any]:
    from randkv import RandKVConfig
    from randkv.compactor import KVLayout, PagedCompactor
    from randkv.planner import RoundPlanner
    from randkv.triton_compactor import TritonCompactor

    if SMOKE:
        budget, buffer, layers, heads, head_dim, block_size, repeats = 32, 4, 2, 2, 8, 4, 3
    else:
        budget, buffer, layers, heads, head_dim, block_size, repeats = 2048, 64, 36, 8, 128, 16, 20
    config = RandKVConfig(budget=budget, buffer_size=buffer, seed=0)
    per = math.ceil(config.max_physical_length / block_size)
    most = 64
    tables = torch.randperm(most * per, generator=torch.Generator().manual_seed(0))
    tables = tables.view(most, per)
    caches = make_caches("NHD", layers, most * per, block_size, heads, head_dim, torch.bfloat16)
    planner = RoundPlanner(config, range(layers), range(heads), DEVICE)
    compactors = {
        "torch": PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
        "triton": TritonCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size),
    }
    rng = random.Random(0)
    shape = {"layers": layers, "kv_heads": heads, "head_dim": head_dim, "block_size": block_size}
    details: dict[str, Any] = {"shape": {**shape, "K": budget, "r": buffer, "dtype": "bf16"}}
    for rounds in (1, 8, 64):
        prompts = [rng.randint(16, min(1024, budget)) for _ in range(rounds)]
        keys = [rng.getrandbits(64) for _ in range(rounds)]
        indices = [rng.randint(0, 10_000) for _ in range(rounds)]
        step = (prompts, keys, indices)
        details[f"rounds_{rounds}"] = speed_row(
            planner, compactors, caches, tables[:rounds], step, repeats
        )
    last = details["rounds_64"]
    details["targets"] = {
        "compaction_64_rounds_at_least_half_copy_gbps": {
            "triton_fraction": round(last["triton"]["fraction_of_copy"], 3),
            "torch_fraction": round(last["torch"]["fraction_of_copy"], 3),
            "met": last["triton"]["fraction_of_copy"] >= 0.5,
        },
        "planner_64_rounds_under_0.2_ms": {
            "median_ms": round(last["planner"]["median_ms"], 4),
            "met": last["planner"]["median_ms"] < 0.2,
        },
        "applicable": DEVICE.type == "cuda",
    }
    return details


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    global DEVICE, SMOKE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, CPU allowed")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check.json")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip checks after this")
    args = parser.parse_args(argv)
    SMOKE = args.smoke
    DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run = Run(args.out, SMOKE, args.budget_s)
    run.check("environment", "info", check_environment)
    if DEVICE.type != "cuda" and not SMOKE:
        run.doc["error"] = "CUDA is not available; use --smoke for the CPU run"
        run.finish()
        return 2
    torch.manual_seed(0)
    run.check("planner_device_vs_cpu", "correctness", check_planner)
    run.check("planner_parallel_slices", "correctness", check_planner_slices)
    run.check("compactors_bitwise", "correctness", check_compactors)
    run.check("replay_vs_spec", "correctness", check_replay)
    run.check("host_syncs", "correctness", check_host_syncs)
    run.check("speed", "speed", check_speed)
    return run.finish()


DEVICE = torch.device("cpu")
SMOKE = False

if __name__ == "__main__":
    if "--smoke" in sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    sys.exit(main())
