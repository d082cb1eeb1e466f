"""Reading the first-class `moss-tts-delay` GGUF back: its check, and the backend layout.

`check_first_class` is what every reader runs first: the header against itself (architecture,
n_vq against the audio tensors, every tensor the format needs with the shape the keys imply,
the data all there). Any problem is one InputError naming the file.

The backend layout's parts come from it as they are: the backbone tensors' bytes copied under
a qwen3 header (`backbone_plan`, `write_backbone`), the 2 + 2 x n_vq tables as f16 rows
(`read_table`: exact for F16, dequantized for a quantized type).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..disk.staging import staged_file
from ..errors import InputError
from .first_class import ARCH_NAME, AUDIO_EMBD, AUDIO_HEAD
from .qwen3_names import layer_shapes
from .read import GgufFile, GgufFormatError, header_input_error, read_gguf
from .stream import GGUFTensor, SourceTensor
from .vocab import Vocab
from .write import GGUFPlan, OutType, Qwen3Params, block_order, write_header

_HINT = "convert the checkpoint again (moss-gguf convert --format moss-tts-delay)"
_AUDIO = re.compile(rf"^({AUDIO_EMBD}|{AUDIO_HEAD})\.(\d+)\.weight$")
# Hugging Face → GGUF names of one decoder layer (the shapes come from qwen3_names)
_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_proj": "attn_k",
    "self_attn.k_norm": "attn_k_norm", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip


@dataclass(frozen=True)
class FirstClassFacts:
    """What a checked first-class header says."""

    n_vq: int
    n_layers: int
    hidden: int
    vocab: int
    audio_rows: int
    keys: dict
    header: GgufFile


def _u32(g: GgufFile, key: str) -> int:
    value = g.kv.get(f"{ARCH_NAME}.{key}")
    if not isinstance(value, int):
        raise InputError(f"key {ARCH_NAME}.{key} is missing", path=g.path, hint=_HINT)
    return value


def expected_shapes(g: GgufFile) -> dict[str, tuple[int, ...]]:
    """Every tensor name of the format → its shape in ggml order, from the header's keys."""
    hidden, ff = _u32(g, "embedding_length"), _u32(g, "feed_forward_length")
    heads = _u32(g, "attention.head_count")
    kv_heads = g.kv.get(f"{ARCH_NAME}.attention.head_count_kv") or heads
    head_dim = g.kv.get(f"{ARCH_NAME}.attention.key_length") or hidden // heads
    n_vq, rows = _u32(g, "n_vq"), _u32(g, "audio_vocab_size") + 1
    vocab = _vocab(g)
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (hidden, vocab),
        "output_norm.weight": (hidden,),
        "output.weight": (hidden, vocab),
    }
    for n in range(_u32(g, "block_count")):
        layer = layer_shapes("", hidden, heads * head_dim, kv_heads * head_dim, ff, head_dim)
        for hf, shape in layer.items():
            name = _LAYER[hf.removesuffix(".weight")]
            shapes[f"blk.{n}.{name}.weight"] = tuple(reversed(shape))
    for i in range(n_vq):
        shapes[f"{AUDIO_EMBD}.{i}.weight"] = (hidden, rows)
        shapes[f"{AUDIO_HEAD}.{i}.weight"] = (hidden, rows)
    return shapes


def _vocab(g: GgufFile) -> int:
    t = g.tensors.get("token_embd.weight")
    if t is None or len(t.dims) != 2:
        raise InputError("tensor token_embd.weight is missing", path=g.path, hint=_HINT)
    return t.dims[1]


def check_first_class(path: Path) -> FirstClassFacts:
    """The header of a first-class GGUF, checked against itself; InputError names the problem."""
    path = Path(path)
    if not path.is_file():
        raise InputError("GGUF file not found", path=path)
    try:
        g = read_gguf(path)
    except GgufFormatError as exc:
        raise header_input_error(path, exc) from None
    if g.arch != ARCH_NAME:
        raise InputError(
            f"architecture {g.arch!r}, not {ARCH_NAME}", path=path,
            hint="this is not a first-class MOSS-TTS GGUF",
        )  # fmt: skip
    n_vq = _u32(g, "n_vq")
    for kind, what in ((AUDIO_EMBD, "audio embeddings"), (AUDIO_HEAD, "audio heads")):
        found = sorted(int(m[2]) for n in g.tensors if (m := _AUDIO.match(n)) and m[1] == kind)
        if len(found) != n_vq:
            raise InputError(
                f"{ARCH_NAME}.n_vq = {n_vq} but the file has {len(found)} {what} ({kind}.*)",
                path=path, hint=_HINT,
            )  # fmt: skip
    shapes = expected_shapes(g)
    for name, shape in shapes.items():
        t = g.tensors.get(name)
        if t is None:
            raise InputError(f"tensor {name} is missing", path=path, hint=_HINT)
        if tuple(t.dims) != shape:
            raise InputError(
                f"tensor {name} has shape {list(t.dims)}, the header's keys imply {list(shape)}",
                path=path, hint=_HINT,
            )  # fmt: skip
    extra = sorted(set(g.tensors) - set(shapes))
    if extra:
        raise InputError(
            f"unexpected tensor {extra[0]} ({len(extra)} in all)", path=path, hint=_HINT
        )
    for t in g.tensors.values():
        if not g.in_file(t):
            raise InputError(
                f"truncated GGUF: tensor {t.name} ends at byte {g.abs_offset(t) + t.nbytes}, "
                f"the file has {g.size}",
                path=path, hint=_HINT,
            )  # fmt: skip
    keys = {k: v for k, v in g.kv.items() if isinstance(v, (int, float, str))}
    return FirstClassFacts(
        n_vq, _u32(g, "block_count"), _u32(g, "embedding_length"), _vocab(g),
        _u32(g, "audio_vocab_size") + 1, keys, g,
    )  # fmt: skip



