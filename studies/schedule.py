"""Which runs an evaluation makes, and making them: shared by both quality tasks.

A dense arm runs once (at the largest budget, which no round reaches anyway), a deterministic
policy once per budget, a random one once per budget and eviction seed. `run_arms` is the
whole of it for a task whose runs come from one `ArmRunner`; `plan_runs` and `make_runs` are
its two halves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

Result = TypeVar("Result")
Run = TypeVar("Run", bound="RunTraits")


class ArmTraits(Protocol):
    dense: bool
    random: bool


class RunTraits(Protocol):
    """What `run_arms` reads of a run: the arm and budget it is grouped under."""

    evictor: str
    budget: int | None


class ArmRunner(Protocol[Run]):
    """A task's run of one arm over its problems (`run_evictor`, `run_ledger_arm`)."""

    def __call__(
        self,
        model: Any,
        problems: Sequence[Any],
        evictor: str,
        *,
        budget: int,
        buffer: int,
        seed: int,
        batch_size: int,
        on_batch: Callable[[int], None] | None,
    ) -> Run: ...


def run_arms(
    run_arm: ArmRunner[Run],
    model: Any,
    problems: Sequence[Any],
    config: Any,
    arm_of: Callable[[str], ArmTraits],
    show_progress: bool,
) -> tuple[dict[tuple[str, int | None], list[Run]], float]:
    """Every run of `config.evictors` x `config.budgets` x `config.seeds` (as `plan_runs`
    plans them) through `run_arm` with `config.buffer` and `config.batch_size`, grouped by
    (arm, budget), and the seconds they took."""
    plan = plan_runs(config.evictors, config.budgets, config.seeds, arm_of)

    def run_one(name: str, budget: int, seed: int, on_batch: Callable[[int], None]) -> Run:
        return run_arm(
            model, problems, name, budget=budget, buffer=config.buffer, seed=seed,
            batch_size=config.batch_size, on_batch=on_batch,
        )  # fmt: skip

    def key_of(run: Run) -> tuple[str, int | None]:
        return run.evictor, run.budget

    return make_runs(plan, arm_of, run_one, key_of, len(plan) * len(problems), show_progress)


def plan_runs(
    names: Sequence[str],
    budgets: Sequence[int],
    seeds: Sequence[int],
    arm_of: Callable[[str], ArmTraits],
) -> list[tuple[str, int, int]]:
    """(arm, budget, seed) of every run, in report order."""
    plan = []
    for name in names:
        arm = arm_of(name)
        for_budgets = (max(budgets),) if arm.dense else tuple(budgets)
        for_seeds = seeds if arm.random else seeds[:1]
        plan.extend((name, budget, seed) for budget in for_budgets for seed in for_seeds)
    return plan


def make_runs(
    plan: list[tuple[str, int, int]],
    arm_of: Callable[[str], ArmTraits],
    run_one: Callable[[str, int, int, Callable[[int], None]], Result],
    key_of: Callable[[Result], tuple[str, int | None]],
    total: int,
    show_progress: bool,
) -> tuple[dict[tuple[str, int | None], list[Result]], float]:
    """Every planned run, grouped by (arm, budget), and the seconds they took.

    run_one(name, budget, seed, on_batch) makes one run and reports answers done through
    on_batch(count); total is the number of answers over the whole plan (for the bar).
    """
    bar = _progress_bar(total, show_progress)
    start = time.perf_counter()
    runs: dict[tuple[str, int | None], list[Result]] = {}
    for name, budget, seed in plan:
        bar.set_description(name if arm_of(name).dense else f"{name} K={budget}")
        result = run_one(name, budget, seed, bar.update)
        runs.setdefault(key_of(result), []).append(result)
    bar.close()
    return runs, time.perf_counter() - start


class _NoBar:
    def update(self, n: int = 1) -> None: ...

    def set_description(self, text: str) -> None: ...

    def close(self) -> None: ...


def _progress_bar(total: int, show: bool) -> Any:
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="answer", dynamic_ncols=True)
