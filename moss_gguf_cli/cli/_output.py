"""Console, output modes and the rich adapter for core progress reports."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ..report import FAIL, PASS, WARN, CheckRows

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)
# how verify and doctor show a row's status
STATUS_STYLE = {PASS: "green", WARN: "yellow", FAIL: "bold red"}


@dataclass
class OutputMode:
    quiet: bool = False
    verbose: bool = False
    json: bool = False

    @property
    def bars(self) -> bool:
        """Bars only for a person at a terminal: not piped, not quiet, not JSON, not NO_COLOR."""
        if self.quiet or self.json or os.environ.get("NO_COLOR") or os.environ.get("CI"):
            return False
        return stderr.is_terminal


def setup_logging(mode: OutputMode) -> None:
    level = logging.WARNING if mode.quiet else logging.DEBUG if mode.verbose else logging.INFO
    root = logging.getLogger("moss_gguf_cli")
    root.handlers.clear()
    handler = RichHandler(console=stderr, show_time=False, show_path=False, markup=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


class RichProgress:
    """Adapts the core ProgressReporter protocol to a rich Progress display."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def start(self, key: str, description: str, total: float | None, unit: str = "") -> None:
        if key in self._tasks:
            self._progress.remove_task(self._tasks.pop(key))
        self._tasks[key] = self._progress.add_task(description, total=total, unit=unit)

    def advance(self, key: str, amount: float = 1, description: str | None = None) -> None:
        task = self._tasks.get(key)
        if task is None:
            return
        if description is None:
            self._progress.advance(task, amount)
        else:
            self._progress.update(task, advance=amount, description=description)

    def finish(self, key: str) -> None:
        task = self._tasks.get(key)
        if task is not None:
            t = self._progress.tasks[[x.id for x in self._progress.tasks].index(task)]
            if t.total is not None:
                self._progress.update(task, completed=t.total)


class _UnitColumn(TextColumn):
    """Bytes as a transfer (GB/s), everything else as M of N."""

    def __init__(self) -> None:
        super().__init__("")
        self._bytes = DownloadColumn()
        self._speed = TransferSpeedColumn()
        self._count = MofNCompleteColumn()

    def render(self, task):  # type: ignore[override]
        from rich.text import Text

        if task.fields.get("unit") == "B":
            return Text.assemble(self._bytes.render(task), " ", self._speed.render(task))
        if task.total is None:
            return Text(str(int(task.completed)))
        return self._count.render(task)


@contextmanager
def progress_for(mode: OutputMode) -> Iterator[RichProgress | None]:
    """A live progress display when bars are wanted, else None (core then reports to nobody)."""
    if not mode.bars:
        yield None
        return
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        _UnitColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )
    with progress:
        yield RichProgress(progress)


def info(mode: OutputMode, message: str) -> None:
    if not mode.quiet and not mode.json:
        stderr.print(message, highlight=False)



def finish_report(
    report: Any, render: Callable[..., None], *, json_: bool, quiet: bool
) -> NoReturn:
    """Print a check report (as JSON, or through `render`); exit 0 if it passed, else 1."""
    if json_:
        typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        render(report, quiet=quiet)
    raise typer.Exit(0 if report.ok else 1)


def print_verdict(
    report: CheckRows, seconds: float, *, passed: str, failed: str, of_all: bool = False
) -> None:
    """The last line under a check table: the verdict, the counts, the first failures."""
    c = report.counts
    if report.ok:
        verdict = f"[green]{passed}[/]: {c[PASS]} checks passed"
        verdict += f", {c[WARN]} warning(s)" if c[WARN] else ""
    else:
        names = ", ".join(r.name for r in report.failures()[:3])
        count = f"{c[FAIL]} of {len(report.rows)} checks" if of_all else f"{c[FAIL]} check(s)"
        verdict = f"[bold red]{failed}[/]: {count} failed ({names})"
    stdout.print(f"{verdict} in {seconds:.1f} s", highlight=False)


def command_line() -> str:
    """This run's command as a user would type it (the model card records it)."""
    import shlex
    import sys

    return shlex.join(["moss-gguf", *sys.argv[1:]])
