"""Reading a family folder's own files for its verify rows: a JSON object it holds (its
config.json), and its synth configs' paths, each of which must name what exists."""

from __future__ import annotations

import json
from pathlib import Path

from ..disk.confine import boundary, confined
from ..errors import InputError


def folder_json(path: Path) -> dict:
    """The JSON object at PATH, confined to its folder; one line when it is not one."""
    try:
        data = json.loads(confined(path, boundary(path.parent)).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"cannot be read as JSON ({exc})", path=path,
                         hint="make the folder again with moss-gguf all") from None  # fmt: skip
    if not isinstance(data, dict):
        raise InputError("is not a JSON object", path=path)
    return data


def synth_config_problems(folder: Path, keys: tuple[str, ...]) -> list[str]:
    """Each synth config's KEYS that name a path which does not exist; no config is one."""
    import yaml

    problems = []
    for path in sorted(folder.glob("*.yaml")):
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for key in keys:
            value = config.get(key)
            if value is not None and not (folder / str(value)).exists():
                problems.append(f"{path.name}: {key} {value} does not exist")
    return problems or ([] if any(folder.glob("*.yaml")) else ["no synth config"])
