"""`all` on a MOSS-TTS-Realtime checkpoint: which inputs are Realtime, where its files come
from, and the Realtime folder written (realtime/folder.py) and verified (removed when it fails).

Realtime is told from its config.json for a local folder (config.is_realtime); a Hub id is
Realtime when its name is (`OpenMOSS-Team/MOSS-TTS-Realtime`; the config is checked once
downloaded); the builtin is `builtin:tiny-realtime`. Its codec is the delay family's
24 kHz MOSS-Audio-Tokenizer (the first 16 codebooks), resolved as the delay family resolves it.
Options that mean nothing for Realtime are refused in one line before any download.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UsageError
from ..gguf.first_class import FORMAT as DELAY_FORMAT
from ..hold_points import hold
from ..pipeline.first_class import parse_formats
from ..pipeline.made_from import MadeFrom, file_sha256, source_identity
from ..pipeline.route import AllRequest
from ..pipeline.steps import AllSettings
from ..pipeline.summary import FolderSummary, part_sizes, verified_folder
from ..pipeline.verify_failure import Written, removed_if_verify_fails, require_pass
from ..progress import ProgressReporter, ensure
from ..quantize.engines import Engine, parse_engine
from ..quantize.llama import QuantizeSettings
from ..source.audio_tokenizer import resolve as resolve_codec
from ..source.checkpoint import BUILTIN_PREFIX, HUB_PATTERNS
from ..source.family_input import claims_model, local_model
from ..verify import VerifyReport
from .checkpoint import is_realtime_folder, open_realtime
from .config import TITLE
from .folder import RealtimeFolder, RealtimeRequest, write_realtime_folder
from .layout import CODEC_DIR, DEFAULT_FILE_TYPE, FORMAT
from .tiny import NAME as TINY_REALTIME
from .tiny import ensure_tiny_realtime
from .verify import verify_realtime

BUILTIN = f"{BUILTIN_PREFIX}{TINY_REALTIME}"
_HUB_NAME = "moss-tts-realtime"


def is_realtime_input(model: str) -> bool:
    """Whether --model is a MOSS-TTS-Realtime checkpoint (looked at without downloading)."""
    return claims_model(model, BUILTIN, is_realtime_folder, _HUB_NAME)


@dataclass
class RealtimeRun:
    folder: RealtimeFolder
    report: VerifyReport

    def summary(self) -> FolderSummary:
        folder, counts = self.folder, self.report.counts
        config = folder.configs[0]
        parts = [*[g.name for g in folder.ggufs], "tokenizer.json", f"{CODEC_DIR}/"]
        return verified_folder(folder.output, TITLE, part_sizes(folder.files, parts), counts,
                               config, folder.notes)  # fmt: skip


def convert_realtime(request: AllRequest, progress: ProgressReporter | None = None
                     ) -> FolderSummary:  # fmt: skip
    """`all` on a Realtime input (the family's convert, families/realtime.py)."""
    for given, option in ((request.audio_tables, "--audio-tables-type"),
                          (request.base_model, "--base-model")):  # the delay family's model card
        if given is not None:
            raise UsageError(f"{option} does not apply to {TITLE}",
                             hint="leave it out: a Realtime folder records what it was made "
                             "from")  # fmt: skip
    settings = check_settings(request.settings, parse_formats(request.formats),
                              request.default_types)  # fmt: skip
    return run_realtime(settings, progress).summary()


def check_settings(settings: AllSettings, formats: list[str], default_types: bool) -> AllSettings:
    """SETTINGS with Realtime's default file type; one line for an option it has no use for."""
    refused = [
        (DELAY_FORMAT in formats, f"--format {DELAY_FORMAT}"),
        (settings.native_codec is not None, "--pytorch-audio-tokenizer"),
        (settings.outtype not in ("auto", "f32", "bf16"), f"--outtype {settings.outtype}"),
        (settings.keep_intermediate, "--keep-intermediate"),
        (bool(settings.synth), "a recipe's synth settings"),
        (bool(settings.merge_lora), "--merge-lora"),
    ]
    for bad, option in refused:
        if bad:
            raise UsageError(f"{option} does not apply to {TITLE}",
                             hint="leave it out: the Realtime folder is one format, its "
                             "backbone quantized by llama.cpp")  # fmt: skip
    if parse_engine(settings.engine) is Engine.DIRECT:
        raise UsageError("the direct engine reads delay checkpoints only",
                         hint="leave --engine out, or choose binary or library")  # fmt: skip
    if default_types:
        settings = replace(settings, file_types=[DEFAULT_FILE_TYPE])
    return settings


def run_realtime(settings: AllSettings, progress: ProgressReporter | None = None) -> RealtimeRun:
    """The Realtime folder at settings.output, then verify's rows on it; a failing row
    removes the folder (VerifyFailed, verify_failure.py)."""
    bar = ensure(progress)
    source = resolve_realtime(settings, bar)
    checkpoint = open_realtime(source)
    builtin = settings.model == BUILTIN
    codec = resolve_codec(settings.audio_tokenizer, builtin=builtin,
                          revision=settings.audio_tokenizer_revision,
                          cache_dir=settings.cache_dir, progress=bar)  # fmt: skip
    codec_spec = None if codec is None else codec.source or str(codec.folder)
    made = MadeFrom(source_identity(settings.model, source), outtype="bf16", codec=codec_spec,
                    imatrix=file_sha256(settings.imatrix), format=FORMAT)  # fmt: skip
    request = RealtimeRequest(
        file_types=settings.file_types,
        quantize=QuantizeSettings(engine=parse_engine(settings.engine),
                                  llama_cpp=settings.llama_cpp, imatrix=settings.imatrix,
                                  threads=settings.threads),
        made_from=made.to_json(), source_model=settings.model, codec_source=codec_spec,
        force=settings.force,
    )  # fmt: skip
    written = write_realtime_folder(checkpoint, codec, Path(settings.output), request, bar)
    hold("verify")  # the folder complete, before its checks (hold_points.py)
    with removed_if_verify_fails(Written(written.output)):
        report = verify_realtime(written.output, str(source), deep=False)
        require_pass(written.output, report.rows)
    return RealtimeRun(written, report)


def resolve_realtime(settings: AllSettings, bar: ProgressReporter) -> Path:
    """A local folder for the model: the builtin, the folder itself, or a Hub snapshot."""
    return local_model(settings.model, BUILTIN, ensure_tiny_realtime, settings.revision,
                       settings.cache_dir, HUB_PATTERNS, bar)  # fmt: skip
