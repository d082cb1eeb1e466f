"""What a failed job answers: a core error as OpenAI's error object, in the API's words.

The request's own mistakes are 4xx naming the field to change (`param`); anything else is the
server's fault, a 500 whose details go to the log only: no server path, option of the command
line or exception name reaches a client. A family's own errors (a prompt longer than the
context, …) are answered by its stepper's `explain`, which the core hands in: this module
knows no family.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import InputError, MossGgufError, is_debug
from ..tts.sampling import GREEDY_BELOW, PENALTY_RANGE, TEMPERATURE_MAX, SamplingError
from .api_errors import ApiError, ShuttingDown

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """The job is no longer wanted (its client left, the server is stopping or stalled)."""


Explain = Callable[[BaseException, Any], ApiError | None]


def api_error(exc: BaseException, kind: str, job: Any = None,
              explain: Explain | None = None) -> ApiError:  # fmt: skip
    """The answer to a KIND job ("speech", "voice") that failed with EXC; JOB: what the
    request asked for; EXPLAIN: the family's answers to its own errors (Stepper.explain)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Cancelled):
        log.info("a %s request was cancelled at a generation step", kind)
        return ShuttingDown()  # whoever is still listening: the server stops
    if isinstance(exc, SamplingError):
        return ApiError(400, f"{exc.setting} {exc.value!r} leaves nothing to sample from; "
                        f"use {_range(exc.setting)}", param=exc.setting,
                        code="invalid_value")  # fmt: skip
    if explain is not None and (own := explain(exc, job)) is not None:
        return own
    if isinstance(exc, InputError):
        param = "file" if kind == "voice" else "input"
        return ApiError(400, f"{exc.message}; check {param}", param=param, code="invalid_value")
    if isinstance(exc, MossGgufError):
        log.error("a %s request failed: %s", kind, exc.one_line(), exc_info=is_debug())
        return ApiError(500, f"the {kind} request failed on the server: {exc.message}",
                        code="synthesis_failed")  # fmt: skip
    log.error("unexpected %s in a %s request: %s (MOSS_GGUF_DEBUG=1 shows where)",
              type(exc).__name__, kind, exc, exc_info=is_debug())  # fmt: skip
    return ApiError(500, f"the {kind} request failed on the server; its log says why",
                    code="internal_error")  # fmt: skip


def _range(setting: str) -> str:
    if setting.endswith("temperature"):
        return f"0 (greedy; below {GREEDY_BELOW:g} counts as 0) to {TEMPERATURE_MAX:g}"
    return f"{PENALTY_RANGE[0]:g} to {PENALTY_RANGE[1]:g} (1 is off)"
