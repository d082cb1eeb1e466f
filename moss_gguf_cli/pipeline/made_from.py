"""What a weights folder, or `all`'s work folder, was made from: a rerun resumes only its own work.

`all` records this beside its work (``.NAME.work/made_from.json``) and in the finished folder's
``manifest.json`` (``made_from``). A step is skipped only when the record equals this run's: the
same source (a Hub repo at the same commit, or the same folder with the same file sizes and
config; builtin names stand for themselves), the same intermediate type, importance matrix,
codec, synth settings and output format. The engine and thread count are not part of it: every
engine writes the same bytes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..disk.layout_names import MANIFEST_NAME
from ..errors import OutputError

RECORD_NAME = "made_from.json"
# what a work folder's contents depend on (the codec and synth settings only touch the layout)
WORK_KEYS = ("source", "outtype", "imatrix", "format", "lora")
_SOURCE_FILES = ("*.safetensors", "*.json", "*.txt", "*.gguf", "*.npy", "*.model")


@dataclass(frozen=True)
class MadeFrom:
    source: dict[str, Any]
    outtype: str = "auto"
    imatrix: str | None = None  # sha256 of the importance matrix file
    codec: str | None = None  # the codec asked for (repo id[@revision], folder, builtin, none)
    synth: dict[str, Any] = field(default_factory=dict)
    format: str = "backend"
    lora: list[dict[str, Any]] = field(default_factory=list)  # merged adapters (source/lora)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> MadeFrom | None:
        """The record, or None if DATA is not one (an older moss-gguf wrote none)."""
        try:
            return cls(**data)
        except TypeError:
            return None

    def differences(self, other: MadeFrom | None, keys: tuple[str, ...] | None = None) -> list[str]:
        """The names of the inputs in which OTHER differs from this run."""
        if other is None:
            return ["(no record)"]
        mine, theirs = self.to_json(), other.to_json()
        return [k for k in (keys or tuple(mine)) if mine[k] != theirs[k]]


def describe_source(source: dict[str, Any]) -> str:
    if "repo" in source:
        return f"{source['repo']} at {str(source.get('commit'))[:12]}"
    return str(source.get("folder") or source.get("model"))


def folder_identity(folder: Path, files: list[str] | None = None) -> dict[str, Any]:
    """A local source: its path, every model file's size and the config's sha256."""
    folder = Path(folder).resolve()
    if files is None:
        files = sorted(
            p.name for p in folder.iterdir()
            if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in _SOURCE_FILES)
        )  # fmt: skip
    sizes = {rel: (folder / rel).stat().st_size for rel in files}
    config = folder / "config.json"
    digest = hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None
    return {"folder": str(folder), "sizes": sizes, "config_sha256": digest}


def source_identity(model: str, model_dir: Path) -> dict[str, Any]:
    """What MODEL (as given) resolved to: a builtin, a Hub repo at a commit, or a folder."""
    if model.startswith("builtin:"):
        return {"model": model}
    resolved = Path(model_dir).resolve()
    if resolved.parent.name == "snapshots" and not Path(model).expanduser().exists():
        return {"repo": model, "commit": resolved.name}
    return folder_identity(resolved)


def file_sha256(path: Path | None) -> str | None:
    if path is None:
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_record(path: Path) -> MadeFrom | None:
    try:
        return MadeFrom.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, RecursionError):
        return None


def manifest_made_from(output: Path) -> MadeFrom | None:
    """What a finished folder's manifest says it was made from (None: not recorded)."""
    try:
        data = json.loads((Path(output) / MANIFEST_NAME).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return MadeFrom.from_json(data.get("made_from")) if isinstance(data, dict) else None


def write_record(path: Path, made_from: MadeFrom) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(made_from.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


def refuse_other(
    where: Path, theirs: MadeFrom | None, ours: MadeFrom, keys: tuple[str, ...] | None = None
) -> None:
    """One line when WHERE holds work made from other inputs than this run's."""
    diff = ours.differences(theirs, keys)
    if not diff:
        return
    if theirs is None:
        held = "work whose inputs are not recorded (an older moss-gguf made it)"
        asked = describe_source(ours.source)
    else:
        others = [d for d in diff if d != "source"]
        held = f"a run made from {describe_source(theirs.source)}"
        asked = describe_source(ours.source)
        if others:
            held += " (" + ", ".join(f"{k} {getattr(theirs, k)!r}" for k in others) + ")"
            asked += " (" + ", ".join(f"{k} {getattr(ours, k)!r}" for k in others) + ")"
    raise OutputError(
        f"holds {held}; this run asks for {asked}",
        path=where,
        hint="pass --force to replace it, or choose another --output",
    )
