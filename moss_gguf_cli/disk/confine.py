"""Untrusted folders stay inside themselves.

A model or pre-converted folder may come from an archive or a shared drive: a file in it that is
a symlink to somewhere else (``/etc/passwd``, another user's home) must never be read, linked or
copied into an output. A Hub snapshot's files are links into the repo's own ``blobs/``, so for a
snapshot the repo's cache folder is the boundary. Paths *named inside* a file (an index's shard
names, a manifest's entries) are checked by `child`.
"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np

from ..errors import InputError


def boundary(folder: Path) -> Path:
    """The folder FOLDER's files must resolve inside: the repo folder of a Hub snapshot
    (``models--org--name/snapshots/<commit>``, or a folder inside one, such as a pushed
    folder's audio_tokenizer/), else the folder itself."""
    folder = Path(folder).resolve()
    for snap in (folder, *folder.parents):
        if snap.parent.name == "snapshots" and snap.parent.parent.name.startswith(
            ("models--", "datasets--", "spaces--")
        ):
            return snap.parent.parent
    return folder


def confined(path: Path, root: Path, hint: str = "") -> Path:
    """PATH, after checking it resolves inside ROOT (see `boundary`); a one-line error if not."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(root).resolve()):
        raise InputError(
            f"is a link to {resolved}, outside the folder it was given in; it is not read",
            path=path,
            hint=hint or "replace the link with the file itself",
        )
    return path


def confined_all(paths, folder: Path) -> None:
    """Every path of PATHS resolves inside FOLDER's boundary."""
    root = boundary(folder)
    for p in paths:
        confined(p, root)


def child(root: Path, relative: str, what: str, source: Path) -> Path:
    """A path named inside a file must stay inside root: no absolute paths, no `..`."""
    rel = Path(relative)
    bad = rel.is_absolute() or ".." in rel.parts or relative.strip() == ""
    if bad or not (root / rel).resolve().is_relative_to(boundary(root)):
        raise InputError(
            f"{what} {relative!r} points outside the model folder",
            path=source,
            hint="fix or re-download the index file",
        )
    return root / rel


def table_header(path: Path, shape: tuple[int | None, int | None] | None = None) -> tuple:
    """(shape, dtype) of a `.npy` table from its header alone, refusing anything but a
    2-D float table (of SHAPE where given; None in it matches any length)."""
    try:
        with open(path, "rb") as f:
            major, _minor = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else (
                np.lib.format.read_array_header_2_0
            )
            header = read(f)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"is not a readable .npy table ({exc})", path=path, hint="download it again"
        ) from exc
    got, _fortran, dtype = header
    if dtype.hasobject or dtype.kind != "f":
        raise InputError(
            f"holds {dtype} values, not a float table (a pickled or foreign array is never "
            "loaded)",
            path=path,
            hint="download the table again from the original repo",
        )
    wrong = shape and any(w is not None and w != g for w, g in zip(shape, got, strict=False))
    if len(got) != 2 or wrong:
        want = "×".join("N" if w is None else str(w) for w in shape) if shape else "2-D"
        raise InputError(
            f"has shape {'×'.join(map(str, got))}, expected {want}",
            path=path,
            hint="the table is from another model, or damaged; download it again",
        )
    return tuple(int(n) for n in got), dtype


def present(path: Path) -> bool:
    """Whether a file is at PATH: False where nothing is, True for a regular file (a link to
    one included); anything else where a file belongs (a FIFO, a device, a socket, a folder) is
    refused, never opened: reading a FIFO blocks forever, /dev/zero never ends."""
    try:
        mode = Path(path).stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file where a folder was)
        return False
    except OSError as exc:  # a link loop, a name too long, no permission
        raise InputError(f"cannot be read ({exc.strerror})", path=path) from None
    if stat.S_ISREG(mode):
        return True
    raise InputError(f"is {_kind(mode)}, not a regular file", path=path,
                     hint="put the file itself there")  # fmt: skip


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a file"
