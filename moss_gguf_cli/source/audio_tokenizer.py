"""The audio tokenizer (codec) a weights folder speaks with: which one, where from, whether it fits.

A weights folder without its codec cannot speak, so ``all`` and ``layout`` resolve it before any
conversion starts: a local folder, a Hub repo id (only the ``.onnx`` graphs and their
external-data files are downloaded), the builtin tiny codec for ``builtin:*`` models, or
``none``. Both graphs are checked against the contract synth relies on
(``source/codec_contract.py``) from the graph alone, without loading their weights: seconds,
not the twenty minutes of a quantization that would end in a folder that cannot speak.

The codec is a property of the model variant: every supported delay model (MOSS-TTS,
MOSS-TTSD-v1.0, MOSS-VoiceGenerator, MOSS-SoundEffect) pairs with MOSS-Audio-Tokenizer,
24 kHz, 32 codebooks (a model with fewer, as MOSS-TTSD's 16, uses the first n_vq), whose ONNX
export is ``OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX``. A model whose config names another
sampling rate has no ONNX export to pair with, and says so instead of getting the wrong codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..disk.confine import boundary, confined
from ..errors import InputError, UsageError
from ..progress import ProgressReporter
from .codec_contract import check_graph_file
from .hub import NO_RECORD, check_files, download, is_repo_id, list_files, local_listing

DEFAULT_REPO = "OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"
SAMPLE_RATE = 24000  # MOSS-Audio-Tokenizer's rate: 12.5 frames/s of 1920 samples
HUB_PATTERNS = ["*.onnx", "*.onnx.data", "*.onnx_data", "*.data"]
NONE = "none"
BUILTIN_CHECK = "made here: the builtin tiny codec"
FLAG = "--audio-tokenizer"


@dataclass(frozen=True)
class AudioTokenizer:
    """An ONNX audio tokenizer on disk, checked: its graphs and every file they need."""

    folder: Path
    decoder: Path  # relative to folder
    encoder: Path | None  # relative to folder; None: no voice cloning
    files: list[Path] = field(default_factory=list)  # relative to folder
    source: str = ""  # repo id, folder or "builtin"
    sample_rate: int = SAMPLE_RATE
    checked: str = NO_RECORD  # what the files' hashes were checked against


def default_source(builtin: bool, sampling_rate: int | None) -> str:
    """The codec a model variant pairs with (a repo id, or "builtin" for the tiny models)."""
    if builtin:
        return "builtin"
    if sampling_rate not in (None, SAMPLE_RATE):
        raise InputError(
            f"this model speaks at {sampling_rate} Hz; the only ONNX audio tokenizer "
            f"({DEFAULT_REPO}) is {SAMPLE_RATE // 1000} kHz",
            hint=f"pass {FLAG} FOLDER with an ONNX export of its own tokenizer, "
            f"or {FLAG} none",
        )
    return DEFAULT_REPO


def _graphs(folder: Path) -> tuple[Path | None, Path | None]:
    """(encoder, decoder) .onnx files in folder or one level below, by name."""
    found = sorted(folder.glob("*.onnx")) + sorted(folder.glob("*/*.onnx"))

    def pick(word: str) -> Path | None:
        exact = [p for p in found if p.stem == word]
        loose = [p for p in found if word in p.stem.lower()]
        return (exact or loose or [None])[0]

    return pick("encoder"), pick("decoder")


def open_folder(folder: Path, source: str | None = None) -> AudioTokenizer:
    """Check an ONNX audio tokenizer folder: both graphs' contract and their data files."""
    folder = Path(folder)
    what = source or str(folder)
    if not folder.is_dir():
        raise InputError(
            "audio tokenizer folder not found",
            path=folder,
            hint=f"pass {FLAG} with a folder, a Hub repo id like {DEFAULT_REPO}, or none",
        )
    encoder, decoder = _graphs(folder)
    if decoder is None:
        raise InputError(
            f"no decoder .onnx in the audio tokenizer {what}",
            path=folder,
            hint=f"point {FLAG} at the MOSS-Audio-Tokenizer ONNX folder or repo",
        )
    check_graph_file(decoder, "decoder")
    if encoder is not None:
        check_graph_file(encoder, "encoder")
    files: list[Path] = []
    for graph in (g for g in (encoder, decoder) if g is not None):
        files.append(graph)
        for data in _external_data(graph):
            if not data.is_file():
                raise InputError(
                    f"{graph.name} needs {data.name}, which is not beside it",
                    path=data,
                    hint="download the audio tokenizer again (the .onnx and its .data files)",
                )
            files.append(data)
    edge = boundary(folder)
    for f in files:
        confined(f, edge)
    rel = sorted({f.relative_to(folder) for f in files})
    return AudioTokenizer(
        folder=folder,
        decoder=decoder.relative_to(folder),
        encoder=encoder.relative_to(folder) if encoder else None,
        files=rel,
        source=what,
    )


def _external_data(graph: Path) -> list[Path]:
    """The external-data files an ONNX graph's weights name, beside it (no escapes)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    out: set[Path] = set()
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        loc = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not loc or Path(loc).is_absolute() or ".." in Path(loc).parts:
            raise InputError(f"{graph.name} names an external-data file {loc!r}", path=graph,
                             hint="only files beside the graph are read")
        out.add(graph.parent / loc)
    return sorted(out)


def resolve(
    spec: str | Path | None,
    *,
    builtin: bool,
    sampling_rate: int | None = None,
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> AudioTokenizer | None:
    """The audio tokenizer for SPEC (None: the model's default; "none": no codec)."""
    text = str(spec) if spec is not None else default_source(builtin, sampling_rate)
    if text.lower() == NONE:
        return None
    if text == "builtin":
        from .tiny import cache_root
        from .tiny_codec import ensure_tiny_codec

        folder = ensure_tiny_codec(cache_root() / "builtin" / "tiny-codec")[0].parent
        return replace(open_folder(folder, "builtin tiny codec"), checked=BUILTIN_CHECK)
    path = Path(text).expanduser()
    if path.exists() or not is_repo_id(text):
        return _checked(open_folder(path), local_listing(path), progress)
    try:
        listing = list_files(text, revision, cache_dir)
        snapshot = download(text, HUB_PATTERNS, revision, cache_dir, progress)
    except InputError as exc:
        raise InputError(
            f"audio tokenizer {text}: {exc.message}",
            hint=f"{exc.hint}; or pass {FLAG} FOLDER, or {FLAG} none to convert without one",
        ) from exc
    return _checked(open_folder(snapshot, text), listing, progress)


def _checked(codec: AudioTokenizer, listing, progress: ProgressReporter | None) -> AudioTokenizer:
    """CODEC after its files were checked against the download's record (if it has one)."""
    if listing is None:
        return codec
    check_files(listing, codec.folder, [r.as_posix() for r in codec.files], progress)
    return replace(codec, checked=listing.describe())


def parse_flag(value: str | None) -> str | None:
    """--audio-tokenizer as given: None (default), "none", a folder or a repo id."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{FLAG} is empty", hint=f"give a folder, a repo id or {NONE}")
    return value
