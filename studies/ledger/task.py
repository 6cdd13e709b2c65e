"""The ledger task: old generated tokens matter, and facts are restated (or not).

A problem is a short constant prompt (`PROMPT`) and a body of 4-token events, written through
the decode path (byte-level tokenizer: one character is one token):

- *define* ``=Xq `` introduces the variable ``X`` (an uppercase letter) with the value ``q`` (a
  lowercase letter); teacher-written (forced). Every variable is defined once, and distinct
  variables have distinct values.
- *use* ``?Xq `` asks for ``X``: ``?X`` and the space are forced by the schedule, ``q`` is
  generated greedily by the model and fed back, so a wrong use writes a wrong copy.

Every event that holds ``X`` with its value is a *copy* of that fact (the define and every
right use). At a use, its knobs are the **age** of the newest copy (tokens from that copy's
value to the value being generated: 4 x the events between them) and **m**, the number of
earlier copies (m = 1: stated once and dormant since; m >= 2: restated).

The schedule draws, for each variable, a story: its define, then up to `max_uses` uses, each
after a gap drawn from three bands relative to a budget K and buffer r (`age_band`):
*recent* (age <= r, always in the buffer), *window* (age <= K + r - P, what a prompt + recent
window always holds) and *beyond* (age > K + 2r - P, what such a window never holds), up to
`far_max` events. Uses that fall due together are written in order of due time (so some gaps
come out a little longer than drawn), and when nothing is due and no new variable is to be
defined, a *filler* use restates a variable whose story is over (one whose newest copy is at
most `far_max` events old, if there is one). The ages and m recorded per
use are the realised ones; the checker re-derives them from the text.

Problems are a pure function of (LEDGER_VERSION, seed, index, knobs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "BANDS",
    "DEFINE",
    "EVENT_CHARS",
    "LEDGER_VERSION",
    "PROMPT",
    "USE",
    "VALUES",
    "VARIABLES",
    "LedgerConfig",
    "LedgerProblem",
    "Use",
    "age_band",
    "make_ledger",
    "make_ledgers",
]

#: Bump whenever the same (seed, index, knobs) would give a different problem.
LEDGER_VERSION = 1

#: The prompt of every problem (8 tokens): the body is what eviction acts on.
PROMPT = "#ledger\n"
VARIABLES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VALUES = "abcdefghijklmnopqrstuvwxyz"
DEFINE, USE = "=", "?"
EVENT_CHARS = 4  # op, variable, value, space
#: Age bands of a use, relative to a budget (see `age_band`).
BANDS = ("recent", "window", "beyond")


def age_band(age: int, budget: int, buffer: int, prompt_tokens: int = len(PROMPT)) -> str:
    """The band of a use whose newest copy is `age` tokens old, at budget K and buffer r:
    "recent" (age <= r: the buffer always holds it), "window" (age <= K + r - P: a prompt +
    recent window always holds it) or "beyond" (older)."""
    if age <= buffer:
        return "recent"
    if age <= budget + buffer - prompt_tokens:
        return "window"
    return "beyond"


@dataclass(frozen=True)
class LedgerConfig:
    """Knobs of a ledger problem. Body: 4 * events tokens after the 8-token prompt."""

    events: int = 80
    variables: int = 20  # at most this many are defined (fewer if the body is too short)
    budget: int = 72  # K that the drawn age bands refer to
    buffer: int = 4  # r
    max_uses: int = 4  # planned uses per variable (m = 1 .. max_uses when none is a filler)
    far_max: int = 36  # longest planned gap, in events
    #: Probabilities of the recent, window and beyond bands for each planned gap.
    band_weights: tuple[float, float, float] = (0.2, 0.35, 0.45)

    def __post_init__(self) -> None:
        if self.events < 2:
            raise ValueError(f"events must be >= 2, got {self.events}")
        if not 1 <= self.variables <= min(len(VARIABLES), len(VALUES)):
            raise ValueError(f"variables must be in [1, 26], got {self.variables}")
        if self.buffer < 1 or self.budget < len(PROMPT) + self.buffer:
            raise ValueError("need buffer >= 1 and budget >= prompt + buffer")
        if self.max_uses < 1:
            raise ValueError("max_uses must be >= 1")
        if self.far_max <= self.gap_range("window")[1] + 1:
            raise ValueError(f"far_max must exceed the window band's gaps, got {self.far_max}")
        if len(self.band_weights) != 3 or min(self.band_weights) < 0 or not any(self.band_weights):
            raise ValueError("band_weights: three non-negative weights, not all zero")

    @property
    def prompt_tokens(self) -> int:
        return len(PROMPT)

    @property
    def body_tokens(self) -> int:
        return EVENT_CHARS * self.events

    def gap_range(self, band: str) -> tuple[int, int]:
        """Gaps (in events) whose ages fall in `band` at this config's K and r."""
        near = max(1, self.buffer // EVENT_CHARS)
        window = max(near + 1, (self.budget + self.buffer - self.prompt_tokens) // EVENT_CHARS)
        if band == "recent":
            return 1, near
        if band == "window":
            return near + 1, window
        # Strictly older than anything a window of K + 2r - P tokens holds.
        beyond = (self.budget + 2 * self.buffer - self.prompt_tokens) // EVENT_CHARS + 1
        return beyond, max(beyond, self.far_max)


@dataclass(frozen=True)
class Use:
    """One use event and its realised knobs."""

    event: int  # index of the event in the body
    variable: str
    value: str  # the right value
    age: int  # tokens from the newest copy's value to this use's value
    copies: int  # m: copies written before this use (the define and earlier uses)
    filler: bool  # a restatement outside the variable's planned story

    @property
    def value_offset(self) -> int:
        """Index of the generated value character in the body."""
        return EVENT_CHARS * self.event + 2


@dataclass(frozen=True)
class LedgerProblem:
    """One problem: the prompt, the full right body and its uses."""

    seed: int
    index: int
    config: LedgerConfig
    prompt: str
    body: str
    uses: tuple[Use, ...]

    @property
    def generated_offsets(self) -> tuple[int, ...]:
        """Body indices the model generates (the values of uses); all others are forced."""
        return tuple(u.value_offset for u in self.uses)


def _rng(seed: int, index: int, config: LedgerConfig) -> random.Random:
    # A string seed is hashed with SHA-512 by `random`: stable across runs and platforms.
    c = config
    knobs = f"{c.events}:{c.variables}:{c.budget}:{c.buffer}:{c.max_uses}:{c.far_max}"
    return random.Random(f"randkv-ledger-v{LEDGER_VERSION}:{seed}:{index}:{knobs}:{c.band_weights}")


def _story(rng: random.Random, config: LedgerConfig) -> list[int]:
    """Planned gaps (in events) of one variable's uses."""
    gaps = []
    for _ in range(rng.randint(1, config.max_uses)):
        band = rng.choices(BANDS, weights=config.band_weights)[0]
        gaps.append(rng.randint(*config.gap_range(band)))
    return gaps


class _Schedule:
    """The event-by-event scheduler behind `make_ledger`."""

    def __init__(self, rng: random.Random, config: LedgerConfig) -> None:
        self.rng, self.config = rng, config
        self.names = rng.sample(VARIABLES, config.variables)
        self.values = rng.sample(VALUES, config.variables)
        self.defined: list[int] = []  # variable numbers, in order of definition
        self.last: dict[int, int] = {}  # event of each variable's newest copy
        self.copies: dict[int, int] = {}
        self.plans: dict[int, list[int]] = {}  # remaining planned gaps
        self.due: dict[int, int] = {}  # event at which the next planned use falls due
        self.events: list[str] = []
        self.uses: list[Use] = []

    def unused(self) -> list[int]:
        return [v for v in self.defined if self.copies[v] == 1]

    def define(self, t: int) -> None:
        var = len(self.defined)
        self.defined.append(var)
        self.last[var], self.copies[var] = t, 1
        self.plans[var] = _story(self.rng, self.config)
        self.due[var] = t + self.plans[var].pop(0)
        self.events.append(f"{DEFINE}{self.names[var]}{self.values[var]} ")

    def use(self, t: int, var: int, filler: bool) -> None:
        name, value = self.names[var], self.values[var]
        age = EVENT_CHARS * (t - self.last[var])
        self.uses.append(Use(t, name, value, age, self.copies[var], filler))
        self.events.append(f"{USE}{name}{value} ")
        self.last[var], self.copies[var] = t, self.copies[var] + 1
        if filler:
            return
        if self.plans[var]:
            self.due[var] = t + self.plans[var].pop(0)
        else:
            del self.due[var]

    def step(self, t: int) -> None:
        remaining = self.config.events - t
        unused = self.unused()
        if remaining == len(unused):  # every defined variable must be used at least once
            self.use(t, min(unused, key=lambda v: (self.due[v], v)), filler=False)
            return
        ready = [v for v, due in self.due.items() if due <= t]
        if ready:
            self.use(t, min(ready, key=lambda v: (self.due[v], v)), filler=False)
        elif len(self.defined) < self.config.variables and remaining - 1 > len(unused):
            self.define(t)
        else:
            idle = [v for v in self.defined if v not in self.due]
            if idle:
                # Restate a fact no older than the longest planned gap (else the newest one).
                young = [v for v in idle if t - self.last[v] <= self.config.far_max]
                pool = young or [max(idle, key=lambda v: self.last[v])]
                self.use(t, self.rng.choice(pool), filler=True)
            else:  # everything is pending: write the earliest due use early
                self.use(t, min(self.due, key=lambda v: (self.due[v], v)), filler=False)


def make_ledger(seed: int, index: int, config: LedgerConfig | None = None) -> LedgerProblem:
    """The problem number `index` of the family `seed`."""
    config = config or LedgerConfig()
    schedule = _Schedule(_rng(seed, index, config), config)
    for t in range(config.events):
        schedule.step(t)
    return LedgerProblem(
        seed, index, config, PROMPT, "".join(schedule.events), tuple(schedule.uses)
    )


def make_ledgers(seed: int, count: int, config: LedgerConfig | None = None) -> list[LedgerProblem]:
    """Problems 0 .. count - 1 of the family `seed`."""
    return [make_ledger(seed, i, config) for i in range(count)]
