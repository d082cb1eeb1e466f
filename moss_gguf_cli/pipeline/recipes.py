"""Conversion recipes: a YAML that `all --config FILE` runs, so a published conversion repeats.

A recipe names the model, the file types (its key `quant`), the intermediate type, the codec
and the synth settings the folder's ``moss-tts.yaml`` gets (``configs/recipes/`` holds one
per supported variant and file type). Flags given on the command line override the file's keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from ..tts.defaults import SYNTH_DEFAULTS

# key → what it must be
RECIPE_KEYS: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "revision": str,
    "quant": (list, str),
    "outtype": str,
    "engine": str,
    "audio_tokenizer": str,
    "audio_tokenizer_revision": str,
    "synth": dict,
}


@dataclass
class Recipe:
    path: Path
    model: str | None = None
    revision: str | None = None
    file_types: list[str] = field(default_factory=list)  # the YAML's key: quant
    outtype: str | None = None
    engine: str | None = None
    audio_tokenizer: str | None = None
    audio_tokenizer_revision: str | None = None
    synth: dict[str, Any] = field(default_factory=dict)


def load_recipe(path: Path) -> Recipe:
    """Read and check a recipe; one-line errors name the file and the key."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise InputError("recipe not found", path=path, hint="see configs/recipes/")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"cannot read the recipe: {first}", path=path) from exc
    if not isinstance(data, dict):
        raise InputError("the recipe is not a mapping of keys to values", path=path)
    recipe = Recipe(path)
    for key, value in data.items():
        if key not in RECIPE_KEYS:
            raise UsageError(
                f"unknown recipe key {key!r}", path=path,
                hint=f"use {', '.join(RECIPE_KEYS)}",
            )  # fmt: skip
        if value is None:
            continue
        if not isinstance(value, RECIPE_KEYS[key]):
            raise UsageError(f"recipe key {key} has the wrong type ({value!r})", path=path)
        if key == "quant":
            value = [value] if isinstance(value, str) else [str(v) for v in value]
            key = "file_types"
        setattr(recipe, key, value)
    unknown = sorted(set(recipe.synth) - set(SYNTH_DEFAULTS))
    if unknown:
        raise UsageError(
            f"unknown synth key(s) in the recipe: {', '.join(unknown)}", path=path,
            hint=f"use keys of the synth YAML: {', '.join(SYNTH_DEFAULTS)}",
        )  # fmt: skip
    return recipe
