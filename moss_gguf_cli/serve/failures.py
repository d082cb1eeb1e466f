"""What a failed job answers: a core error as OpenAI's error object, in the API's words.

The request's own mistakes are 4xx naming the field to change (`param`); anything else is the
server's fault, a 500 whose details go to the log only: no server path, option of the command
line or exception name reaches a client.
"""

from __future__ import annotations

import logging

from ..errors import InputError, MossGgufError, is_debug
from ..nano.engine import ContextTooShort
from ..tts.sampling import GREEDY_BELOW, PENALTY_RANGE, TEMPERATURE_MAX, SamplingError
from ..tts.synthesizer import NoFrames, PromptTooLong
from .api_errors import ApiError, ShuttingDown

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """The job is no longer wanted (its client left, the server is stopping or stalled)."""


def api_error(exc: BaseException, kind: str, job=None) -> ApiError:
    """The answer to a KIND job ("speech", "voice") that failed with EXC; JOB: the SpeechJob."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Cancelled):
        log.info("a %s request was cancelled at a generation step", kind)
        return ShuttingDown()  # whoever is still listening: the server stops
    if isinstance(exc, SamplingError):
        return ApiError(400, f"{exc.setting} {exc.value!r} leaves nothing to sample from; "
                        f"use {_range(exc.setting)}", param=exc.setting,
                        code="invalid_value")  # fmt: skip
    if isinstance(exc, PromptTooLong):
        return ApiError(400, f"input, instructions and voice together take {exc.rows} "
                        f"positions, this server holds {exc.n_ctx}; shorten input (or "
                        "instructions, or use a shorter voice)", param="input",
                        code="input_too_long")  # fmt: skip
    if isinstance(exc, ContextTooShort):
        return _context_too_short(exc)
    if isinstance(exc, NoFrames) and job is not None and job.max_new_tokens is not None:
        return ApiError(400, f"max_new_tokens {job.max_new_tokens} ended the speech before its "
                        "first complete audio frame; raise max_new_tokens or leave it out",
                        param="max_new_tokens", code="invalid_value")  # fmt: skip
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


def _context_too_short(exc: ContextTooShort) -> ApiError:
    """A Nano request longer than the server's context, refused before its first frame: the
    field to change (the server's n_ctx is not the client's)."""
    where = "input" if exc.chunks == 1 else f"chunk {exc.chunk} of {exc.chunks} of input"
    fix = exc.advice(more_ctx=None, shorter="use a shorter voice") or "shorten input"
    param = "max_new_tokens" if exc.room >= 1 else "voice" if exc.reference_frames else "input"
    return ApiError(400, f"{where} needs {exc.needed:,} positions (its prompt {exc.prompt:,} + "
                    f"max_new_tokens {exc.max_new_tokens:,} - 1), this server holds "
                    f"{exc.n_ctx:,}; {fix}", param=param,
                    code="context_length_exceeded")  # fmt: skip


def _range(setting: str) -> str:
    if setting.endswith("temperature"):
        return f"0 (greedy; below {GREEDY_BELOW:g} counts as 0) to {TEMPERATURE_MAX:g}"
    return f"{PENALTY_RANGE[0]:g} to {PENALTY_RANGE[1]:g} (1 is off)"
