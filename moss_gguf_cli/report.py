"""What `verify` and `doctor` return: named check rows, each pass, warn or fail."""

from __future__ import annotations

from collections import Counter
from typing import Any

PASS, WARN, FAIL = "pass", "warn", "fail"


class CheckRows:
    """Verdict helpers for a report dataclass with a `rows` list (mixed in, adds no fields)."""

    rows: list[Any]

    @property
    def ok(self) -> bool:
        return not any(r.status == FAIL for r in self.rows)

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(r.status for r in self.rows)
        return {s: c.get(s, 0) for s in (PASS, WARN, FAIL)}

    def row(self, name: str) -> Any | None:
        return next((r for r in self.rows if r.name == name), None)

    def failures(self) -> list[Any]:
        return [r for r in self.rows if r.status == FAIL]
