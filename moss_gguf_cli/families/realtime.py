"""MOSS-TTS-Realtime's entry in the registry (its room: realtime/; docs/realtime.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..realtime.config import FAMILY_NAME, TITLE
from ..realtime.convert import BUILTIN, convert_realtime, is_realtime_input
from ..realtime.layout import CONFIG_NAME
from ..realtime.synth import synth_options
from ..realtime.verify import realtime_manifest, verify_realtime
from ..source.audio_tokenizer import DEFAULT_REPO as CODEC_REPO
from .family import Family


def _claims_folder(path: Path) -> bool:
    return realtime_manifest(Path(path).expanduser()) is not None


def _verify(target: Path, source: str | None, deep: bool, progress: Any = None,
            record: Any = None) -> Any:  # fmt: skip
    return verify_realtime(Path(target), source, deep)


def _serve(settings: Any) -> Any:
    # lazy: the serve extra (fastapi, uvicorn) is imported by `serve` alone
    from ..realtime.serving import serve_realtime

    return serve_realtime(settings)


REALTIME = Family(
    name=FAMILY_NAME,
    title=TITLE,
    builtin=BUILTIN,
    synth_config=CONFIG_NAME,
    audio_tokenizer=CODEC_REPO,
    claims_input=is_realtime_input,
    claims_folder=_claims_folder,
    convert=convert_realtime,
    verify=_verify,
    synth=synth_options,
    serve=_serve,
    publishes=False,
)
