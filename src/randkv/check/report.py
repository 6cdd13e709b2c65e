"""The results of `randkv check`: one line per check, a one-screen verdict, a JSON file.

A check returns a `CheckLine`: its status (pass / fail / skip / info), one short summary
line and any details (JSON values). An exception marks the line failed, with its traceback
in the JSON, and the next check runs. The JSON is rewritten after every line, so a run cut
short leaves what it had; each line is written flat, {"status", "summary", details...,
"seconds"}.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from randkv.bench.records import Json, JsonObject, to_json

Status = Literal["pass", "fail", "skip", "info"]
STATUSES: tuple[Status, ...] = ("pass", "fail", "skip", "info")
#: The keys a line's own fields take in its JSON object; details may not use them.
_LINE_KEYS = frozenset({"status", "summary", "seconds", "traceback"})


@dataclass(frozen=True, kw_only=True)
class CheckLine:
    """One check's result."""

    status: Status = "pass"
    summary: str = ""
    details: Mapping[str, Json] = field(default_factory=dict)
    seconds: float | None = None  # how long it ran (None: not run)
    traceback: str | None = None  # a failed line's exception

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        clash = _LINE_KEYS & set(self.details)
        if clash:
            raise ValueError(f"details may not be called {sorted(clash)}")

    def to_json(self) -> JsonObject:
        """The line's JSON object: status, summary, the details, then traceback and seconds."""
        out: JsonObject = {"status": self.status, "summary": self.summary}
        out.update({key: to_json(value) for key, value in self.details.items()})
        if self.traceback is not None:
            out["traceback"] = self.traceback
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out


@dataclass(frozen=True, kw_only=True)
class Verdict:
    passed: bool
    failed: list[str]
    counts: dict[Status, int]
    total_seconds: float


class Report:
    def __init__(self, out: Path | None, budget_s: float, *, echo: bool = True) -> None:
        self.out, self.budget_s, self.echo = out, budget_s, echo
        self.start = time.monotonic()
        self.started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.checks: dict[str, CheckLine] = {}
        self.result: Verdict | None = None
        self.save()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def document(self) -> JsonObject:
        """What the JSON file holds."""
        doc: JsonObject = {
            "command": "randkv check",
            "started": self.started,
            "finished": self.result is not None,
            "checks": {name: line.to_json() for name, line in self.checks.items()},
        }
        if self.result is not None:
            doc["verdict"] = to_json(self.result)
        return doc

    def save(self) -> None:
        if self.out is None:
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        partial = self.out.with_name(self.out.name + ".partial")
        partial.write_text(json.dumps(self.document(), indent=2) + "\n")
        os.replace(partial, self.out)

    def run(self, name: str, fn: Callable[[], CheckLine]) -> CheckLine:
        """Run one check and record its line; never raises."""
        if self.elapsed() > self.budget_s:
            line = CheckLine(status="skip", summary=f"out of time ({self.elapsed():.0f} s used)")
        else:
            began = time.monotonic()
            try:
                line = fn()
                if not isinstance(line, CheckLine):
                    raise TypeError(f"a check returned {type(line).__name__}, not a CheckLine")
                line.to_json()  # details that are not JSON fail this line, not the report
            except Exception as error:  # one failing line must not stop the others
                line = CheckLine(
                    status="fail",
                    summary=f"{type(error).__name__}: {error}"[:300],
                    traceback=traceback.format_exc(limit=12),
                )
            line = replace(line, seconds=round(time.monotonic() - began, 2))
        self.checks[name] = line
        if self.echo:
            print(self.line(name, line), flush=True)
        self.save()
        return line

    @staticmethod
    def line(name: str, line: CheckLine) -> str:
        took = f"{line.seconds:6.1f}s" if line.seconds is not None else "      -"
        return f"{line.status.upper():4}  {name:24} {took}  {line.summary}"

    def finish(self) -> int:
        """Write the verdict; exit status 1 if any line failed."""
        lines = self.checks.values()
        failed = [name for name, line in self.checks.items() if line.status == "fail"]
        self.result = Verdict(
            passed=not failed,
            failed=failed,
            counts={s: sum(line.status == s for line in lines) for s in STATUSES},
            total_seconds=round(self.elapsed(), 1),
        )
        self.save()
        return 1 if failed else 0

    def verdict(self) -> str:
        """The one-screen summary: every line, then the overall result."""
        lines = ["", "randkv check: verdict", "-" * 72]
        lines += [self.line(name, line) for name, line in self.checks.items()]
        verdict = self.result
        counts: dict[Status, int] = verdict.counts if verdict is not None else {}
        result = "PASS" if verdict is not None and verdict.passed else "FAIL"
        lines.append("-" * 72)
        lines.append(
            f"{result}: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
            f"{counts.get('skip', 0)} skipped, {counts.get('info', 0)} info "
            f"in {verdict.total_seconds if verdict is not None else 0} s"
            + (f"; JSON: {self.out}" if self.out else "")
        )
        return "\n".join(lines)
