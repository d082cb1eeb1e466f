"""The JSON body of POST /v1/audio/speech: OpenAI's fields, then MOSS's own.

MOSS's fields are named as the synth YAML's keys (clients send them through the `openai`
client's `extra_body`); temperature 0 is greedy. Unknown fields are refused (400 naming the
field), as OpenAI refuses them: a misspelt `audio_temprature` must not be silently ignored.
A validation error becomes one ApiError naming the field (validation_error); a body that is
not a JSON object is one naming no field (parse_speech). The ranges are docs/serve-limits.md's:
wherever they allow, the arithmetic of sampling stays finite.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..tts.sampling import PENALTY_RANGE, SAMPLING_KEYS, TEMPERATURE_MAX, TOP_K_MAX
from .api_errors import ApiError
from .audio import SPEED_RANGE
from .settings import DEFAULT_VOICE, MAX_NAME_CHARS

MAX_SPEAKERS = 16  # more turns than MOSS-TTSD's speaker tags ever name
MAX_NEW_TOKENS = 1 << 20  # beyond any context: the server's n_ctx bounds it further
TEMPERATURE = {"ge": 0, "le": TEMPERATURE_MAX}
MAX_ADAPTERS = 8  # stacked in one request
LoraScale = Annotated[float, Field(ge=-16, le=16)]
PENALTY = {"ge": PENALTY_RANGE[0], "le": PENALTY_RANGE[1]}


class VoiceId(BaseModel):
    """OpenAI's form for a custom voice: {"id": NAME}."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(max_length=MAX_NAME_CHARS)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=MAX_NAME_CHARS)
    input: str  # its limit is checked by the route (413 naming it); the body's bounds it here
    voice: Annotated[str, Field(max_length=MAX_NAME_CHARS)] | VoiceId = DEFAULT_VOICE
    instructions: str | None = None  # as input
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1])
    stream_format: Literal["audio", "sse"] | None = None
    # MOSS: the synth YAML's keys
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    max_new_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    # MOSS-TTS-Nano: frames before the model may stop (random weights stop at once)
    min_new_tokens: int | None = Field(None, ge=0, le=MAX_NEW_TOKENS)
    text_temperature: float | None = Field(None, **TEMPERATURE)
    text_top_p: float | None = Field(None, gt=0, le=1)
    text_top_k: int | None = Field(None, ge=0, le=TOP_K_MAX)
    audio_temperature: float | None = Field(None, **TEMPERATURE)
    audio_top_p: float | None = Field(None, gt=0, le=1)
    audio_top_k: int | None = Field(None, ge=0, le=TOP_K_MAX)
    audio_repetition_penalty: float | None = Field(None, **PENALTY)
    # MOSS: text rules (docs/text-rules.md)
    # a name or code of GET /v1/audio/languages; auto: none
    language: str | None = Field(None, max_length=MAX_NAME_CHARS)
    # MOSS-TTSD: a stored voice per speaker
    voices: list[Annotated[str, Field(max_length=MAX_NAME_CHARS)]] | None = Field(
        None, min_length=1, max_length=MAX_SPEAKERS
    )
    # MOSS: LoRA adapters the server loaded (serve --lora NAME=FILE), by name → scale
    lora: dict[Annotated[str, Field(max_length=MAX_NAME_CHARS)], LoraScale] | None = Field(
        None, max_length=MAX_ADAPTERS
    )

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice

    def sampling(self) -> dict[str, float]:
        """The sampling keys the request set (the config's values stand for the rest)."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k) is not None}


EXAMPLE = '{"model": "moss-tts", "input": "Hello", "voice": "default"}'


def parse_speech(raw: bytes) -> SpeechRequest:
    """The request in RAW (the whole body), or the ApiError saying what to change."""
    if not raw.strip():
        raise ApiError(400, f"the body is empty; send a JSON object such as {EXAMPLE}",
                       code="empty_body")  # fmt: skip
    try:
        return SpeechRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
    if errors and "number out of range" in errors[0].get("msg", ""):
        # a number too long for the JSON parser: parsed again to name the field it is in
        try:
            return SpeechRequest.model_validate(json.loads(raw, parse_int=_int))
        except ValidationError as exc:
            errors = exc.errors()
        except (ValueError, RecursionError):
            pass
    raise validation_error(errors)


def _int(text: str) -> int | float:
    """A JSON integer; one of more than 40 digits as ±inf (no field takes it: it is named)."""
    if len(text) <= 40:
        return int(text)
    return float("-inf") if text.startswith("-") else float("inf")


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """pydantic's first complaint as one message naming the field and what it takes."""
    if not errors:
        return ApiError(400, "the request is not valid", code="invalid_request")
    first = errors[0]
    if len(errors) > 1 and first.get("loc", ())[:1] == errors[1].get("loc", ())[:1]:
        # a union (voice: a name or {"id": NAME}): the complaint about the form it has
        first = next((e for e in errors if not e.get("type", "").endswith("_type")), first)
    kind = first.get("type", "")
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    if kind == "json_invalid" or (loc and loc[0].isdigit()):
        why = first.get("msg", "").removeprefix("Invalid JSON: ")
        return ApiError(400, f"the body is not valid JSON in UTF-8 ({why}); send a JSON "
                        f"object such as {EXAMPLE}", code="invalid_json")  # fmt: skip
    if not loc:
        return ApiError(400, f"the body must be a JSON object such as {EXAMPLE}",
                        code="invalid_json")  # fmt: skip
    field = ".".join(p for p in loc if p not in ("str", "constrained-str", "VoiceId")) or None
    param = loc[0] if loc else None  # the top-level field, as OpenAI names it
    if kind == "extra_forbidden":
        message = (
            f"unknown field {field!r}; the fields are OpenAI's (model, input, voice, "
            "instructions, response_format, speed) and seed, max_new_tokens, language, voices, "
            "lora "
            f"and the synth YAML's sampling keys ({', '.join(SAMPLING_KEYS)})"
        )
    elif kind == "missing":
        message = f"{field} is required"
    else:
        message = f"{field or 'the request body'}: {first.get('msg', 'invalid value')}"
        if field and "input" in first:
            message += f" (got {repr(first['input'])[:60]})"
    return ApiError(400, message, param=param, code="invalid_value" if param else None)
