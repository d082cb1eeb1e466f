"""What `synth` returns for any family, for the CLI to render without knowing which one spoke:
the file written, a summary line, warnings (nothing cut silently), a profile table; or, with
--dry-run, the plan. And the one refusal of the options a family does not take, and the one
writer of `--codes-out`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, OutputError, UsageError


@dataclass(frozen=True)
class Table:
    """Rows under named columns: those named in LEFT read left, the others right."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    left: tuple[str, ...] = ("measure",)


@dataclass(frozen=True)
class Spoken:
    output: Path | None  # the file written; None: the audio went to a stream (stdout)
    summary: str  # frames, seconds of audio, time taken
    warnings: list[str] = field(default_factory=list)
    profile: Table | None = None  # --profile: where the time went


@dataclass(frozen=True)
class Planned:
    """--dry-run: each chunk as the model would get it; `data` is --json's object."""

    table: Table
    data: dict[str, Any]
    as_json: bool = False


def refuse_options(options: dict[str, Any], flags: dict[str, str], title: str, hint: str) -> None:
    """One line naming each option in FLAGS (flag → option name) that OPTIONS gives, which the
    family of TITLE does not take."""
    named = [flag for flag, name in flags.items() if options.get(name)]
    if named:
        verb = "does" if len(named) == 1 else "do"
        raise UsageError(f"{', '.join(named)} {verb} not apply to a {title} folder", hint=hint)


def read_text(text: str | None, text_file: Path | None, may_be_absent: bool = False) -> str | None:
    """--text (- : stdin) or --text-file, exactly one (unless MAY_BE_ABSENT)."""
    if text is None and text_file is None and may_be_absent:
        return None  # MOSS-SoundEffect: the ambient sound says what to make
    if (text is None) == (text_file is None):
        raise UsageError("give exactly one of --text and --text-file")
    if text == "-":
        return sys.stdin.read()
    if text_file is not None:
        try:
            return text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read the text file: {exc}", path=text_file) from exc
    return text or ""


def sink_of(output: Path, stream: bool) -> tuple[Any, str | None]:
    """Where --output and --stream send the audio: (a path or stdout's binary buffer, the
    stream's format: None for a WAV written at the end, "wav" or "pcm" as it is made)."""
    if not stream:
        if str(output) == "-":
            raise UsageError("--output - writes to stdout, which needs --stream")
        return output, None
    if str(output) == "-":
        return sys.stdout.buffer, "pcm"
    return output, "wav" if output.suffix.lower() == ".wav" else "pcm"


def check_codes_out(path: Path | None) -> None:
    """`--codes-out` names a file in a folder that exists: said before any synthesis."""
    if path is not None and (Path(path).is_dir() or not Path(path).parent.is_dir()):
        raise OutputError("not a file in an existing folder", path=path,
                          hint="name an .npy file in a folder that exists")  # fmt: skip


def write_codes(path: Path, codes: np.ndarray) -> None:
    """`--codes-out`: the code grid the codec decodes, (frames, codebooks) int64 as an .npy,
    written under a temporary name and renamed when complete."""
    path = Path(path)
    check_codes_out(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(codes, np.int64), allow_pickle=False)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write the codes ({exc.strerror})", path=path) from None
