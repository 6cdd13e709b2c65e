"""An independent checker for pointer-chain and tally-chain answers.

It reads only the prompt text and the candidate answer, and re-derives every hop from the
task's rules (it does not call the generator), so the generator's targets can be verified
against it and model outputs can be scored with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CheckResult", "check_answer", "parse_prompt"]

_FACT = re.compile(r"^([A-Z])([0-9])([a-z])$")


@dataclass(frozen=True)
class CheckResult:
    """How much of an answer is right."""

    hops_expected: int
    hops_correct: int  # leading hops that are exactly right (the chain is checked in order)
    first_error: str | None  # why the first wrong hop is wrong

    @property
    def exact(self) -> bool:
        return self.hops_correct == self.hops_expected and self.first_error is None


def parse_prompt(prompt: str) -> tuple[dict[str, tuple[int, str]], str]:
    """The facts {key: (digit, next key)} and the start key of a prompt."""
    if not prompt.endswith("\n") or " |" not in prompt:
        raise ValueError("not a chain prompt: expected '<facts> |<start>\\n'")
    table_text, start = prompt[:-1].rsplit(" |", 1)
    facts: dict[str, tuple[int, str]] = {}
    for item in table_text.split(" "):
        match = _FACT.match(item)
        if match is None:
            raise ValueError(f"malformed fact {item!r}")
        key, digit, nxt = match.groups()
        if key in facts:
            raise ValueError(f"key {key!r} has two facts")
        facts[key] = (int(digit), nxt.upper())  # pointers are written in lowercase
    if start not in facts:
        raise ValueError(f"start key {start!r} has no fact")
    if any(nxt not in facts for _, nxt in facts.values()):
        raise ValueError("a fact points to a key without a fact")
    return facts, start


def check_answer(prompt: str, answer: str, hops: int, *, tally: bool = False) -> CheckResult:
    """Check the first `hops` hops of `answer` (extra text after them is ignored).

    Pointer chain (default): hop i is ``key digit pointer`` + space, the pointer in lowercase.
    Tally chain (`tally=True`): hop i is ``key digit tally`` + space.
    """
    facts, key = parse_prompt(prompt)
    history: list[tuple[str, int]] = []  # (key, tally) of every hop written so far
    for hop in range(hops):
        chunk = answer[4 * hop : 4 * hop + 4]
        if len(chunk) < 4:
            return CheckResult(hops, hop, f"hop {hop}: answer ends early")
        digit, nxt = facts[key]
        # Latest earlier hop with this key, found by scanning the written history backwards.
        previous = next((t for k, t in reversed(history) if k == key), 0)
        third = str((previous + digit) % 10) if tally else nxt.lower()
        want = f"{key}{digit}{third} "
        if chunk != want:
            return CheckResult(hops, hop, f"hop {hop}: wrote {chunk!r}, expected {want!r}")
        history.append((key, (previous + digit) % 10))
        key = nxt
    return CheckResult(hops, hops, None)
