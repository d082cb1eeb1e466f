"""`all` on a MOSS-TTS-Nano checkpoint: which inputs are Nano, where its files come from, and
the Nano folder written (nano/folder.py) and verified (removed when it fails).

Nano is told from its config.json for a local folder (nano/config.is_nano); a Hub id is Nano
when its name is MOSS-TTS-Nano's (`OpenMOSS-Team/MOSS-TTS-Nano-100M`; the config is checked
once downloaded), so the delay family's Hub path is not changed by an extra download; the
builtin is `builtin:tiny-nano`. Options that mean nothing for Nano are refused in one line
before any download.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import InputError, UsageError
from ..gguf.first_class import FORMAT as DELAY_FORMAT
from ..hold_points import hold
from ..pipeline.first_class import parse_formats
from ..pipeline.made_from import MadeFrom, source_identity
from ..pipeline.route import AllRequest
from ..pipeline.steps import AllSettings
from ..pipeline.summary import FolderSummary, part_sizes, verified_folder
from ..pipeline.verify_failure import Written, removed_if_verify_fails, require_pass
from ..progress import ProgressReporter, ensure
from ..quantize.engines import Engine, parse_engine
from ..quantize.llama import QuantizeSettings
from ..source.audio_tokenizer import FLAG as CODEC_FLAG
from ..source.audio_tokenizer import NONE
from ..source.checkpoint import BUILTIN_PREFIX, INDEX_NAME, SINGLE_NAME
from ..source.family_input import claims_model, local_model
from ..source.hub import check_files, download, is_repo_id, list_files
from ..verify import VerifyReport
from .checkpoint import TOKENIZER_NAME, TORCH_NAME, is_nano_folder, open_nano
from .codec_folder import DEFAULT_REPO as CODEC_REPO
from .codec_folder import HUB_PATTERNS as CODEC_PATTERNS
from .codec_folder import NanoCodec, open_nano_codec
from .folder import NanoFolder, NanoRequest, check_complete, write_nano_folder
from .layout import CONFIG_NAME, DEFAULT_FILE_TYPE, FORMAT
from .tiny import NAME as TINY_NANO
from .tiny import ensure_tiny_nano, ensure_tiny_nano_codec_folder
from .verify import verify_nano

BUILTIN = f"{BUILTIN_PREFIX}{TINY_NANO}"
HUB_PATTERNS = ["config.json", TORCH_NAME, SINGLE_NAME, INDEX_NAME, "model-*.safetensors",
                TOKENIZER_NAME, "tokenizer_config.json"]  # fmt: skip
_HUB_NAME = "moss-tts-nano"


def is_nano_input(model: str) -> bool:
    """Whether --model is a MOSS-TTS-Nano checkpoint (looked at without downloading)."""
    return claims_model(model, BUILTIN, is_nano_folder, _HUB_NAME)


@dataclass
class NanoRun:
    folder: NanoFolder
    report: VerifyReport
    notes: list[str] = field(default_factory=list)

    def summary(self) -> FolderSummary:
        """The folder's parts, verify's counts and how to speak it (a failing verify never
        gets here: the run removed the folder and raised)."""
        folder, counts = self.folder, self.report.counts
        parts = [*[g.name for g in folder.ggufs], "tables/", "local_transformer/",
                 TOKENIZER_NAME, "audio_tokenizer/"]  # fmt: skip
        config = folder.configs[0] if folder.configs else folder.output / CONFIG_NAME
        return verified_folder(folder.output, "MOSS-TTS-Nano", part_sizes(folder.files, parts),
                               counts, config, [*folder.notes, *self.notes])  # fmt: skip


def run_nano(
    settings: AllSettings,
    formats: list[str],
    default_types: bool,
    progress: ProgressReporter | None = None,
) -> NanoRun:
    """The Nano folder at settings.output from settings.model, then verify's rows on it; a
    failing row removes the folder (VerifyFailed, verify_failure.py)."""
    bar = ensure(progress)
    settings = check_nano_settings(settings, formats, default_types)
    folder = resolve_nano(settings, bar)
    checkpoint = open_nano(folder)
    check_complete(checkpoint)  # before the codec's download
    codec_spec = _codec_spec(settings)
    codec = resolve_nano_codec(codec_spec, settings, bar)
    made = MadeFrom(source_identity(settings.model, folder), outtype="f32", codec=codec_spec,
                    format=FORMAT)  # fmt: skip
    engine = parse_engine(settings.engine)
    request = NanoRequest(
        file_types=settings.file_types,
        quantize=QuantizeSettings(engine=engine, llama_cpp=settings.llama_cpp,
                                  imatrix=settings.imatrix, threads=settings.threads),
        made_from=made.to_json(), source_model=settings.model, codec_source=codec_spec,
        force=settings.force,
    )  # fmt: skip
    written = write_nano_folder(checkpoint, codec, Path(settings.output), request, bar)
    hold("verify")  # the folder complete, before its checks (hold_points.py)
    # the folder is always this run's (staged: an existing one is refused or, --force, replaced)
    with removed_if_verify_fails(Written(written.output)):
        report = verify_nano(written.output, str(folder), deep=False)
        require_pass(written.output, report.rows)
    return NanoRun(written, report)


def convert_nano(request: AllRequest, progress: ProgressReporter | None = None) -> FolderSummary:
    """`all` on a Nano input (the family's convert, families/nano.py): the request as asked,
    said as the CLI renders any family's folder."""
    for given, option in ((request.audio_tables, "--audio-tables-type"),
                          (request.base_model, "--base-model")):  # the delay family's model card
        if given is not None:
            raise UsageError(f"{option} does not apply to MOSS-TTS-Nano",
                             hint="leave it out: a Nano folder records what it was made from")
    return run_nano(request.settings, parse_formats(request.formats), request.default_types,
                    progress).summary()  # fmt: skip


def check_nano_settings(
    settings: AllSettings, formats: list[str], default_types: bool
) -> AllSettings:
    """SETTINGS with Nano's default file type; one line for an option Nano has no use for."""
    refused = [
        (DELAY_FORMAT in formats, f"--format {DELAY_FORMAT}"),
        (settings.native_codec is not None, "--pytorch-audio-tokenizer"),
        (settings.outtype not in ("auto", "f32"), f"--outtype {settings.outtype}"),
        (settings.keep_intermediate, "--keep-intermediate"),
        (bool(settings.synth), "a recipe's synth settings"),
        (bool(settings.merge_lora), "--merge-lora"),  # #49 merges into the delay family only
    ]
    for bad, option in refused:
        if bad:
            raise UsageError(f"{option} does not apply to MOSS-TTS-Nano",
                             hint="leave it out: the Nano folder is one format, from an F32 "
                             "GGUF quantized by llama.cpp")  # fmt: skip
    if parse_engine(settings.engine) is Engine.DIRECT:
        raise UsageError("the direct engine reads delay checkpoints only",
                         hint="leave --engine out, or choose binary or library")  # fmt: skip
    if default_types:
        settings = replace(settings, file_types=[DEFAULT_FILE_TYPE])
    return settings


def resolve_nano(settings: AllSettings, bar: ProgressReporter) -> Path:
    """A local folder for the model: the builtin, the folder itself, or a Hub snapshot."""
    return local_model(settings.model, BUILTIN, ensure_tiny_nano, settings.revision,
                       settings.cache_dir, HUB_PATTERNS, bar)  # fmt: skip


def _codec_spec(settings: AllSettings) -> str:
    if settings.audio_tokenizer is not None:
        return str(settings.audio_tokenizer)
    return "builtin" if settings.model == BUILTIN else CODEC_REPO


def resolve_nano_codec(spec: str, settings: AllSettings, bar: ProgressReporter) -> NanoCodec | None:
    """The codec's ONNX release: a folder, a Hub repo, the builtin tiny codec, or none."""
    if spec.lower() == NONE:
        return None
    if spec == "builtin":
        return open_nano_codec(ensure_tiny_nano_codec_folder())
    path = Path(spec).expanduser()
    if path.exists() or not is_repo_id(spec):
        return open_nano_codec(path)
    revision = settings.audio_tokenizer_revision
    try:
        listing = list_files(spec, revision, settings.cache_dir)
        snapshot = download(spec, CODEC_PATTERNS, revision, settings.cache_dir, bar)
    except InputError as exc:
        raise InputError(f"audio tokenizer {spec}: {exc.message}",
                         hint=f"{exc.hint}; or pass {CODEC_FLAG} FOLDER (the ONNX release), "
                         f"or {CODEC_FLAG} none") from exc  # fmt: skip
    codec = open_nano_codec(snapshot)
    if listing is not None:
        check_files(listing, snapshot, [f.as_posix() for f in codec.files], bar)
    return codec
