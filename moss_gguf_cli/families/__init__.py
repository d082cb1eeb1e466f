"""The model families and the one registry the stages ask (docs/ARCHITECTURE.md §6 "The family
interface"): which family an input, a folder or a synth config is, and its entry into each
stage. A new family is a room, a module here with its `Family`, and one line in FAMILIES.

May import: every room below cli/ (rank 8: pipeline/, serve/ lazily, verify/, nano/, tts/, …).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..disk.layout_names import FAMILY_KEY
from ..errors import InputError
from .delay import DELAY
from .family import Family
from .nano import NANO
from .realtime import REALTIME

# asked in order; the delay family last: it claims what no other does (its readers refuse a
# look-alike by name)
FAMILIES: tuple[Family, ...] = (NANO, REALTIME, DELAY)

__all__ = ["DELAY", "FAMILIES", "NANO", "REALTIME", "Family", "for_config", "for_folder",
           "for_input"]


def for_input(model: str) -> Family:
    """The family a --model value is (a folder's config, a Hub id, a builtin)."""
    return next(f for f in FAMILIES if f.claims_input(model))


def for_folder(path: Path | str | None) -> Family:
    """The family whose folder PATH is (its manifest says), for `verify`; no path: the delay
    family's verify, which says what to give."""
    if path is None or not str(path).strip():
        return DELAY
    return next(f for f in FAMILIES if f.claims_folder(Path(path)))


def for_config(path: Path) -> Family:
    """The family a synth config is for: the family its YAML names (none: the delay family's,
    as folders made before families said so). A YAML that cannot be read goes to the delay
    family, whose reader says why in one line."""
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return DELAY
    named = data.get(FAMILY_KEY) if isinstance(data, dict) else None
    if named is None:
        return DELAY
    found = next((f for f in FAMILIES if f.name == named), None)
    if found is None:
        names = ", ".join(f.name for f in FAMILIES)
        raise InputError(f"the config says family {str(named)[:40]!r}, which this moss-gguf "
                         f"does not speak (it speaks {names})", path=path,
                         hint="a newer moss-gguf may; or make the folder again")  # fmt: skip
    return found
