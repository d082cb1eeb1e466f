"""A folder's manifest.json as the formats with their own verify rows write it (the first-class
folder, the Nano folder): which format it says, and each listed file checked."""

from __future__ import annotations

import json
from pathlib import Path

from ..disk.confine import child
from ..disk.digests import sha256_file
from ..disk.layout_names import MANIFEST_NAME
from ..errors import InputError


def format_manifest(path: Path, fmt: str) -> dict | None:
    """The manifest of a folder of format FMT, None when PATH is not one."""
    try:
        data = json.loads((Path(path) / MANIFEST_NAME).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == fmt else None


def manifest_problems(folder: Path, manifest: dict) -> list[str]:
    """Each listed file that is missing, outside the folder, of another size or sha256."""
    problems = []
    for f in manifest.get("files") or []:
        try:
            p = child(folder, str(f.get("path", "")), "the manifest's file", folder / MANIFEST_NAME)
        except InputError as exc:
            problems.append(exc.message)
            continue
        if not p.is_file():
            problems.append(f"{f['path']} is missing")
        elif p.stat().st_size != f.get("size"):
            problems.append(f"{f['path']} has {p.stat().st_size} bytes, listed {f.get('size')}")
        elif sha256_file(p) != f.get("sha256"):
            problems.append(f"{f['path']}: sha256 differs from the manifest's")
    return problems
