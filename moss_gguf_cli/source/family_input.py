"""What a family's `all` asks of --model before anything is read: whether the value is the
family's (its builtin, a folder whose config is the family's, a Hub id by the release's name),
and a local folder for it (the builtin made, the folder itself, or a Hub snapshot whose files
are checked against the download's record). Nano and Realtime claim and fetch this way; the
delay family claims what no other does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..progress import ProgressReporter
from .checkpoint import BUILTIN_PREFIX
from .hub import check_files, download, is_repo_id, list_files


def claims_model(model: str, builtin: str, is_folder: Callable[[Path], bool],
                 hub_name: str) -> bool:  # fmt: skip
    """Whether --model MODEL is the family's, looked at without downloading: its BUILTIN, a
    folder IS_FOLDER says is the family's, a Hub id whose name starts with HUB_NAME."""
    if model.startswith(BUILTIN_PREFIX):
        return model == builtin
    folder = Path(model).expanduser()
    if folder.exists():
        return folder.is_dir() and is_folder(folder)
    return is_repo_id(model) and model.split("/")[-1].lower().startswith(hub_name)


def local_model(model: str, builtin: str, make_builtin: Callable[[], Path],
                revision: str | None, cache_dir: Path | None, patterns: list[str],
                bar: ProgressReporter) -> Path:  # fmt: skip
    """A local folder for MODEL: the builtin made, the folder itself, or a Hub snapshot of
    PATTERNS (its files checked against the download's record)."""
    if model == builtin:
        return make_builtin()
    path = Path(model).expanduser()
    if path.exists():
        return path
    listing = list_files(model, revision, cache_dir)
    snapshot = download(model, patterns, revision, cache_dir, bar)
    if listing is not None:
        rels = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*")
                      if p.is_file())  # fmt: skip
        check_files(listing, snapshot, rels, bar)
    return snapshot
