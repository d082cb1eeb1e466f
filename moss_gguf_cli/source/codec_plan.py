"""The codec GGUFs planned over a MOSS Audio Tokenizer checkpoint, and their tensor data.

gguf/codec.py holds the format (names, keys, types, how weight norm is folded); this module
applies it to an opened checkpoint: which of its tensors go into which file, in which order,
and the one pass that reads each tensor once for both files. ``part_sizes`` gives the files'
sizes from a config alone (docs/audio-codec.md quotes them for the real tokenizer).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..gguf.codec import (
    ARCHES,
    QT,
    CodecPlan,
    CodecTensor,
    G,
    V,
    blocks_of,
    common_keys,
    fold_weight_norm,
    gguf_name,
    in_part,
    module_keys,
    parse_outtype,
)
from ..progress import ProgressReporter, ensure
from .audio_tokenizer_checkpoint import CodecCheckpoint, expected_shapes


def _tensor(ck: CodecCheckpoint, name: str, out: str, outtype: str) -> CodecTensor:
    ref = ck.tensors[name]
    sources: tuple[str, ...] = (name,)
    shape = ref.shape
    if G in name:
        v = name.replace(G, V)
        if v not in ck.tensors:
            raise InputError(
                f"tensor {v} is missing",
                path=ck.root,
                hint="a weight-normed convolution needs both g and v",
            )
        sources, shape = (name, v), ck.tensors[v].shape
    if ref.dtype not in ("F32", "F16", "BF16", "F64"):
        raise InputError(f"tensor {name} is {ref.dtype}, not a float", path=ref.path)
    qtype = QT.F16 if outtype == "f16" and len(shape) > 1 else QT.F32
    return CodecTensor(out, sources, tuple(shape), qtype)


def plan_codecs(
    ck: CodecCheckpoint, outtype: str, name: str | None = None
) -> tuple[CodecPlan, CodecPlan]:
    """The encoder's and the decoder's GGUF for checkpoint CK; no tensor data is read."""
    outtype = parse_outtype(outtype)
    stem = name or ck.name
    blocks = {part: blocks_of(ck.config[f"{part}_kwargs"]) for part in ARCHES}
    plans = []
    for part, arch in ARCHES.items():
        plan = CodecPlan(part, f"{stem} {part.capitalize()}", outtype)
        plan.keys = common_keys(arch, ck.config) + module_keys(arch, part, ck.config)
        seen: set[str] = set()
        for src in ck.tensors:
            out = gguf_name(src, blocks)
            if out is None or out in seen or not in_part(src.replace(G, ".weight"), part):
                continue
            seen.add(out)
            plan.tensors.append(_tensor(ck, src, out, outtype))
        plans.append(plan)
    return plans[0], plans[1]


def tensor_data(ck: CodecCheckpoint, t: CodecTensor) -> np.ndarray:
    """The bytes of one GGUF tensor, as the fork's converter computes them."""
    arrays = [ck.tensors[s].read_f32() for s in t.sources]
    data = fold_weight_norm(*arrays) if len(arrays) == 2 else arrays[0]
    dtype = np.float16 if t.qtype == QT.F16 else np.float32
    return np.ascontiguousarray(data.astype(dtype, copy=False))


def stream(
    ck: CodecCheckpoint, plans: tuple[CodecPlan, ...], progress: ProgressReporter | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """(plan position, data) for every tensor of every plan, in checkpoint order: a tensor
    two plans share is computed once and handed to each."""
    by_source: dict[str, list[tuple[int, CodecTensor]]] = {}
    for i, plan in enumerate(plans):
        for t in plan.tensors:
            by_source.setdefault(t.sources[0], []).append((i, t))
    bar = ensure(progress)
    bar.start("codec", "audio codec tensors", sum(len(p.tensors) for p in plans), "tensors")
    for src in ck.tensors:
        wanted = by_source.get(src)
        if not wanted:
            continue
        data = tensor_data(ck, wanted[0][1])
        for i, _ in wanted:
            yield i, data
            bar.advance("codec")
    bar.finish("codec")


@dataclass(frozen=True)
class PartSize:
    """What one codec GGUF holds, from the config alone: tensors, parameters, data bytes."""

    tensors: int
    params: int
    f16_bytes: int  # tensor data at f16 (1-D tensors stay f32)
    f32_bytes: int


def part_sizes(config: dict[str, Any]) -> dict[str, PartSize]:
    """The encoder's and the decoder's file sizes (tensor data, no header) for a config: the
    tensors upstream's model has for it, selected and typed as the converter does."""
    shapes = expected_shapes(config)
    blocks = {part: blocks_of(config[f"{part}_kwargs"]) for part in ARCHES}
    out = {}
    for part in ARCHES:
        sizes = [
            shapes.get(src.replace(G, V), shape)
            for src, shape in shapes.items()
            if gguf_name(src, blocks) is not None and in_part(src.replace(G, ".weight"), part)
        ]
        counts = [int(np.prod(s)) for s in sizes]
        out[part] = PartSize(
            tensors=len(sizes),
            params=sum(counts),
            f16_bytes=sum(n * (2 if len(s) > 1 else 4) for n, s in zip(counts, sizes, strict=True)),
            f32_bytes=4 * sum(counts),
        )
    return out
