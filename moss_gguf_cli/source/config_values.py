"""Values read from a checkpoint's config.json, each checked against the range its runtime
accepts before anything is built from it.

A config is untrusted input: a count becomes names, shapes and allocations; an epsilon or a
rope base reaches a ggml assertion (`eps >= 0`) that kills the process holding every request.
So every number a family reads goes through one of these, which refuse in one line naming
the key. Each family says its own bounds (nano/config.py, source/checkpoint.py); these are
the shared forms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

MOST_ID = (1 << 31) - 1  # token ids travel as int32
# Bounds far above any MOSS model (the 8B: 36 layers of 4096, 32 codebooks of 1024, a
# vocabulary of 155k; Realtime 28 + 4 layers; Nano 12 + 1 of 768) that keep a hostile count
# from becoming gigabytes of names and shapes before a tensor is read; whether a count agrees
# with the weights is checked when they are read. Every family's config reader uses them.
MOST_LAYERS = 1024
MOST_CODEBOOKS = 256
MOST_WIDTH = 1 << 16  # hidden size, heads, head size
MOST_ROWS = 1 << 24  # vocabularies, the feed-forward width, a codebook, positions


def counts_agree(counts: Iterable[tuple[str, int, str, str]], names: Iterable[str], path: Path,
                 hint: str) -> None:  # fmt: skip
    """Each (key, count the config says, tensor name prefix, what they are) borne out by the
    weights NAMES: a count the weights do not bear out is named before anything is built."""
    names = list(names)
    for key, said, prefix, what in counts:
        held = {name[len(prefix):].split(".", 1)[0] for name in names if name.startswith(prefix)}
        if said != len(held):
            raise InputError(f"config.json's {key} is {said} but the weights hold {len(held)} "
                             f"{what}", path=path, hint=hint)  # fmt: skip


def _number(value: Any) -> bool:
    # an int is finite however long (math.isfinite(10**400) would overflow converting it)
    return not isinstance(value, bool) and (isinstance(value, int) or
                                            isinstance(value, float) and math.isfinite(value))


@dataclass(frozen=True)
class ConfigValues:
    """The checks of one config file: PATH is named in every refusal, MODEL in a bound's."""

    path: Path
    model: str  # "MOSS-TTS-Nano": what no real value exceeds
    hint: str

    def positive(self, value: Any, name: str, most: int) -> int:
        """A whole number from 1 to MOST."""
        if not _number(value) or int(value) != value or int(value) <= 0:
            raise InputError(f"config.json's {name} is {_short(value)}, not a positive integer",
                             path=self.path, hint=self.hint)  # fmt: skip
        if value > most:
            raise InputError(f"config.json's {name} is {_whole(value)}, more than any {self.model} "
                             f"has (at most {most} here)", path=self.path,
                             hint=self.hint)  # fmt: skip
        return int(value)

    def token(self, value: Any, name: str, below: int = MOST_ID + 1) -> int:
        """An id: a whole number from 0 to BELOW - 1 (an int32 where no table bounds it)."""
        if not _number(value) or int(value) != value or not 0 <= value <= MOST_ID:
            raise InputError(f"config.json's {name} is {_short(value)}, not a token id (a whole "
                             f"number from 0 to {MOST_ID})", path=self.path,
                             hint=self.hint)  # fmt: skip
        if value >= below:
            raise InputError(f"config.json's {name} {int(value)} is outside the table of "
                             f"{below} rows it indexes", path=self.path,
                             hint=self.hint)  # fmt: skip
        return int(value)

    def real(self, value: Any, name: str, low: float, high: float) -> float:
        """A number strictly between LOW and HIGH: what ggml accepts without an assertion."""
        if not _number(value) or not low < value < high:
            raise InputError(f"config.json's {name} is {_short(value)}, not a number between "
                             f"{low:g} and {high:g}", path=self.path, hint=self.hint)  # fmt: skip
        return float(value)


def _whole(value: int | float) -> str:
    if value < 10**15:
        return f"{int(value)}"
    return f"{value:g}" if isinstance(value, float) else f"a number of {len(str(value))} digits"


def _short(value: Any) -> str:
    # a value from a file: a 10 MB string must not become a 10 MB message
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
