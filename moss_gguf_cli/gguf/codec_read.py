"""Checking a codec GGUF (moss-tts-audio-encoder / -decoder) from its header alone.

What the fork's loader reads: the keys it cannot do without (``<arch>.sampling_rate``,
``.downsample_rate``, ``.quantizer.num_quantizers``, read through moss_codec_model_meta_u32),
the module list (``<arch>.<part>.block_count`` and each module's keys), and the tensors those
keys imply, each with the shape they imply and its data inside the file. One line names the
first thing wrong; ``verify`` shows it as a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from .codec import ARCHES, REQUIRED_KEYS
from .read import GgufFormatError, read_gguf


@dataclass(frozen=True)
class CodecFacts:
    part: str
    arch: str
    modules: list[str]  # module types, in order
    n_quantizers: int
    sampling_rate: int
    n_tensors: int


def _int(kv: dict[str, Any], key: str, path: Path) -> int:
    value = kv.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(
            f"key {key} is {'missing' if value is None else repr(value)}",
            path=path,
            hint="the fork's loader needs it; convert the audio tokenizer again",
        )
    return value


def _transformer(prefix: str, kv: dict[str, Any], key: str, block: int, path: Path) -> dict:
    get = lambda k: _int(kv, f"{key}.{k}", path)  # noqa: E731
    d, n_in, n_out, layers = (
        get("d_model"),
        get("input_dimension"),
        get("output_dimension"),
        get("num_layers"),
    )
    ff = kv.get(f"{key}.dim_feedforward", 2048)
    out: dict[str, tuple[int, ...]] = {}
    if d != n_in:
        out[f"blk.{block}.input_proj.weight"] = (d, n_in)
    if d != n_out:
        out[f"blk.{block}.output_proj.weight"] = (n_out, d)
    for n in range(layers):
        p = f"blk.{block}.layer.{n}"
        out |= {
            f"{p}.attn_qkv.weight": (3 * d, d),
            f"{p}.attn_output.weight": (d, d),
            f"{p}.ffn_up.weight": (ff, d),
            f"{p}.ffn_down.weight": (d, ff),
        }
        for norm in ("attn_norm", "ffn_norm"):
            out |= {f"{p}.{norm}.weight": (d,), f"{p}.{norm}.bias": (d,)}
        if f"{key}.layer_scale" in kv:
            out |= {f"{p}.attn_scale.scale": (d,), f"{p}.ffn_scale.scale": (d,)}
    return out


def _conv(name: str, n_out: int, n_in: int) -> dict[str, tuple[int, ...]]:
    """A 1x1 convolution with its weight norm folded: weight and bias."""
    return {f"{name}.weight": (n_out, n_in, 1), f"{name}.bias": (n_out,)}


def _quantizer(part: str, arch: str, kv: dict[str, Any], path: Path) -> dict:
    q = lambda k: _int(kv, f"{arch}.quantizer.{k}", path)  # noqa: E731
    dim, rvq, out_dim = q("input_dim"), q("rvq_dim"), q("output_dim")
    cd, cs = q("codebook_dim"), q("codebook_size")
    out: dict[str, tuple[int, ...]] = {}
    if part == "encoder" and dim != rvq:
        out |= _conv("quantizer.input_proj", rvq, dim)
    for n in range(q("num_quantizers")):
        p = f"quantizer.quantizers.{n}"
        if part == "encoder":
            out |= _conv(f"{p}.in_proj", cd, rvq)
        out |= _conv(f"{p}.out_proj", rvq, cd)
        out[f"{p}.codebook.weight"] = (cs, cd)
    if part == "decoder" and rvq != out_dim:
        out |= _conv("quantizer.output_proj", out_dim, rvq)
    return out


def check_codec(path: Path, part: str) -> CodecFacts:
    """PATH as the fork's PART ("encoder" or "decoder") codec GGUF, or one line naming why not."""
    path = Path(path)
    arch = ARCHES[part]
    try:
        g = read_gguf(path)
    except (GgufFormatError, OSError) as exc:
        raise InputError(f"not a readable GGUF ({exc})", path=path) from exc
    if g.arch != arch:
        raise InputError(f"architecture is {g.arch!r}, not {arch!r}", path=path)
    for key in REQUIRED_KEYS:
        _int(g.kv, f"{arch}.{key}", path)
    expected = _quantizer(part, arch, g.kv, path)
    modules = []
    for i in range(_int(g.kv, f"{arch}.{part}.block_count", path)):
        key = f"{arch}.{part}.{i}"
        kind = g.kv.get(f"{key}.module_type")
        modules.append(str(kind))
        if kind == "PatchedPretransform":
            _int(g.kv, f"{key}.patch_size", path)
        elif kind == "Transformer":
            _int(g.kv, f"{key}.context", path)
            expected |= _transformer(key, g.kv, key, modules.count("Transformer") - 1, path)
        else:
            raise InputError(f"{key}.module_type is {kind!r}", path=path)
    for name, shape in expected.items():
        t = g.tensors.get(name)
        if t is None:
            raise InputError(f"tensor {name} is missing", path=path)
        if tuple(reversed(t.dims)) != shape:
            raise InputError(
                f"tensor {name} has shape {list(reversed(t.dims))}, its keys make it {list(shape)}",
                path=path,
            )
        if not g.in_file(t):
            raise InputError(f"tensor {name} ends past the end of the file (truncated)", path=path)
    extra = sorted(set(g.tensors) - set(expected))
    if extra:
        raise InputError(f"tensor {extra[0]} is not one its keys imply", path=path)
    return CodecFacts(
        part,
        arch,
        modules,
        int(g.kv[f"{arch}.quantizer.num_quantizers"]),
        int(g.kv[f"{arch}.sampling_rate"]),
        len(g.tensors),
    )
