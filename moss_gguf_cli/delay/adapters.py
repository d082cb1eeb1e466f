"""LoRA adapters on the server (`serve --lora NAME=FILE`, a request's `"lora": {NAME: scale}`).

llama.cpp applies one adapter set to a whole context, so to every sequence of a decode:
requests with different sets never share a batch. The worker serves one set at a time: a
waiting request whose set differs from the one applied is admitted only once nothing runs
(the queue stays in order, so no set starves), and the set is then switched; switching drops
the engine's kept prefix (delay/synthesizer.py `use_adapters`), and every request prefills its
own sequence, so no KV made under one set is read under another. A scale of 0 is no adapter.
"""

from __future__ import annotations

from typing import Any

from ..serve.api_errors import ApiError
from . import Synthesizer

LoraKey = tuple[tuple[str, float], ...]


def lora_key(scales: dict[str, float] | None) -> LoraKey:
    """The set a request asks for, as the worker compares sets (zero scales left out)."""
    return tuple(sorted((n, float(s)) for n, s in (scales or {}).items() if s != 0))


def request_lora(scales: dict[str, float] | None, loaded: dict[str, Any]) -> dict[str, float]:
    """A request's `lora` field checked against the adapters the server loaded."""
    for name in scales or {}:
        if name not in loaded:
            served = ", ".join(sorted(loaded)) or "none (serve --lora NAME=FILE loads one)"
            raise ApiError(400, f"lora: no adapter named {name!r} is served here; served: "
                           f"{served} (GET /v1/models)", param="lora",
                           code="invalid_value")  # fmt: skip
    return dict(lora_key(scales))


class AdapterGate:
    """Which waiting speech job the worker may start now, by its adapter set."""

    def __init__(self, tts: Synthesizer):
        self.tts = tts
        self.current: LoraKey = ()

    def admits(self, scales: dict[str, float] | None, busy: bool) -> bool:
        """Whether a job asking for SCALES may join now; BUSY: something runs or was just
        admitted. An idle worker switches to the job's set."""
        key = lora_key(scales)
        if key == self.current:
            return True
        if busy:
            return False
        self.tts.use_adapters(dict(key))
        self.current = key
        return True
