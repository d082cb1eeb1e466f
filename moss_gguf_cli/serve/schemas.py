"""The JSON body of POST /v1/audio/speech: OpenAI's fields, then MOSS's own.

MOSS's fields are named as the synth YAML's keys (clients send them through the `openai`
client's `extra_body`); temperature 0 is greedy. Unknown fields are refused (400 naming the
field), as OpenAI refuses them: a misspelt `audio_temprature` must not be silently ignored.
A validation error becomes one ApiError naming the field (validation_error).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..tts.config import SAMPLING_KEYS
from .api_errors import ApiError
from .audio import SPEED_RANGE
from .settings import DEFAULT_VOICE


class VoiceId(BaseModel):
    """OpenAI's form for a custom voice: {"id": NAME}."""

    model_config = ConfigDict(extra="forbid")

    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    input: str
    voice: str | VoiceId = DEFAULT_VOICE
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1])
    stream_format: Literal["audio", "sse"] | None = None
    # MOSS: the synth YAML's keys
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    max_new_tokens: int | None = Field(None, ge=1)
    text_temperature: float | None = Field(None, ge=0)
    text_top_p: float | None = Field(None, gt=0, le=1)
    text_top_k: int | None = Field(None, ge=0)
    audio_temperature: float | None = Field(None, ge=0)
    audio_top_p: float | None = Field(None, gt=0, le=1)
    audio_top_k: int | None = Field(None, ge=0)
    audio_repetition_penalty: float | None = Field(None, gt=0)
    # MOSS: text rules (docs/text-rules.md)
    language: str | None = None  # a name or code of GET /v1/audio/languages; auto: none
    voices: list[str] | None = Field(None, min_length=1)  # MOSS-TTSD: a voice per speaker

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice

    def sampling(self) -> dict[str, float]:
        """The sampling keys the request set (the config's values stand for the rest)."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k) is not None}


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """pydantic's first complaint as one message naming the field and what it takes."""
    if not errors:
        return ApiError(400, "the request is not valid", code="invalid_request")
    first = errors[0]
    kind = first.get("type", "")
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    if kind == "json_invalid" or (loc and loc[0].isdigit()):
        return ApiError(
            400,
            f"the body is not valid JSON ({first.get('msg', '')}); send a JSON object such "
            'as {"model": "moss-tts", "input": "Hello", "voice": "default"}',
            code="invalid_json",
        )
    field = ".".join(loc) or None
    param = loc[0] if loc else None  # the top-level field, as OpenAI names it
    if kind == "extra_forbidden":
        message = (
            f"unknown field {field!r}; the fields are OpenAI's (model, input, voice, "
            "instructions, response_format, speed) and seed, max_new_tokens, language, voices "
            f"and the synth YAML's sampling keys ({', '.join(SAMPLING_KEYS)})"
        )
    elif kind == "missing":
        message = f"{field} is required"
    else:
        message = f"{field or 'the request body'}: {first.get('msg', 'invalid value')}"
        if field and "input" in first:
            message += f" (got {repr(first['input'])[:60]})"
    return ApiError(400, message, param=param, code="invalid_value" if param else None)
