"""`serve` for the delay family (MOSS-TTS, MOSS-TTSD, MOSS-VoiceGenerator, MOSS-SoundEffect):
its folder loaded into the one serve core, and its requests built from OpenAI's fields (the
language, MOSS-TTSD's voice per speaker, LoRA adapters)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..serve.api_errors import ApiError
from ..serve.output import MonoOut
from ..serve.routes import Service
from ..serve.schemas import SpeechRequest
from ..serve.server import Served, open_service
from ..serve.settings import DEFAULT_VOICE, OPENAI_VOICES, ServeSettings
from . import Speaker, SynthConfig, Synthesizer
from .adapters import request_lora
from .engine import EngineSettings
from .language import language_name, languages
from .prompt import SPEAKER_TAG
from .stepper import DelayJob, DelayStepper


def serve_delay(settings: ServeSettings) -> Served:
    """A delay family's folder (its config read now, loaded after the bind), --lora adapters
    applied."""
    config = replace(SynthConfig.from_yaml(settings.config), lora=settings.lora)
    return Served(Path(config.backbone_gguf).name, lambda: _load(settings, config))


def _load(settings: ServeSettings, config: SynthConfig) -> Service:
    tts = Synthesizer(config, max_batch=settings.max_batch,
                      settings=EngineSettings(width=settings.batch_width))  # fmt: skip
    try:
        created = int(Path(config.backbone_gguf).stat().st_mtime)
    except BaseException:
        tts.close()
        raise
    stepper = DelayStepper(tts, settings.runaway_retries)
    return open_service(settings, stepper, created, model_id=tts.info.variant.lower(),
                        job_for=DelayRequests(tts), out=MonoOut(tts.info.sampling_rate),
                        languages=_languages, lora=tuple(sorted(tts.adapters)))  # fmt: skip


def _languages() -> list[dict[str, Any]]:
    return [x.to_dict() for x in languages()]


class DelayRequests:
    """The delay family's request builder (routes.Service.job_for): a request's fields as a
    DelayJob, each checked against what TTS serves."""

    def __init__(self, tts: Synthesizer):
        self.variant, self.adapters = tts.info.variant, tts.adapters

    def __call__(self, service: Service, body: SpeechRequest) -> DelayJob:
        if body.min_new_tokens is not None:
            raise ApiError(400, "min_new_tokens is MOSS-TTS-Nano's; this model ends its "
                           "speech on its own", param="min_new_tokens",
                           code="unsupported_value")  # fmt: skip
        try:
            language = language_name(body.language)
        except InputError as exc:
            hint = f" ({exc.hint})" if exc.hint else ""
            raise ApiError(400, exc.message + hint, param="language",
                           code="invalid_value") from None  # fmt: skip
        codes, speakers = None, self.dialogue_voices(service, body)
        custom = body.voice_name != DEFAULT_VOICE and body.voice_name not in OPENAI_VOICES
        if custom and not speakers:
            codes = service.voices.load(body.voice_name).codes
        return DelayJob(
            text=body.input,
            reference_codes=codes,
            instruction=body.instructions or None,
            seed=body.seed,
            max_new_tokens=body.max_new_tokens,
            sampling=body.sampling(),
            language=language,
            speakers=speakers,
            lora=request_lora(body.lora, self.adapters),
        )

    def dialogue_voices(self, service: Service, body: SpeechRequest) -> list[Speaker] | None:
        """MOSS-TTSD: the stored voices, one per speaker in order, each with what its clip
        says (a `voice` alone is speaker S1); None for the other models, which take `voice`."""
        variant = self.variant
        if variant != "MOSS-TTSD":
            if body.voices is not None:
                raise ApiError(400, f"voices (one per speaker) is for MOSS-TTSD dialogues; "
                               f"this server speaks {variant}: send one voice",
                               param="voices", code="invalid_value")  # fmt: skip
            return None
        if not SPEAKER_TAG.search(body.input):
            raise ApiError(400, "input is a MOSS-TTSD dialogue and needs speaker tags: "
                           "[S1] Hello. [S2] Hi!", param="input", code="invalid_value")  # fmt: skip
        names, param = body.voices, "voices"
        if names is None:
            if body.voice_name == DEFAULT_VOICE or body.voice_name in OPENAI_VOICES:
                return None  # a dialogue in voices of the model's choosing
            names, param = [body.voice_name], "voice"
        speakers = []
        for number, name in enumerate(names, start=1):
            voice = service.voices.load(name, param=param)
            if not voice.text:
                raise ApiError(400, f"voice {name!r} (speaker S{number}) has no transcript; "
                               "register it again with the form field text: what the clip says",
                               param=param, code="invalid_value")  # fmt: skip
            speakers.append(Speaker(text=voice.text, codes=voice.codes))
        return speakers
