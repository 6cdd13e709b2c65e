"""The results of `randkv check`: one line per check, a one-screen verdict, a JSON file.

A check returns a dict: "status" (pass / fail / skip / info; default pass), "summary" (one
short line) and any details. An exception marks the line failed, with its traceback in
the JSON, and the next check runs. The JSON is rewritten after every line, so a run cut
short leaves what it had.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATUSES = ("pass", "fail", "skip", "info")


class Report:
    def __init__(self, out: Path | None, budget_s: float, *, echo: bool = True) -> None:
        self.out, self.budget_s, self.echo = out, budget_s, echo
        self.start = time.monotonic()
        self.doc: dict[str, Any] = {
            "command": "randkv check",
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "finished": False,
            "checks": {},
        }
        self.save()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def save(self) -> None:
        if self.out is None:
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        partial = self.out.with_name(self.out.name + ".partial")
        partial.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        os.replace(partial, self.out)

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one check and record its line; never raises."""
        entry: dict[str, Any]
        if self.elapsed() > self.budget_s:
            entry = {"status": "skip", "summary": f"out of time ({self.elapsed():.0f} s used)"}
        else:
            began = time.monotonic()
            try:
                entry = dict(fn())
                entry.setdefault("status", "pass")
                if entry["status"] not in STATUSES:
                    raise ValueError(f"unknown status {entry['status']!r}")
            except Exception as error:  # one failing line must not stop the others
                entry = {
                    "status": "fail",
                    "summary": f"{type(error).__name__}: {error}"[:300],
                    "traceback": traceback.format_exc(limit=12),
                }
            entry["seconds"] = round(time.monotonic() - began, 2)
        entry.setdefault("summary", "")
        self.doc["checks"][name] = entry
        if self.echo:
            print(self.line(name, entry), flush=True)
        self.save()
        return entry

    @staticmethod
    def line(name: str, entry: dict[str, Any]) -> str:
        seconds = entry.get("seconds")
        took = f"{seconds:6.1f}s" if isinstance(seconds, int | float) else "      -"
        return f"{entry['status'].upper():4}  {name:24} {took}  {entry['summary']}"

    def finish(self) -> int:
        """Write the verdict; exit status 1 if any line failed."""
        checks = self.doc["checks"]
        counts = {s: sum(c["status"] == s for c in checks.values()) for s in STATUSES}
        failed = [name for name, c in checks.items() if c["status"] == "fail"]
        self.doc["verdict"] = {
            "passed": not failed,
            "failed": failed,
            "counts": counts,
            "total_seconds": round(self.elapsed(), 1),
        }
        self.doc["finished"] = True
        self.save()
        return 1 if failed else 0

    def verdict(self) -> str:
        """The one-screen summary: every line, then the overall result."""
        lines = ["", "randkv check: verdict", "-" * 72]
        lines += [self.line(name, entry) for name, entry in self.doc["checks"].items()]
        verdict = self.doc.get("verdict", {})
        counts = verdict.get("counts", {})
        result = "PASS" if verdict.get("passed") else "FAIL"
        lines.append("-" * 72)
        lines.append(
            f"{result}: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
            f"{counts.get('skip', 0)} skipped, {counts.get('info', 0)} info "
            f"in {verdict.get('total_seconds', 0)} s" + (f"; JSON: {self.out}" if self.out else "")
        )
        return "\n".join(lines)
