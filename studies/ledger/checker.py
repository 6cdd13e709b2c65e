"""An independent checker for ledger texts.

It reads only the text (prompt and body) and the expected number of events, re-derives the
right value of every use from the rules of the task (it never calls the generator), and
reports every use with its age and copies as seen in the text. A text is `exact` when it is
well formed and every use is right; any single-character change of a generated problem makes
it not exact (tests check that exhaustively), because:

- the prompt is a constant and events have a fixed format (op, variable, value, space);
- every variable is defined once, before any use, with a value no other variable has;
- every defined variable is used at least once after its define.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LedgerCheck", "UseCheck", "check_ledger"]

# The alphabets and the prompt are restated here (not imported from the generator) so that
# the checker is an independent reading of the task's rules.
_PROMPT = "#ledger\n"
_VARIABLES = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_VALUES = frozenset("abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class UseCheck:
    """One use as the text shows it."""

    event: int
    variable: str
    expected: str  # the value of the variable's define
    written: str
    age: int  # tokens from the newest right copy's value to this value
    copies: int  # right copies before this use (the define and right earlier uses)
    copy_offsets: tuple[int, ...]  # body indices of the values of those copies

    @property
    def correct(self) -> bool:
        return self.written == self.expected


@dataclass(frozen=True)
class LedgerCheck:
    """The verdict on one text."""

    uses: tuple[UseCheck, ...]
    error: str | None  # the first structural error (wrong use values are not structural)

    @property
    def correct_uses(self) -> int:
        return sum(u.correct for u in self.uses)

    @property
    def exact(self) -> bool:
        return self.error is None and all(u.correct for u in self.uses)


def check_ledger(prompt: str, body: str, events: int) -> LedgerCheck:
    """Check a ledger text of `events` events (the body must be exactly 4 * events long)."""
    if prompt != _PROMPT:
        return LedgerCheck((), f"prompt {prompt!r} is not {_PROMPT!r}")
    if len(body) != 4 * events:
        return LedgerCheck((), f"body has {len(body)} characters, expected {4 * events}")
    value_of: dict[str, str] = {}
    owner: dict[str, str] = {}  # value -> variable
    copies: dict[str, list[int]] = {}  # variable -> body offsets of its right copies
    uses: list[UseCheck] = []
    error: str | None = None
    for event in range(events):
        op, var, value, space = body[4 * event : 4 * event + 4]
        problem = _malformed(op, var, value, space)
        if problem is None and op == "=":
            problem = _define(var, value, value_of, owner)
            if problem is None:
                value_of[var], owner[value] = value, var
                copies[var] = [4 * event + 2]
        elif problem is None:
            if var not in value_of:
                problem = f"use of {var!r} before its define"
            else:
                held = copies[var]
                age = 4 * event + 2 - held[-1]
                uses.append(UseCheck(event, var, value_of[var], value, age, len(held), tuple(held)))
                if value == value_of[var]:
                    held.append(4 * event + 2)
        if problem is not None and error is None:
            error = f"event {event}: {problem}"
    used = {u.variable for u in uses}
    never = [v for v in value_of if v not in used]
    if never and error is None:
        error = f"variable(s) {never} defined but never used"
    return LedgerCheck(tuple(uses), error)


def _malformed(op: str, var: str, value: str, space: str) -> str | None:
    if op not in "=?" or var not in _VARIABLES or value not in _VALUES or space != " ":
        return f"malformed event {op + var + value + space!r}"
    return None


def _define(var: str, value: str, value_of: dict[str, str], owner: dict[str, str]) -> str | None:
    if var in value_of:
        return f"{var!r} defined twice"
    if value in owner:
        return f"value {value!r} already belongs to {owner[value]!r}"
    return None
