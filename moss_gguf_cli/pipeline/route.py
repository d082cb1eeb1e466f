"""`all`'s route, chosen once: what the input is × which formats are asked for → what runs.

The input is one of three kinds: a MOSS-TTS safetensors checkpoint (builtin:tiny included), a
first-class moss-tts-delay GGUF (file, folder or Hub repo), or a pre-converted
MOSS-TTS-GGUF repo; `find_input` tells which, in that order of looking (a first-class GGUF
before a pre-converted repo, as both are GGUFs). `choose_route` is the one table:

    input kind        --format backend      --format moss-tts-delay   both
    checkpoint        the steps (run_all)   the first-class folder    both, one read (dual.py)
    pre-converted     run_preconverted      the first-class folder    run_preconverted, then
    first-class GGUF  run_from_first_class    (the input not looked     the first-class folder
                                              at: it reads the model)   reading the model itself

`run_request` is the delay family's `all` (families/: the registry hands every input no other
family claims here): the request as given, the route chosen and run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from ..errors import UsageError
from ..gguf.codec import FORMAT as CODEC_FORMAT
from ..gguf.first_class import FORMAT, parse_audio_tables_type
from ..progress import ProgressReporter, ensure
from ..source.checkpoint import refuse_lookalike_repo
from ..source.preconverted import GgufRepo, recognise
from .audio_codec import NATIVE_FLAG
from .card import CardFacts, card_source, relaid, write_card
from .dual import run_both
from .first_class import (
    BACKEND,
    FirstClassFolder,
    check_first_class_settings,
    folder_readme,
    parse_formats,
    run_first_class,
)
from .from_first_class import FirstClassInput, find_first_class
from .run import AllResult, AllSettings, run_all, run_from_first_class, run_preconverted


class InputKind(Enum):
    CHECKPOINT = "checkpoint"
    PRECONVERTED = "pre-converted"
    FIRST_CLASS = "first-class"


@dataclass(frozen=True)
class Found:
    """What --model is, with what finding it gave (a repo, a first-class file)."""

    kind: InputKind
    repo: GgufRepo | None = None
    first_class: FirstClassInput | None = None


def find_input(settings: AllSettings, progress: ProgressReporter) -> Found:
    """The kind of --model; builtin models are checkpoints without a look."""
    if settings.model.startswith("builtin:"):
        return Found(InputKind.CHECKPOINT)
    first = find_first_class(
        settings.model, settings.file_types, settings.revision, settings.cache_dir, progress
    )
    if first is not None:
        return Found(InputKind.FIRST_CLASS, first_class=first)
    repo = recognise(settings.model, settings.revision, settings.cache_dir)
    if repo is not None:
        return Found(InputKind.PRECONVERTED, repo=repo)
    return Found(InputKind.CHECKPOINT)


class Backend(Enum):
    """How the backend folder is made."""

    STEPS = "steps"  # extract, convert, quantize, layout, verify from a checkpoint
    PRECONVERTED = "preconverted"  # a MOSS-TTS-GGUF repo's files laid out
    FROM_FIRST_CLASS = "from-first-class"  # a first-class GGUF taken apart


@dataclass(frozen=True)
class Route:
    backend: Backend | None  # None: no backend folder asked for
    first_class: bool  # the first-class folder: OUTPUT, or OUTPUT/moss-tts-delay with a backend

    @property
    def one_read(self) -> bool:
        """Both folders from one read of the checkpoint (pipeline/dual.py)."""
        return self.backend is Backend.STEPS and self.first_class


_BACKENDS = {
    InputKind.CHECKPOINT: Backend.STEPS,
    InputKind.PRECONVERTED: Backend.PRECONVERTED,
    InputKind.FIRST_CLASS: Backend.FROM_FIRST_CLASS,
}


def choose_route(kind: InputKind | None, formats: list[str]) -> Route:
    """The one route chooser. KIND may be None only when the backend is not asked for."""
    backend = _BACKENDS[kind] if BACKEND in formats else None
    return Route(backend, FORMAT in formats)


@dataclass
class AllRequest:
    """`all` as asked: the settings, --format (as given), --audio-tables-type."""

    settings: AllSettings
    formats: list[str] | None = None
    audio_tables: str | None = None
    default_types: bool = False  # no --file-type given: each family's default (Nano: Q8_0)
    base_model: str | None = None  # --base-model: the Hub repo a local source was taken from
    command: str = "moss-gguf all"  # the command line, as the model card records it


@dataclass
class AllOutcome:
    route: Route
    result: AllResult | None = None  # the backend folder's
    folder: FirstClassFolder | None = None  # the first-class folder's


def run_request(request: AllRequest, progress: ProgressReporter | None = None) -> AllOutcome:
    """Check the request, find what the input is (when the route depends on it), choose the
    route and run it; then each folder's model card (README.md), after its checks."""
    s = request.settings
    refuse_lookalike_repo(s.model)  # a look-alike's Hub id: before its listing or download
    source = card_source(s.model, s.revision, s.cache_dir, request.base_model)  # fails first
    outcome = _run_route(request, progress)
    if outcome.route.backend in (Backend.PRECONVERTED, Backend.FROM_FIRST_CLASS):
        source = relaid(source, s.model)  # converted elsewhere: not this folder's base model
    if outcome.result is not None:
        r = outcome.result
        verified = next((st.detail for st in r.steps if st.name == "verify"), "not run")
        write_card(r.output, CardFacts(source, verified, request.command))
        r.notes += source.notes
    if outcome.folder is not None:
        f = outcome.folder
        facts = CardFacts(source, "every GGUF's first-class header checked",
                          request.command, first_class=folder_readme(f.output))  # fmt: skip
        write_card(f.output, facts)
        f.notes += source.notes if outcome.result is None else []
    return outcome


