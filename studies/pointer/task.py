"""Chain tasks: a long generation that keeps reading its prompt (and its own past).

The prompt is a table of facts, one per key: ``K d n`` says that key ``K`` (an uppercase
letter) carries the digit ``d`` and points to the next key ``N``, written in lowercase so that
each key occurs once in its uppercase form (the pointers form a random permutation of the
keys). After ``|`` comes the start key. The answer is a chain of hops, one per generated
4-character group ``k d x`` + space:

- ``k`` is the current key: the start key, then the pointer of the previous hop's key;
- ``d`` is the digit of ``k`` (a fact lookup in the prompt);
- ``x`` depends on the variant (the ``tally`` knob):

  - pointer chain (default, ``tally=False``): ``x`` is ``k``'s pointer, in lowercase (a fact
    lookup in the prompt). Each hop copies ``k``'s fact from the prompt, and the next hop's key
    is the pointer the model itself wrote 2 tokens earlier. Every hop needs the prompt; the
    model's own output is needed only a few tokens back.
  - tally chain (``tally=True``): ``x`` is ``k``'s running tally: (tally at ``k``'s previous
    visit + d) mod 10, where the previous visit is the latest earlier hop with the same key in
    the model's own output (0 before the first visit), and the next key is a prompt lookup of
    ``k``'s pointer. Every revisit needs the model's own step one cycle back (distances up to
    4 * num_keys tokens). The 0.66M-parameter model did not learn this variant (see
    docs/quality.md).

The chain walks the cycle of the permutation that holds the start key, whose length is
uniform on 1..num_keys. The whole generation is checkable exactly. Difficulty knobs:
``num_keys`` (prompt size, 4 * num_keys + 3 tokens in the byte-level tokenizer), ``hops``
(4 * hops generated tokens) and ``tally``.

Problems are a pure function of (TASK_VERSION, seed, index, num_keys, hops, tally); the prompt
does not depend on ``tally``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "KEY_ALPHABET",
    "TASK_VERSION",
    "Problem",
    "TaskConfig",
    "make_problem",
    "make_problems",
]

#: Bump whenever the same (seed, index, knobs) would give a different problem. v3: pointer chains
#: (the default) beside tally chains; tally=True follows the v2 rules, under v3 seeding.
TASK_VERSION = 3

#: Keys are uppercase letters (one byte-level token each), pointers their lowercase forms.
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

HOP_CHARS = 4  # "k", "d", "v", " "


@dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs. Prompt: 4 * num_keys + 3 characters; answer: 4 * hops characters."""

    num_keys: int = 8
    hops: int = 40
    #: True: the third character of a hop is the key's running tally (the "tally chain",
    #: long-range own-output dependence); False: it is the key's pointer copied from the
    #: prompt (the "pointer chain", the default). The prompt does not depend on this knob.
    tally: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.num_keys <= len(KEY_ALPHABET):
            raise ValueError(f"num_keys must be in [1, {len(KEY_ALPHABET)}], got {self.num_keys}")
        if self.hops < 1:
            raise ValueError(f"hops must be >= 1, got {self.hops}")

    @property
    def prompt_chars(self) -> int:
        return 4 * self.num_keys + 3

    @property
    def answer_chars(self) -> int:
        return HOP_CHARS * self.hops


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt text and the exact expected generation."""

    seed: int
    index: int
    config: TaskConfig
    prompt: str
    target: str
    cycle_length: int  # length of the permutation cycle the chain walks

    @property
    def final_answer(self) -> str:
        """The last hop (key, digit, tally or pointer): the chain's final state."""
        return self.target[-HOP_CHARS:-1]


def _rng(seed: int, index: int, config: TaskConfig) -> random.Random:
    # A string seed is hashed with SHA-512 by `random`: stable across runs and platforms.
    return random.Random(
        f"randkv-quality-task-v{TASK_VERSION}:{seed}:{index}:{config.num_keys}:{config.hops}"
    )


def make_problem(seed: int, index: int, config: TaskConfig | None = None) -> Problem:
    """The problem number `index` of the family `seed`."""
    config = config or TaskConfig()
    rng = _rng(seed, index, config)
    keys = rng.sample(KEY_ALPHABET, config.num_keys)
    successors = keys[:]
    rng.shuffle(successors)
    pointer = dict(zip(keys, successors, strict=True))
    digit = {k: rng.randrange(10) for k in keys}
    order = keys[:]
    rng.shuffle(order)
    start = rng.choice(keys)
    prompt = " ".join(f"{k}{digit[k]}{pointer[k].lower()}" for k in order) + " |" + start + "\n"

    tally: dict[str, int] = {}
    hops = []
    key = start
    for _ in range(config.hops):
        if config.tally:
            tally[key] = (tally.get(key, 0) + digit[key]) % 10
            hops.append(f"{key}{digit[key]}{tally[key]} ")
        else:
            hops.append(f"{key}{digit[key]}{pointer[key].lower()} ")
        key = pointer[key]
    cycle, key = 1, pointer[start]
    while key != start:
        cycle, key = cycle + 1, pointer[key]
    return Problem(seed, index, config, prompt, "".join(hops), cycle)


def make_problems(seed: int, count: int, config: TaskConfig | None = None) -> list[Problem]:
    """Problems 0 .. count - 1 of the family `seed`."""
    return [make_problem(seed, i, config) for i in range(count)]
