"""`all --format backend --format moss-tts-delay`: both dialects from one read of the checkpoint.

The backend run's direct engine writes the first-class GGUFs in the same pass as the
backbone's (quantize/direct.py `join_plans`): they go into a hand-off folder beside the output,
``.NAME.moss-tts-delay.work``, with a record of what they are made from. The first-class folder
is then finished from them (tokenizer, codec, README, manifest) without reading the checkpoint
again, and the hand-off folder removed. A run stopped in between resumes from it; one of other
inputs is refused, as the backend's work folder is.

Where the pass cannot take them, the first-class folder reads the checkpoint itself, as
before: the backend folder was already complete (nothing is read for it), the engine is not
the direct one, the first-class types are F16/BF16 alone, or its F16/BF16 file asks for
another intermediate type than the backend's --outtype.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

from ..disk.staging import check_target
from ..errors import OutputError
from ..gguf.file_types import parse_file_type
from ..gguf.first_class import FORMAT, parse_audio_tables_type
from ..progress import ProgressReporter, ensure
from ..quantize.engines import Companion
from .first_class import (
    FLOAT_TYPES,
    FirstClassFolder,
    check_first_class_settings,
    first_class_made_from,
    folder_complete,
    gguf_names,
    run_first_class,
)
from .made_from import WORK_KEYS, MadeFrom, manifest_made_from, refuse_other
from .run import AllResult, AllSettings, run_all

HANDOFF_RECORD = "handoff.json"


def handoff_dir(output: Path) -> Path:
    """Beside the output, not in it: the backend folder is renamed into place whole."""
    return output.parent / f".{output.name}.{FORMAT}.work"


def run_both(
    settings: AllSettings,
    progress: ProgressReporter | None = None,
    audio_tables: str | None = None,
) -> tuple[AllResult, FirstClassFolder]:
    """The backend folder at settings.output and the first-class one in OUTPUT/moss-tts-delay,
    the checkpoint read once for both (see the module's docstring for when it is not)."""
    bar = ensure(progress)
    sub = replace(settings, output=Path(settings.output) / FORMAT)
    check_first_class_settings(sub)  # what needs no look at anything fails first
    parse_audio_tables_type(audio_tables)
    handoff = handoff_dir(Path(settings.output))

    def also(model: Path) -> Companion | None:  # once run_all has the model, before any work
        return prepare_handoff(sub, handoff, audio_tables, model)

    result = run_all(settings, progress=bar, also=also)
    folder = run_first_class(sub, progress=bar, audio_tables=audio_tables, handoff=handoff)
    shutil.rmtree(handoff, ignore_errors=True)
    return result, folder


def prepare_handoff(
    sub: AllSettings, handoff: Path, audio_tables: str | None, model: Path
) -> Companion | None:
    """What the backend pass should also write (None: nothing): the first-class folder
    complete already (made from these inputs, or refused), or GGUFs it cannot take."""
    file_types = [parse_file_type(q) for q in sub.file_types] or ["Q4_K_M"]
    names = gguf_names(file_types)
    made_from = first_class_made_from(sub, model)
    if not sub.force and folder_complete(sub.output, names, audio_tables, sub.native_codec):
        refuse_other(sub.output, manifest_made_from(sub.output), made_from)
        return None
    check_target(sub.output, sub.force)  # someone else's folder: refused before the pass
    floats = [q for q in file_types if q in FLOAT_TYPES]
    pairs = zip(names, file_types, strict=True)
    quantized = [(handoff / n, q) for n, q in pairs if q not in floats]
    if not quantized or len(floats) > 1 or (floats and floats[0].lower() != sub.outtype):
        return None  # the first-class folder reads the checkpoint itself
    tables = audio_tables.strip().lower() if audio_tables else None
    if sub.force:
        shutil.rmtree(handoff, ignore_errors=True)
    elif handoff.exists() and any(handoff.iterdir()):
        _refuse_other_handoff(handoff, made_from, tables)
        if all((handoff / n).is_file() for n in names):
            return None  # a resumed run: the pass wrote them already
    handoff.mkdir(parents=True, exist_ok=True)
    record = {"made_from": made_from.to_json(), "audio_tables": tables}
    tmp = handoff / f".{HANDOFF_RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, handoff / HANDOFF_RECORD)  # never half a record
    return Companion(quantized, keep=handoff if floats else None, audio_tables=tables)


def _refuse_other_handoff(handoff: Path, made_from: MadeFrom, tables: str | None) -> None:
    """A hand-off folder is resumed only by a run of the same inputs and audio tables."""
    try:
        record = json.loads((handoff / HANDOFF_RECORD).read_text())
    except (OSError, ValueError, RecursionError):
        record = {}
    theirs = MadeFrom.from_json(record.get("made_from")) if isinstance(record, dict) else None
    refuse_other(handoff, theirs, made_from, WORK_KEYS)
    if record.get("audio_tables") != tables:
        raise OutputError(
            f"holds first-class GGUFs with audio tables {record.get('audio_tables')!r}; "
            f"this run asks for {tables!r}",
            path=handoff,
            hint="pass --force to replace it, or choose another --output",
        )
