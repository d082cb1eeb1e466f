"""`verify` of the codec GGUFs a first-class folder holds (`all --pytorch-audio-tokenizer`).

The manifest names them (its sizes and sha256 are checked with every other file); each is
checked as the fork's loader reads it (gguf/codec_read.check_codec): architecture, the keys it
cannot do without, every module's keys and tensors with their shapes, the data all there; and
both must agree on the sampling rate and the number of quantizers.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..gguf.codec_read import CodecFacts, check_codec
from ..report import Rows

MANIFEST_KEY = "native_audio_codec"


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
