"""`randkv.spec.rounds`: one round's moves applied alike to lists and tensors; stdlib only."""

from __future__ import annotations

import subprocess
import sys

import torch

from randkv import RandKVConfig, spec
from randkv.kernels import planner
from randkv.spec import rounds

CONFIG = RandKVConfig(budget=6, buffer_size=2)


def test_moves_are_the_same_on_lists_and_tensors():
    slots = list(range(100, 100 + CONFIG.max_physical_length))  # K + 2r = 10
    holes = (4, 1)
    sources = rounds.source_slots(CONFIG)
    assert list(sources) == [8, 9]
    moved = rounds.move_slots(list(slots), holes, sources)
    assert moved == [100, 109, 102, 103, 108, 105, 106, 107, 108, 109]
    freed = rounds.move_slots(list(slots), holes, sources, fill=-1)
    assert freed == [100, 109, 102, 103, 108, 105, 106, 107, -1, -1]
    # A tensor with leading (rows, heads) dimensions, each with its own holes.
    state = torch.tensor(slots).repeat(2, 3, 1)
    evicted = torch.tensor([[1, 0], [4, 1], [7, 6]]).repeat(2, 1, 1)
    plan = rounds.RoundPlan.of(CONFIG, evicted)
    assert plan.sources.tolist() == [8, 9] and plan.num_moves == 12
    plan.apply(state, fill=-1)
    for row in range(2):
        for head, holes_of_head in enumerate(evicted[row].tolist()):
            want = rounds.move_slots(list(slots), holes_of_head, sources, fill=-1)
            assert state[row, head].tolist() == want


def test_one_round_plan_type():
    assert planner.RoundPlan is rounds.RoundPlan
    assert spec.source_slots is rounds.source_slots


def test_rounds_and_spec_need_only_the_standard_library():
    code = "import sys, randkv, randkv.spec.rounds, randkv.spec; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
