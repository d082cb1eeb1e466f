"""MOSS-TTS-Nano's entry in the registry (its room: nano/; docs/nano.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..nano.codec_folder import DEFAULT_REPO as CODEC_REPO
from ..nano.config import FAMILY_NAME
from ..nano.convert import BUILTIN, convert_nano, is_nano_input
from ..nano.layout import CONFIG_NAME
from ..nano.synth import synth_options
from ..nano.verify import nano_manifest, verify_nano
from .family import Family


def _claims_folder(path: Path) -> bool:
    return nano_manifest(Path(path).expanduser()) is not None


def _verify(target: Path, source: str | None, deep: bool, progress: Any = None,
            record: Any = None) -> Any:  # fmt: skip
    return verify_nano(Path(target), source, deep)  # its rows read the folder whole: no record


def _serve(settings: Any) -> Any:
    # lazy: the serve extra (fastapi, uvicorn) is imported by `serve` alone
    from ..nano.serving import serve_nano

    return serve_nano(settings)


NANO = Family(
    name=FAMILY_NAME,
    title="MOSS-TTS-Nano",
    builtin=BUILTIN,
    synth_config=CONFIG_NAME,
    audio_tokenizer=CODEC_REPO,
    claims_input=is_nano_input,
    claims_folder=_claims_folder,
    convert=convert_nano,
    verify=_verify,
    synth=synth_options,
    serve=_serve,
    publishes=False,  # `push` publishes the delay family's folders only, for now
)
