"""What `verify` and `doctor` return: named check rows, each pass, warn or fail.

Both reports are a list of :class:`CheckRow` (the :class:`CheckRows` verdict helpers mixed
in); :class:`Rows` collects them section by section; :func:`json_safe` makes a report's
figures JSON.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class CheckRow:
    group: str  # the section it is shown in
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""  # one line; what to do when it is not a pass


class CheckRows:
    """Verdict helpers for a report dataclass with a `rows` list (mixed in, adds no fields)."""

    rows: list[CheckRow]

    @property
    def ok(self) -> bool:
        return not any(r.status == FAIL for r in self.rows)

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(r.status for r in self.rows)
        return {s: c.get(s, 0) for s in (PASS, WARN, FAIL)}

    def row(self, name: str) -> CheckRow | None:
        return next((r for r in self.rows if r.name == name), None)

    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status == FAIL]


class Rows:
    """Collects rows; the group is set per section."""

    def __init__(self) -> None:
        self.rows: list[CheckRow] = []
        self.group = ""

    def add(self, name: str, status: str, detail: str, fix: str = "") -> CheckRow:
        row = CheckRow(self.group, name, status, " ".join(detail.split()), fix)
        self.rows.append(row)
        return row

    def check(self, name: str, problems: list[str], ok_detail: str, *, warn=()) -> CheckRow:
        """fail with the problems listed, else warn with the warnings, else pass."""
        if problems:
            return self.add(name, FAIL, listing(problems))
        if warn:
            return self.add(name, WARN, listing(list(warn)))
        return self.add(name, PASS, ok_detail)


def listing(items: list[str], limit: int = 4) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; … {len(items) - limit} more" if len(items) > limit else "")


def json_safe(value: Any) -> Any:
    """JSON has no Inf/NaN: such floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return json_safe(value.item())
    return value
