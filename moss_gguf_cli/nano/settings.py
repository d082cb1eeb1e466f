"""How a Nano request is spoken: upstream's running defaults (its runtime's `synthesize`:
text temperature 1.0, top-p 1.0, top-k 50; audio temperature 0.8, top-p 0.95, top-k 25,
repetition penalty 1.2 over the codes a codebook has produced), which the folder's YAML
carries and a request overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..tts.sampling import PENALTY_RANGE, TEMPERATURE_MAX, TOP_K_MAX

DEFAULT_N_CTX = 2048


@dataclass(frozen=True)
class NanoSettings:
    """How one request is spoken; upstream's running defaults (its runtime's `synthesize`)."""

    max_new_tokens: int = 375  # frames per chunk: 30 s at 12.5 frames a second
    min_new_tokens: int = 0  # the stop is masked before this many frames
    text_temperature: float = 1.0
    text_top_p: float = 1.0
    text_top_k: int = 50
    audio_temperature: float = 0.8
    audio_top_p: float = 0.95
    audio_top_k: int = 25
    audio_repetition_penalty: float = 1.2
    seed: int | None = None

    def override(self, **values: Any) -> NanoSettings:
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def check(self) -> None:
        if self.max_new_tokens < 1 or self.min_new_tokens < 0:
            raise UsageError("max_new_tokens must be 1 or more and min_new_tokens 0 or more")
        if self.min_new_tokens > self.max_new_tokens:
            raise UsageError(f"min_new_tokens {self.min_new_tokens} is above max_new_tokens "
                             f"{self.max_new_tokens}")  # fmt: skip
        # the server's ranges (serve/schemas.py): inside them the frame graph's float32
        # sampling cannot overflow (nano/ggml_local.py)
        for kind in ("text", "audio"):
            self._within(f"{kind}_temperature", 0.0, TEMPERATURE_MAX)
            self._within(f"{kind}_top_k", 0, TOP_K_MAX)
            top_p = getattr(self, f"{kind}_top_p")
            if not 0.0 < top_p <= 1.0:
                raise UsageError(f"{kind}_top_p must be in (0, 1], got {top_p}")
        self._within("audio_repetition_penalty", *PENALTY_RANGE)

    def _within(self, key: str, low: float, high: float) -> None:
        value = getattr(self, key)
        if not low <= value <= high:  # NaN too
            raise UsageError(f"{key} must be from {low:g} to {high:g}, got {value}")


SETTING_KEYS = tuple(f.name for f in dataclasses.fields(NanoSettings) if f.name != "seed")