# --------------------------------------------------------------------------- the backend layout

# first-class tensor → the backend table it becomes (embeddings/ or lm_heads/, file name)
TEXT_TABLES = {"token_embd.weight": "embed_tokens", "output.weight": "lm_head_text"}
EXACT_TYPES = ("F16", "BF16", "F32")  # tables whose f16 .npy is what `extract` writes


def backend_table_name(name: str) -> str | None:
    """The backend .npy stem of a first-class tensor (None: a backbone-only tensor)."""
    if name in TEXT_TABLES:
        return TEXT_TABLES[name]
    if m := _AUDIO.match(name):
        stem = "emb_ext" if m[1] == AUDIO_EMBD else "lm_head_audio"
        return f"{stem}_{int(m[2]):02d}"
    return None


def read_table(g: GgufFile, name: str) -> np.ndarray:
    """A table of the file as float16 rows: the bytes themselves for F16; BF16 and F32 rounded
    to f16 as `extract` rounds the checkpoint; a quantized type through gguf-py's dequantize."""
    t = g.tensors[name]
    qtype = gguf.GGMLQuantizationType[t.type_name]
    with open(g.path, "rb") as f:
        f.seek(g.abs_offset(t))
        raw = np.frombuffer(f.read(t.nbytes), dtype=np.uint8)
    rows, cols = t.n_rows, t.dims[0]
    if qtype == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(rows, cols)
    if qtype == gguf.GGMLQuantizationType.BF16:
        wide = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return wide.reshape(rows, cols).astype(np.float16)
    values = gguf.quants.dequantize(raw.reshape(rows, -1), qtype)
    return np.asarray(values, dtype=np.float32).reshape(rows, cols).astype(np.float16)


@dataclass
class ReusedPlan(GGUFPlan):
    """A qwen3 GGUF over tensors that already have their type and bytes (a first-class file's
    backbone): the header states that file's own type."""

    source_file_type: int = 1

    def file_type(self) -> int:
        return self.source_file_type


def backbone_plan(
    facts: FirstClassFacts, params: Qwen3Params, vocab: Vocab, name: str
) -> ReusedPlan:
    """The backend's backbone GGUF over the first-class file's backbone tensors, as they are;
    NAME is its general.name (convert's: '<variant> backbone')."""
    g = facts.header
    tensors = []
    for t in g.tensors.values():
        if _AUDIO.match(t.name):
            continue
        shape = tuple(reversed(t.dims))
        src = SourceTensor(t.name, g.path, t.type_name, shape, g.abs_offset(t), t.nbytes)
        tensors.append(GGUFTensor(t.name, gguf.GGMLQuantizationType[t.type_name], src))
    tensors.sort(key=lambda t: block_order(t.name))  # convert's order
    file_type = g.kv.get("general.file_type", 1)
    return ReusedPlan(params, tensors, vocab, OutType.F16, name, source_file_type=int(file_type))


def write_backbone(plan: ReusedPlan, dest: Path, force: bool = False) -> None:
    """The backbone GGUF at dest: the plan's header, then each tensor's bytes copied as they lie
    in the first-class file (under a temporary name until complete)."""
    with staged_file(dest, force=force) as tmp:
        _, alignment, size = write_header(tmp, plan)
        with open(tmp, "r+b") as out:
            out.seek(0, 2)
            out.write(b"\0" * (-out.tell() % alignment))
            for t in plan.tensors:
                with open(t.source.path, "rb") as src:
                    src.seek(t.source.offset)
                    left = t.nbytes
                    while left:
                        chunk = src.read(min(left, 16 << 20))
                        if not chunk:
                            raise InputError(f"tensor {t.name} ends early", path=t.source.path,
                                             hint=_HINT)  # fmt: skip
                        out.write(chunk)
                        left -= len(chunk)
                out.write(b"\0" * (-t.nbytes % alignment))
            if out.tell() != size:
                raise AssertionError(f"wrote {out.tell()} bytes, the header promised {size}")
