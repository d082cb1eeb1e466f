"""`verify` of the codec GGUFs a first-class folder holds (`all --pytorch-audio-tokenizer`).

The manifest names them (its sizes and sha256 are checked with every other file); each is
checked as the fork's loader reads it (gguf/codec_read.check_codec): architecture, the keys it
cannot do without, every module's keys and tensors with their shapes, the data all there; and
both must agree on the sampling rate and the number of quantizers.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import InputError, UsageError
from ..gguf.codec import ARCHES
from ..gguf.codec_read import CodecFacts, check_codec
from ..gguf.read import GgufFormatError, read_gguf
from ..report import Rows
from .result import VerifyReport

MANIFEST_KEY = "native_audio_codec"


def _describe(f: CodecFacts) -> str:
    return (
        f"{f.arch}, {len(f.modules)} modules, {f.n_quantizers} quantizers, "
        f"{f.sampling_rate} Hz, {f.n_tensors} tensors with the shapes their keys imply"
    )


def native_codec_rows(folder: Path, manifest: dict, rows: Rows) -> None:
    """Rows for the manifest's codec GGUFs; none when the folder has none."""
    entry = manifest.get(MANIFEST_KEY)
    if not entry:
        return
    rows.group = "gguf"
    facts: list[CodecFacts] = []
    for part in ("encoder", "decoder"):
        name = str(entry.get(part))
        try:
            f = check_codec(folder / name, part)
        except InputError as exc:
            rows.add(f"{name}: codec header", "fail", exc.message, exc.hint or "")
            continue
        facts.append(f)
        rows.add(
            f"{name}: codec header",
            "pass",
            f"{f.arch}, {len(f.modules)} modules, {f.n_quantizers} quantizers, "
            f"{f.sampling_rate} Hz, {f.n_tensors} tensors with the shapes their keys imply",
        )
    if len(facts) == 2:
        enc, dec = facts
        agree = (enc.sampling_rate, enc.n_quantizers) == (dec.sampling_rate, dec.n_quantizers)
        rows.check(
            "codec encoder vs decoder",
            []
            if agree
            else [
                f"encoder {enc.sampling_rate} Hz / {enc.n_quantizers} quantizers, "
                f"decoder {dec.sampling_rate} Hz / {dec.n_quantizers}"
            ],
            "same sampling rate and quantizers",
        )


def codec_part(path: Path) -> str | None:
    """ "encoder" or "decoder" for a codec GGUF file, None for anything else."""
    path = Path(path).expanduser()
    if not path.is_file():
        return None
    try:
        arch = read_gguf(path).arch
    except (GgufFormatError, OSError):
        return None
    return next((part for part, a in ARCHES.items() if a == arch), None)


def verify_codec_file(path: Path, deep: bool) -> VerifyReport:
    """`verify FILE` on one codec GGUF: its header as the fork's loader reads it."""
    started = time.perf_counter()
    if deep:
        raise UsageError(
            "--deep runs the GGUF in the stock llama.cpp, which does not know the codec "
            "architectures",
            path=path,
            hint="verify without --deep; run it with the fork's llama-moss-tts",
        )
    part = codec_part(path)
    rows = Rows()
    rows.group = "gguf"
    try:
        f = check_codec(Path(path), str(part))
        rows.add(f"{Path(path).name}: codec header", "pass", _describe(f))
    except InputError as exc:
        rows.add(f"{Path(path).name}: codec header", "fail", exc.message, exc.hint or "")
    return VerifyReport(target=Path(path), kind="codec", rows=rows.rows,
                        seconds=time.perf_counter() - started)  # fmt: skip
