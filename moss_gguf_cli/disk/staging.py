"""Atomic outputs: build under a hidden temporary name, rename into place when complete.

An interrupted run leaves only a hidden `.NAME.partial-PID` entry, which the next
run removes; nothing at the real name can pass for a finished result.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import OutputError


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete(path: Path) -> None:
    """PATH gone, folder or file (a link is unlinked, never followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def discard(target: Path) -> None:
    """TARGET gone at once: renamed to its hidden partial name first, so a run killed while its
    files are deleted leaves nothing at TARGET, only a leftover the next run removes."""
    if not target.exists() and not target.is_symlink():
        return
    hidden = partial_name(target)
    _delete(hidden)
    os.replace(target, hidden)
    _delete(hidden)


def remove_stale_partials(target: Path) -> None:
    """Delete leftovers of killed runs for target (those whose process is gone)."""
    for leftover in target.parent.glob(f".{target.name}.partial-*"):
        try:
            pid = int(leftover.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and _pid_alive(pid):
            continue
        _delete(leftover)


def partial_name(target: Path) -> Path:
    return target.parent / f".{target.name}.partial-{os.getpid()}"


def check_free_space(where: Path, needed: int, output: Path) -> None:
    """Refuse before writing anything when the disk cannot hold the result."""
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise OutputError(
            f"needs {human_bytes(needed)} of free disk, only {human_bytes(free)} available",
            path=output,
            hint="free some disk or choose an --output on a larger disk",
        )


def check_target(target: Path, force: bool, *, kind: str = "folder") -> None:
    if not target.exists() and not target.is_symlink():
        return
    if kind == "folder":
        if not target.is_dir():
            raise OutputError(
                "exists and is not a folder", path=target, hint="choose another output path"
            )
        if any(target.iterdir()) and not force:
            raise OutputError(
                "output folder exists and is not empty",
                path=target,
                hint="choose another output or pass --force to replace it",
            )
    elif not force:
        raise OutputError(
            "output file exists",
            path=target,
            hint="choose another output or pass --force to replace it",
        )


class Staging:
    """`with Staging(out) as s:` write into s.path, then s.commit() to move it to out."""

    def __init__(self, target: Path, *, force: bool = False, kind: str = "folder"):
        self.target = Path(target)
        self.force = force
        self.kind = kind
        self.path = partial_name(self.target)
        self._committed = False

    def __enter__(self) -> Staging:
        check_target(self.target, self.force, kind=self.kind)
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(
                f"cannot create the output's folder ({exc.strerror})",
                path=self.target.parent,
                hint="choose a writable location",
            ) from exc
        if not os.access(self.target.parent, os.W_OK):
            raise OutputError(
                "the output's folder is not writable",
                path=self.target.parent,
                hint="choose a writable location",
            )
        remove_stale_partials(self.target)
        if self.kind == "folder":
            self.path.mkdir()
        return self

    def commit(self) -> None:
        old = None
        if self.target.exists() or self.target.is_symlink():
            if self.kind == "folder" and self.target.is_dir() and not any(self.target.iterdir()):
                self.target.rmdir()
            else:
                old = self.target.parent / f".{self.target.name}.old-{os.getpid()}"
                os.replace(self.target, old) if self.kind == "file" else self.target.rename(old)
        os.replace(self.path, self.target)
        self._committed = True
        if old is not None:
            _delete(old)

    def __exit__(self, *exc) -> None:
        if not self._committed:
            _delete(self.path)


@contextmanager
def staged_file(target: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside target; it becomes target only if the block succeeds."""
    with Staging(target, force=force, kind="file") as stage:
        yield stage.path
        stage.commit()