def _run_route(request: AllRequest, progress: ProgressReporter | None) -> AllOutcome:
    bar = ensure(progress)
    settings, tables = request.settings, request.audio_tables
    formats = parse_formats(request.formats)
    if tables is not None and FORMAT not in formats:
        raise UsageError(
            "--audio-tables-type applies to the first-class format only",
            hint=f"add --format {FORMAT}",
        )
    if settings.native_codec is not None and FORMAT not in formats:
        raise UsageError(
            f"{NATIVE_FLAG} adds the codec GGUFs to the first-class folder only",
            hint=f"add --format {FORMAT}, or run: moss-gguf convert "
            f"{settings.native_codec} --format {CODEC_FORMAT} -o DIR",
        )
    if settings.merge_lora and FORMAT in formats:
        raise UsageError(f"--merge-lora writes the backend folder only, not {FORMAT}",
                         hint="drop --format moss-tts-delay, or merge with PEFT first")  # fmt: skip
    if BACKEND not in formats:
        route = choose_route(None, formats)
        return AllOutcome(route, folder=run_first_class(settings, bar, audio_tables=tables))
    if FORMAT in formats:  # what needs no look at anything fails first
        check_first_class_settings(_beside(settings))
        parse_audio_tables_type(tables)
    found = find_input(settings, bar)
    route = choose_route(found.kind, formats)
    if settings.merge_lora and route.backend in (Backend.FROM_FIRST_CLASS, Backend.PRECONVERTED):
        raise UsageError("--merge-lora merges into a source checkpoint's weights; this model "
                         "is converted already",
                         hint="give the base checkpoint as --model")  # fmt: skip
    if not route.first_class:
        return AllOutcome(route, result=_backend(route.backend, settings, found, bar))
    if route.one_read:
        result, folder = run_both(settings, progress=bar, audio_tables=tables)
        return AllOutcome(route, result, folder)
    # another kind of input: its backend folder, then the first-class folder reads the model
    result = _backend(route.backend, settings, found, bar)
    folder = run_first_class(_beside(settings), bar, audio_tables=tables)
    return AllOutcome(route, result, folder)


def _beside(settings: AllSettings) -> AllSettings:
    """The first-class folder's settings when a backend folder is made too: OUTPUT/FORMAT."""
    return replace(settings, output=Path(settings.output) / FORMAT)


def _backend(
    backend: Backend,
    settings: AllSettings,
    found: Found,
    bar: ProgressReporter,
) -> AllResult:
    if backend is Backend.FROM_FIRST_CLASS:
        return run_from_first_class(settings, found.first_class, bar)
    if backend is Backend.PRECONVERTED:
        return run_preconverted(settings, found.repo, bar)
    return run_all(settings, progress=bar)
