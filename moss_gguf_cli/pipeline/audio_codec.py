"""`convert CODEC --format moss-tts-audio-codec`: the fork's encoder and decoder GGUFs.

CODEC is a PyTorch MOSS Audio Tokenizer folder or Hub repo id. Both files are written under
temporary names in one pass over the checkpoint (each tensor read once) and renamed only
when both are complete: a bad input or a failure leaves no GGUF behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..disk.staging import Staging
from ..errors import InputError
from ..gguf.codec import CodecPlan
from ..progress import ProgressReporter
from ..source.audio_tokenizer_checkpoint import CodecCheckpoint, open_codec_checkpoint
from ..source.checkpoint import HUB_PATTERNS as _MODEL_PATTERNS
from ..source.codec_plan import plan_codecs, stream
from ..source.hub import check_files, download, is_repo_id, list_files

DEFAULT_REPO = "OpenMOSS-Team/MOSS-Audio-Tokenizer"
HUB_PATTERNS = [p for p in _MODEL_PATTERNS if not p.startswith("tokenizer")]


@dataclass
class CodecConverted:
    encoder: Path
    decoder: Path
    outtype: str
    n_tensors: dict[str, int]  # part → tensors in its file
    bytes_written: int
    bytes_read: int
    seconds: float


def open_codec_source(
    spec: str | Path,
    *,
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> CodecCheckpoint:
    """A folder, or a Hub repo id (its safetensors, index and config downloaded and checked
    against the Hub's record). The model's name is the folder's, or the repo's, never a
    snapshot hash."""
    text = str(spec)
    path = Path(text).expanduser()
    if path.exists() or not is_repo_id(text):
        return open_codec_checkpoint(path)
    try:
        listing = list_files(text, revision, cache_dir)
        snapshot = download(text, HUB_PATTERNS, revision, cache_dir, progress)
    except InputError as exc:
        raise InputError(
            f"audio tokenizer checkpoint {text}: {exc.message}", hint=exc.hint
        ) from exc
    ck = open_codec_checkpoint(snapshot, name=text.rstrip("/").split("/")[-1])
    if listing is not None:
        rels = ["config.json", *(s.relative_to(snapshot).as_posix() for s in ck.shards)]
        index = snapshot / "model.safetensors.index.json"
        check_files(
            listing,
            snapshot,
            rels + (["model.safetensors.index.json"] if index.is_file() else []),
            progress,
        )
    return ck


def write_codecs(
    ck: CodecCheckpoint,
    plans: tuple[CodecPlan, CodecPlan],
    targets: tuple[Path, Path],
    *,
    force: bool = False,
    progress: ProgressReporter | None = None,
) -> int:
    """Write both plans to TARGETS in one pass; bytes written. Nothing is left on failure."""
    with (
        Staging(targets[0], force=force, kind="file") as s0,
        Staging(targets[1], force=force, kind="file") as s1,
    ):
        writers = [plan.writer(s.path) for plan, s in zip(plans, (s0, s1), strict=True)]
        try:
            for w in writers:
                w.write_header_to_file()
                w.write_kv_data_to_file()
                w.write_ti_data_to_file()
            for i, data in stream(ck, plans, progress):
                writers[i].write_tensor_data(data)
        finally:
            for w in writers:
                w.close()
        s0.commit()
        s1.commit()
    return sum(t.stat().st_size for t in targets)


def convert_codec(
    spec: str | Path,
    outdir: Path,
    outtype: str = "f16",
    *,
    name: str | None = None,
    force: bool = False,
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> CodecConverted:
    """SPEC → OUTDIR/<name>-encoder-<outtype>.gguf and OUTDIR/<name>-decoder-<outtype>.gguf."""
    start = time.monotonic()
    ck = open_codec_source(spec, revision=revision, cache_dir=cache_dir, progress=progress)
    enc, dec = plan_codecs(ck, outtype, name)
    stem = name or ck.name
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise InputError(
            "-o names a file; this format writes two files into a folder",
            path=outdir,
            hint="give a folder",
        )
    targets = (outdir / enc.file_name(stem), outdir / dec.file_name(stem))
    written = write_codecs(ck, (enc, dec), targets, force=force, progress=progress)
    sources = {s for p in (enc, dec) for t in p.tensors for s in t.sources}
    read = sum(ck.tensors[s].nbytes for s in sources)  # each read once
    return CodecConverted(
        encoder=targets[0],
        decoder=targets[1],
        outtype=enc.outtype,
        n_tensors={"encoder": len(enc.tensors), "decoder": len(dec.tensors)},
        bytes_written=written,
        bytes_read=read,
        seconds=time.monotonic() - start,
    )


# ----------------------------------------------------------- in the first-class folder

NATIVE_FLAG = "--pytorch-audio-tokenizer"
NATIVE_OUTTYPE = "f16"  # the fork converter's default, and what its docs run
MANIFEST_KEY = "native_audio_codec"


@dataclass
class NativeCodec:
    """The codec GGUFs a first-class folder gets: the checkpoint, opened and planned."""

    spec: str
    ck: CodecCheckpoint
    plans: tuple[CodecPlan, CodecPlan]

    @property
    def names(self) -> tuple[str, str]:
        return (self.plans[0].file_name(self.ck.name), self.plans[1].file_name(self.ck.name))


def prepare_native(
    spec: str,
    *,
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: ProgressReporter | None = None,
) -> NativeCodec:
    """SPEC (a folder or repo id) opened and checked, both files planned: before any work."""
    ck = open_codec_source(spec, revision=revision, cache_dir=cache_dir, progress=progress)
    return NativeCodec(str(spec), ck, plan_codecs(ck, NATIVE_OUTTYPE))


def write_native(native: NativeCodec, folder: Path, progress: ProgressReporter | None) -> None:
    targets = (folder / native.names[0], folder / native.names[1])
    write_codecs(native.ck, native.plans, targets, progress=progress)


def native_manifest(native: NativeCodec) -> dict:
    """The manifest's record of the two files (verify checks them by it)."""
    return {
        "source": native.spec,
        "outtype": NATIVE_OUTTYPE,
        "encoder": native.names[0],
        "decoder": native.names[1],
    }


def native_readme(model: str, names: tuple[str, str]) -> str:
    """The README section: the fork's native runtime, all three models in llama.cpp."""
    enc, dec = names
    return f"""
## The native path: three GGUFs, no ONNX

`{enc}` and `{dec}` are the audio tokenizer as the fork's own runtime loads it
(architectures `moss-tts-audio-encoder` / `moss-tts-audio-decoder`, byte for byte what its
`convert_moss_audio_tokenizer_split_to_gguf.py` writes):

    build/bin/llama-moss-tts -m {model} \\
        --audio-decoder-model {dec} \\
        --text "Hello, world!" --wav-out hello.wav

Voice cloning adds the encoder and a 24 kHz mono reference:

    build/bin/llama-moss-tts -m {model} \\
        --audio-encoder-model {enc} --audio-decoder-model {dec} \\
        --text "Hello, world!" --reference-audio reference_24k.wav --wav-out hello.wav
"""
