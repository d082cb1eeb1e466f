"""How core code reports progress without knowing who listens.

Core functions take ``progress: ProgressReporter | None``; the CLI passes an
adapter that draws rich bars, tests pass nothing or a recorder. Tasks are named
by a key the caller picks; ``total`` is in ``unit`` (bytes, tensors, frames).
"""

from __future__ import annotations

from typing import Protocol


class ProgressReporter(Protocol):
    def start(self, key: str, description: str, total: float | None, unit: str = "") -> None: ...

    def advance(self, key: str, amount: float = 1, description: str | None = None) -> None: ...

    def finish(self, key: str) -> None: ...


class NullProgress:
    """Listens to nothing: the default when no reporter is given."""

    def start(self, key: str, description: str, total: float | None, unit: str = "") -> None:
        pass

    def advance(self, key: str, amount: float = 1, description: str | None = None) -> None:
        pass

    def finish(self, key: str) -> None:
        pass


class RecordingProgress:
    """Keeps every event; handy for tests and for summaries."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.totals: dict[str, float | None] = {}
        self.done: dict[str, float] = {}

    def start(self, key: str, description: str, total: float | None, unit: str = "") -> None:
        self.events.append(("start", key, description, total, unit))
        self.totals[key] = total
        self.done[key] = 0

    def advance(self, key: str, amount: float = 1, description: str | None = None) -> None:
        self.events.append(("advance", key, amount, description))
        self.done[key] = self.done.get(key, 0) + amount

    def finish(self, key: str) -> None:
        self.events.append(("finish", key))


def ensure(progress: ProgressReporter | None) -> ProgressReporter:
    """PROGRESS, or a reporter that listens to nothing when the caller gave none."""
    return progress if progress is not None else NullProgress()
