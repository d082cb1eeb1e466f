"""The delay family (MOSS-TTS, MOSS-TTSD, MOSS-VoiceGenerator, MOSS-SoundEffect): its entry in
the registry. It claims every input, folder and config the others do not: its own readers
then refuse a look-alike in one line naming what it is (source/checkpoint.detect_lookalike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..delay.synth import synth_delay
from ..disk.layout_names import CONFIG_NAME
from ..gguf.first_class import FORMAT
from ..pipeline.route import run_request
from ..source.audio_tokenizer import DEFAULT_REPO as CODEC_REPO
from ..verify import verify
from .family import Family


def _anything(_: Any) -> bool:
    return True


def _serve(settings: Any) -> Any:
    # lazy: the serve extra (fastapi, uvicorn) is imported by `serve` alone
    from ..delay.serving import serve_delay

    return serve_delay(settings)


def _verify(target: Path, source: str | None, deep: bool, progress: Any = None,
            record: Any = None) -> Any:  # fmt: skip
    return verify(target, source=source, deep=deep, progress=progress, record=record)


DELAY = Family(
    name=FORMAT,
    title="MOSS-TTS",
    builtin="builtin:tiny",
    synth_config=CONFIG_NAME,
    audio_tokenizer=CODEC_REPO,
    claims_input=_anything,
    claims_folder=_anything,
    convert=run_request,
    verify=_verify,
    # it checks the options that need no file first (a wrong --language is said before a
    # missing config), then reads the YAML
    synth=synth_delay,
    serve=_serve,
)
