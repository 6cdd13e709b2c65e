"""The one-kernel Triton planner, in Triton's interpreter on CPU, against `randkv.spec` and
the torch planner; its launch count per step against the torch planner's."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from randkv import RandKVConfig, spec  # noqa: E402
from randkv.kernels.planner import RoundPlanner, to_key_tensor  # noqa: E402

triton_planner = pytest.importorskip("randkv.kernels.triton_planner")

# The planner kernel calls triton.language helpers (tl.zeros, tl.sum), which run on CPU
# only when Triton itself was first imported with TRITON_INTERPRET=1. In a whole-suite
# run an earlier test module imports Triton first (through vLLM), so these tests then
# run in a fresh interpreter instead (the last test below), never silently skipped.
INTERPRETED_HERE = isinstance(tl.zeros, InterpretedFunction)
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED_HERE, reason="run by test_in_a_process_that_interprets_triton"
)

CONFIGS = [(13, 3, 0), (64, 8, 2**64 - 1), (1, 1, 3), (40, 16, 5), (300, 100, 2**63)]


@needs_interpreter
@pytest.mark.parametrize(("budget", "buffer", "seed"), CONFIGS)
def test_triton_plans_equal_the_spec_and_the_torch_planner(budget, buffer, seed):
    config = RandKVConfig(budget=budget, buffer_size=buffer, seed=seed)
    rng = random.Random(budget)
    prompts = [budget, 0, rng.randint(0, budget)]  # a prompt of exactly K included
    keys = [0, 2**64 - 1, rng.getrandbits(64)]
    rounds = [0, 2**31 + 7, 2**40 + 3]
    layers, heads = [0, 5], [1, 3]  # global indices, as a TP rank / PP stage has them
    fast = RoundPlanner(config, layers, heads, backend="triton")
    got = fast.plan(prompts, keys, rounds).evicted
    want = RoundPlanner(config, layers, heads, backend="torch").plan(prompts, keys, rounds)
    assert torch.equal(got, want.evicted)
    assert torch.equal(fast.plan(prompts, to_key_tensor(keys), rounds).evicted, got)
    for b in range(3):
        for li, layer in enumerate(layers):
            for hi, head in enumerate(heads):
                expected = spec.evicted_slots(
                    config,
                    prompt_length=prompts[b],
                    request_key=keys[b],
                    round_index=rounds[b],
                    layer=layer,
                    kv_head=head,
                )
                assert tuple(got[b, li, hi].tolist()) == expected


@needs_interpreter
def test_triton_plans_rows_with_their_own_budgets():
    """A long prompt under min_generated and a request's own K beside the server's K."""
    config = RandKVConfig(budget=20, buffer_size=4, seed=7, min_generated=6, max_request_budget=40)
    prompts, keys, rounds = [3, 35, 10], [5, 6, 2**64 - 2], [0, 1, 2**33]
    budgets = [20, config.request_budget(35), config.request_budget(10, 40)]
    assert budgets == [20, 41, 40]
    layers, heads = [1, 4], [0, 2]
    fast = RoundPlanner(config, layers, heads, backend="triton").plan(
        prompts, keys, rounds, budgets
    )
    slow = RoundPlanner(config, layers, heads, backend="torch").plan(prompts, keys, rounds, budgets)
    assert torch.equal(fast.evicted, slow.evicted) and torch.equal(fast.sources, slow.sources)
    for b in range(3):
        own = config.with_budget(budgets[b])
        for li, layer in enumerate(layers):
            for hi, head in enumerate(heads):
                expected = spec.evicted_slots(
                    own, prompt_length=prompts[b], request_key=keys[b], round_index=rounds[b],
                    layer=layer, kv_head=head,
                )  # fmt: skip
                assert tuple(fast.evicted[b, li, hi].tolist()) == expected


@needs_interpreter
def test_a_64_round_step_is_a_constant_few_launches():
    from randkv.kernels.launches import planner_launches

    config = RandKVConfig(budget=256, buffer_size=16)
    fast = RoundPlanner(config, [0], [0], backend="triton")
    slow = RoundPlanner(config, [0], [0], backend="torch")
    one, _ = planner_launches(fast, 1)
    many, by_op = planner_launches(fast, 64)
    # On CPU: the kernel and the device-side assert (the host-to-device copy is a no-op).
    assert one == many <= 3, by_op
    assert by_op["triton::plan_rows"] == 1
    assert planner_launches(slow, 64)[0] > 10 * many  # the torch planner's dozens


@needs_interpreter
def test_warmup_compiles_the_variant_every_step_meets(monkeypatch):
    from randkv.kernels.triton_jit import Kernel

    kernel = triton_planner.KERNEL
    monkeypatch.setattr(Kernel, "tracking", True)
    monkeypatch.setattr(kernel, "launched", Counter())
    monkeypatch.setattr(kernel, "warmed", set())
    config = RandKVConfig(budget=40, buffer_size=4, seed=2**64 - 1)
    planner = RoundPlanner(config, [0, 1], [0], backend="triton")
    assert planner.warmup() == 0.0  # the interpreter compiles nothing
    for batch in (1, 2, 16, 3):
        planner.plan([batch] * batch, list(range(batch)), [2**33] * batch)
    assert set(kernel.launched) == kernel.warmed


@needs_interpreter
def test_backend_choice_and_refusals():
    config = RandKVConfig(budget=16, buffer_size=4)
    assert RoundPlanner(config, [0], [0]).backend == "torch"  # auto on CPU
    with pytest.raises(ValueError, match="'auto', 'torch' or 'triton'"):
        RoundPlanner(config, [0], [0], backend="cuda")
    big = RandKVConfig(budget=4096, buffer_size=triton_planner.MAX_BUFFER + 1)
    with pytest.raises(ValueError, match="1 <= r <= 512"):
        RoundPlanner(big, [0], [0], backend="triton")


@pytest.mark.skipif(INTERPRETED_HERE, reason="the tests above ran in this process")
def test_in_a_process_that_interprets_triton():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "9 passed" in done.stdout, done.stdout[-2000:]
