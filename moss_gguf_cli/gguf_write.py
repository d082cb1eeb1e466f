"""Native Qwen3 → GGUF writer: the `gguf` package for the header, our own streaming for the data.

llama.cpp's ``convert_hf_to_gguf.py`` (the pinned tree) is the reference for every decision
made here: which keys, which tokenizer facts, which type each tensor gets. What it decides
through transformers and torch we decide from the same files with ``tokenizers`` and NumPy;
the parity tests compare both outputs tensor by tensor and key by key.

Memory stays bounded: GGUFWriter writes the header, the key/values and the tensor infos
(for which it needs only shapes, types and sizes); the tensor data is then appended in row
chunks read with plain file reads (a memory map would count every touched page against the
process), converted, and padded to the alignment GGUFWriter's offsets assume. One thread
reads and converts while another writes; the output is preallocated and written through
the page cache with write-behind (sinks.WriteBehindSink): quantize reads it next from
memory, while dirty pages stay bounded so the writer is never throttled.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .errors import InputError, NumericError, UnsupportedModelError, UsageError
from .holds import hold
from .progress import ProgressReporter, ensure
from .qwen3_names import layer_shapes
from .sinks import appender
from .source_pages import SourcePages

log = logging.getLogger(__name__)

ARCH = gguf.MODEL_ARCH.QWEN3
ARCH_NAME = gguf.MODEL_ARCH_NAMES[ARCH]
CHUNK_BYTES = 16 * 1024 * 1024  # source bytes converted at once; bounds the working memory
ENGINE_HINT = "use --engine llama.cpp for this model"
QT = gguf.GGMLQuantizationType

# The pre-tokenizer llama.cpp calls "qwen2": this split regex, then byte-level mapping.
# llama.cpp recognises it by hashing a tokenization; we recognise the configuration itself.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# transformers' Qwen3Config defaults: llama.cpp reads the config through AutoConfig, so a key
# missing from config.json takes these values there.
QWEN3_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 32,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)


class OutType(str, Enum):
    """GGUF out types, named as convert_hf_to_gguf.py's --outtype."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    Q8_0 = "q8_0"

    @property
    def qtype(self) -> gguf.GGMLQuantizationType:
        return {"f16": QT.F16, "bf16": QT.BF16, "f32": QT.F32, "q8_0": QT.Q8_0}[self.value]

    @property
    def file_type(self) -> gguf.LlamaFileType:
        return {
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "f32": gguf.LlamaFileType.ALL_F32,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[self.value]

    @classmethod
    def parse(cls, value: str | OutType) -> OutType:
        try:
            return cls(str(getattr(value, "value", value)).lower())
        except ValueError:
            raise UsageError(
                f"unknown out type {value!r}",
                hint="choose one of " + ", ".join(t.value for t in cls),
            ) from None


# --------------------------------------------------------------------------- hyperparameters


@dataclass(frozen=True)
class Qwen3Params:
    n_layers: int
    hidden: int
    ff: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    rope_theta: float
    tied: bool

    @classmethod
    def from_config(cls, config: dict[str, Any], path: Path | None = None) -> Qwen3Params:
        """Read a Qwen3ForCausalLM config the way llama.cpp's converter sees it."""
        missing = [k for k in _REQUIRED if config.get(k) is None]
        if missing:
            raise InputError(f"config is missing {missing[0]}", path=path)
        if config.get("attention_bias"):
            raise UnsupportedModelError(
                "attention_bias = true (q/k/v/o biases) is not handled by the native engine",
                path=path,
                hint=ENGINE_HINT,
            )
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
        if rope_type not in (None, "default"):
            raise UnsupportedModelError(
                f"RoPE scaling {rope_type!r} is not handled by the native engine",
                path=path,
                hint=ENGINE_HINT,
            )

        def get(key: str) -> Any:
            value = config.get(key)
            return QWEN3_DEFAULTS[key] if value is None and key in QWEN3_DEFAULTS else value

        theta = config.get("rope_theta")
        if theta is None and isinstance(rope, dict):
            theta = rope.get("rope_theta")
        heads = int(config["num_attention_heads"])
        kv = config.get("num_key_value_heads", QWEN3_DEFAULTS["num_key_value_heads"])
        try:
            return cls(
                n_layers=int(config["num_hidden_layers"]),
                hidden=int(config["hidden_size"]),
                ff=int(config["intermediate_size"]),
                heads=heads,
                kv_heads=heads if kv is None else int(kv),
                head_dim=int(get("head_dim")),
                vocab=int(config["vocab_size"]),
                context=int(get("max_position_embeddings")),
                rms_eps=float(get("rms_norm_eps")),
                rope_theta=float(QWEN3_DEFAULTS["rope_theta"] if theta is None else theta),
                tied=bool(get("tie_word_embeddings")),
            )
        except (TypeError, ValueError) as exc:
            raise InputError(f"config has a value of the wrong type ({exc})", path=path) from exc


def expected_shapes(hp: Qwen3Params) -> dict[str, tuple[int, ...]]:
    """Qwen3ForCausalLM tensor names (Hugging Face) → shapes the config implies."""
    h, q, kv = hp.hidden, hp.heads * hp.head_dim, hp.kv_heads * hp.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (hp.vocab, h)}
    for n in range(hp.n_layers):
        shapes.update(layer_shapes(f"model.layers.{n}.", h, q, kv, hp.ff, hp.head_dim))
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (hp.vocab, h)
    return shapes


# --------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class SourceTensor:
    """Where a tensor's bytes lie: a safetensors file, an absolute offset, a storage dtype."""

    name: str  # its name in the file (language_model.* / lm_heads.0.weight in a MOSS source)
    path: Path
    dtype: str  # safetensors dtype: BF16, F16 or F32
    shape: tuple[int, ...]
    offset: int
    nbytes: int


_SOURCE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the output: its GGUF name and type, and the source it is made from."""

    name: str
    qtype: gguf.GGMLQuantizationType
    source: SourceTensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.shape) // block * size


def tensor_qtype(gguf_name: str, shape: tuple[int, ...], outtype: OutType) -> QT:
    """The type llama.cpp's converter gives this tensor for this out type."""
    # 1-D tensors and norms stay f32: ggml's norm kernels take f32 weights
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return QT.F32
    if not gguf_name.endswith(".weight"):
        return QT.F32
    qtype = outtype.qtype
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        return QT.F16  # the converter falls back to f16 when rows do not split into blocks
    return qtype


def _block_order(name: str) -> tuple[int, int, int, str]:
    """Order: token_embd, blocks by number (tensors in forward order), output_norm, output."""
    parts = name.split(".")
    if parts[0] == "blk":
        kind = parts[2]
        rank = _BLOCK_TENSORS.index(kind) if kind in _BLOCK_TENSORS else len(_BLOCK_TENSORS)
        return (1, int(parts[1]), rank, name)
    return ({"token_embd": 0, "output_norm": 2, "output": 3}.get(parts[0], 4), 0, 0, name)


_BLOCK_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_q_norm",
    "attn_k",
    "attn_k_norm",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def plan_tensors(
    hp: Qwen3Params,
    sources: dict[str, SourceTensor],
    outtype: OutType,
    where: Path | None = None,
) -> list[GGUFTensor]:
    """Check the tensor set against the config and give each its GGUF name and type."""
    expected = expected_shapes(hp)
    if hp.tied and "lm_head.weight" not in sources:
        del expected["lm_head.weight"]  # tied: llama.cpp reuses token_embd as the output
    for name, shape in expected.items():
        src = sources.get(name)
        if src is None:
            raise InputError(
                f"tensor {name!r} is missing",
                path=where,
                hint="the checkpoint is incomplete or not a Qwen3 backbone",
            )
        if tuple(src.shape) != shape:
            raise InputError(
                f"tensor {name!r} has shape {list(src.shape)} but the config implies {list(shape)}",
                path=src.path,
                hint="config.json and the weights disagree",
            )
        if src.dtype not in _SOURCE_DTYPES:
            raise InputError(
                f"tensor {name!r} has dtype {src.dtype}; expected BF16, F16 or F32",
                path=src.path,
            )
    extra = [
        n for n in sources if n not in expected and not n.endswith(".rotary_emb.inv_freq")
    ]  # the converter drops inv_freq buffers: they are recomputed from rope_theta
    if extra:
        raise InputError(
            f"unexpected tensor {extra[0]!r} ({len(extra)} in all) for a "
            f"{hp.n_layers}-layer Qwen3 config",
            path=sources[extra[0]].path,
            hint="config.json and the weights disagree, or this is not a plain Qwen3 backbone",
        )
    names = gguf.get_tensor_name_map(ARCH, hp.n_layers)
    planned = []
    for hf_name in expected:
        new = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:  # every expected name maps; this would be a gguf package change
            raise UnsupportedModelError(f"no GGUF name for tensor {hf_name!r}", hint=ENGINE_HINT)
        src = sources[hf_name]
        planned.append(GGUFTensor(new, tensor_qtype(new, src.shape, outtype), src))
    planned.sort(key=lambda t: _block_order(t.name))
    return planned


# --------------------------------------------------------------------------- tokenizer


@dataclass
class Vocab:
    tokens: list[str]
    toktypes: list[int]
    pre: str
    special: gguf.SpecialVocab


class _BackboneSpecialVocab(gguf.SpecialVocab):
    """gguf's SpecialVocab, reading token ids from the backbone's config.

    A MOSS source folder holds the MOSS config in config.json; the ids llama.cpp sees come
    from the extracted backbone's config, i.e. the language config.
    """

    def __init__(self, tokenizer_dir: Path, config: dict[str, Any]):
        self._backbone_config = config
        super().__init__(tokenizer_dir, load_merges=True)

    def _try_load_from_config_json(self, path: Path) -> bool:
        for typ in self.special_token_types:
            self._set_special_token(typ, self._backbone_config.get(f"{typ}_token_id"))
        return True


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{what} is missing", path=path) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{what} is not valid JSON ({exc})", path=path) from exc


def _looks_special(text: str) -> bool:
    """Added tokens llama.cpp treats as control tokens even when not flagged special."""
    if text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]"):
        return True
    pairs = (("<|", "|>"), ("<\uff5c", "\uff5c>"), ("<unused", ">"))
    return any(text.startswith(a) and text.endswith(b) for a, b in pairs)


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization (applied by decode when the config asks for it)."""
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


def _state(component: Any) -> dict[str, Any]:
    """The JSON form of a tokenizers component (normalizer, pre-tokenizer, ...), {} if none."""
    if component is None:
        return {}
    return json.loads(component.__getstate__())


def pre_tokenizer_name(tok: Any, path: Path) -> str:
    """'qwen2' for a Qwen2/Qwen3 byte-level BPE tokenizer; anything else is refused."""
    pre = _state(tok.pre_tokenizer)
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    split = parts[0] if parts else {}
    byte_level = parts[1] if len(parts) > 1 else {}
    if (
        type(tok.model).__name__ == "BPE"
        and not tok.model.byte_fallback
        and len(parts) == 2
        and split.get("type") == "Split"
        and (split.get("pattern") or {}).get("Regex") == QWEN2_SPLIT_REGEX
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("use_regex") is False
        and not byte_level.get("add_prefix_space")
        and _state(tok.normalizer).get("type") == "NFC"
    ):
        return "qwen2"
    raise UnsupportedModelError(
        "the tokenizer is not a Qwen2/Qwen3 byte-level BPE tokenizer (the only kind the "
        "native engine writes)",
        path=path,
        hint=ENGINE_HINT,
    )


def _add_token_flags(
    post: dict[str, Any], tokenizer_config: dict[str, Any], types: Iterable[str], path: Path
) -> dict[str, bool]:
    """add_bos/add_eos/... as the pinned gguf-py decides them.

    A byte-level post-processor adds nothing (bos/eos False) and wins over tokenizer_config;
    tokenizer_config fills in the rest.
    """
    flags: dict[str, bool] = {}
    if post:
        for proc in post.get("processors", [post]):
            if proc.get("type") != "ByteLevel":
                raise UnsupportedModelError(
                    f"tokenizer post-processor {proc.get('type')!r} is not handled by the "
                    "native engine",
                    path=path,
                    hint=ENGINE_HINT,
                )
            flags.setdefault("bos", False)
            flags.setdefault("eos", False)
    for typ in types:
        value = tokenizer_config.get(f"add_{typ}_token")
        if isinstance(value, bool) and typ not in flags:
            flags[typ] = value
    return flags


def read_vocab(tokenizer_dir: Path, config: dict[str, Any], vocab_size: int) -> Vocab:
    """Tokens, token types, pre-tokenizer and special vocab, as llama.cpp writes them."""
    from tokenizers import Tokenizer

    tokenizer_dir = Path(tokenizer_dir)
    tj_path = tokenizer_dir / "tokenizer.json"
    tc_path = tokenizer_dir / "tokenizer_config.json"
    if (tokenizer_dir / "tokenizer.model").is_file():
        raise UnsupportedModelError(
            "a sentencepiece tokenizer.model is present; llama.cpp would write a "
            "sentencepiece vocabulary, which the native engine does not",
            path=tokenizer_dir / "tokenizer.model",
            hint=ENGINE_HINT,
        )
    tokenizer_config = _read_json(tc_path, "tokenizer_config.json")
    if not isinstance(tokenizer_config, dict):
        raise InputError("tokenizer_config.json is not a JSON object", path=tc_path)
    if not tj_path.is_file():
        raise InputError("tokenizer.json is missing", path=tj_path)
    try:
        tok = Tokenizer.from_file(str(tj_path))
    except Exception as exc:  # noqa: BLE001 - the library's own parse error, one line
        msg = " ".join(str(exc).split())
        raise InputError(f"tokenizers cannot load it ({msg})", path=tj_path) from exc
    pre = pre_tokenizer_name(tok, tj_path)

    vocab = tok.get_vocab(with_added_tokens=True)
    if vocab and max(vocab.values()) >= vocab_size:
        raise InputError(
            f"tokenizer has token id {max(vocab.values())} but the config's vocab_size is "
            f"{vocab_size}",
            path=tj_path,
            hint="the tokenizer belongs to another model",
        )
    added = tok.get_added_tokens_decoder()  # id → AddedToken
    added_content = {t.content for t in added.values()}
    # transformers counts a token special when tokenizer.json, tokenizer_config's
    # added_tokens_decoder or a named special-token slot says so
    special_content = {t.content for t in added.values() if t.special}
    for entry in (tokenizer_config.get("added_tokens_decoder") or {}).values():
        if isinstance(entry, dict) and entry.get("special"):
            special_content.add(str(entry.get("content")))
    for key, value in tokenizer_config.items():
        if key.endswith("_token") and isinstance(value, str):
            special_content.add(value)
        elif key.endswith("_token") and isinstance(value, dict) and "content" in value:
            special_content.add(str(value["content"]))
    for key in ("additional_special_tokens", "extra_special_tokens"):
        for value in tokenizer_config.get(key) or []:
            special_content.add(value if isinstance(value, str) else str(value.get("content")))
    clean_up = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))

    reverse = {i: s for s, i in vocab.items()}
    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gguf.TokenType.UNUSED)
            continue
        if text in added_content:
            token = added.get(i)
            is_special = text in special_content or (token is not None and token.special)
            if token is not None and not token.normalized:
                # llama.cpp assumes added tokens are pre-normalized: round-trip them
                ids = tok.encode(text, add_special_tokens=False).ids
                decoded = tok.decode(ids, skip_special_tokens=False)
                text = _clean_up_spaces(decoded) if clean_up else decoded
            if is_special or _looks_special(text):
                toktypes.append(gguf.TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")  # user-defined spaces, pre-normalized
                toktypes.append(gguf.TokenType.USER_DEFINED)
        else:
            toktypes.append(gguf.TokenType.NORMAL)
        tokens.append(text)

    special = _BackboneSpecialVocab(tokenizer_dir, config)
    special.add_special_token = _add_token_flags(
        _state(tok.post_processor), tokenizer_config, special.special_token_types, tj_path
    )
    if not special.merges:
        raise InputError("tokenizer has no BPE merges", path=tj_path)
    return Vocab(tokens, toktypes, pre, special)


# --------------------------------------------------------------------------- writing


@dataclass
class GGUFPlan:
    """Everything a GGUF needs, decided and checked before a byte is written."""

    params: Qwen3Params
    tensors: list[GGUFTensor]
    vocab: Vocab
    outtype: OutType
    name: str

    @property
    def source_bytes(self) -> int:
        return sum(t.source.nbytes for t in self.tensors)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class _Writer(gguf.GGUFWriter):
    """GGUFWriter packing the big token/merge/type arrays in bulk: the same bytes, in a third
    of the time of packing 450k values one by one."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # type: ignore[override]
        fast = (
            vtype == gguf.GGUFValueType.ARRAY
            and sub_type is None
            and self.endianess == gguf.GGUFEndian.LITTLE
            and isinstance(val, list)
            and len(val) > 1024
        )
        if fast and all(type(x) is str for x in val):
            encoded = [x.encode("utf-8") for x in val]
            lengths = np.fromiter(map(len, encoded), dtype="<u8", count=len(encoded))
            body = b"".join(a + b for a, b in zip(_u64_bytes(lengths), encoded, strict=True))
            return _array_head(vtype, gguf.GGUFValueType.STRING, len(val), add_vtype) + body
        if fast and all(type(x) is int or type(x) is gguf.TokenType for x in val):
            body = np.asarray(val, dtype="<i4").tobytes()  # python ints are GGUF INT32
            return _array_head(vtype, gguf.GGUFValueType.INT32, len(val), add_vtype) + body
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _u64_bytes(values: np.ndarray) -> list[bytes]:
    raw = values.astype("<u8").tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


def _array_head(vtype: int, item_type: int, n: int, add_vtype: bool) -> bytes:
    head = struct.pack("<I", vtype) if add_vtype else b""
    return head + struct.pack("<IQ", item_type, n)


def build_writer(plan: GGUFPlan) -> gguf.GGUFWriter:
    """A GGUFWriter holding every key/value and tensor info, in llama.cpp's order."""
    hp = plan.params
    w = _Writer(path=None, arch=ARCH_NAME)
    total = sum(math.prod(t.shape) for t in plan.tensors)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(plan.name)
    w.add_size_label(gguf.size_label(total, total, 0, 0))
    w.add_block_count(hp.n_layers)
    w.add_context_length(hp.context)
    w.add_embedding_length(hp.hidden)
    w.add_feed_forward_length(hp.ff)
    w.add_head_count(hp.heads)
    w.add_head_count_kv(hp.kv_heads)
    w.add_rope_freq_base(hp.rope_theta)
    w.add_layer_norm_rms_eps(hp.rms_eps)
    w.add_key_length(hp.head_dim)
    w.add_value_length(hp.head_dim)
    w.add_file_type(plan.outtype.file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    v = plan.vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_types(v.toktypes)
    v.special.add_to_gguf(w, quiet=True)
    # (the pinned gguf-py also writes normalizer lowercase/strip-accent flags; an NFC
    # normalizer, the only one accepted above, sets neither)
    for t in plan.tensors:
        # logical shape + a non-uint8 dtype: GGUFWriter takes the shape as is
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    return w


def _read_exact(f, view: memoryview, src: SourceTensor) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise InputError(
                f"tensor {src.name!r} ends early",
                path=src.path,
                hint="the file is truncated or corrupt; copy or download it again",
            )
        got += n


def _nonfinite(src: SourceTensor) -> NumericError:
    return NumericError(
        f"tensor {src.name!r} holds NaN or Inf",
        path=src.path,
        hint="the checkpoint is damaged; download it again",
    )


def _f16_overflow(t: GGUFTensor, peak: float) -> NumericError:
    return NumericError(
        f"tensor {t.source.name!r} ({t.name}) has values beyond the float16 range "
        f"(|x| up to {peak:.6g} > 65504)",
        path=t.source.path,
        hint="use --outtype bf16 (or f32)",
    )


class _Scratch:
    """Working arrays reused chunk after chunk (fresh ones would cost page faults each time)."""

    def __init__(self, nbytes: int):
        self.raw = bytearray(nbytes)
        self._arrays: dict[str, np.ndarray] = {}

    def take(self, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        """An array of dtype and shape over this scratch's own buffer for that dtype."""
        key = np.dtype(dtype).str
        need = math.prod(shape)
        arr = self._arrays.get(key)
        if arr is None or arr.size < need:
            arr = self._arrays[key] = np.empty(max(need, len(self.raw) // 2), dtype=dtype)
        return arr[:need].reshape(shape)


def _bf16_peak_bits(raw: np.ndarray) -> int:
    """The largest |x| among bf16 bit patterns, as magnitude bits (sign cleared).

    Two read-only reductions instead of masking a copy: positive patterns are the
    non-negative int16 values, and the largest uint16 is the negative of largest magnitude.
    """
    if raw.size == 0:
        return 0
    pos = int(raw.view(np.int16).max())
    neg = int(raw.max())
    return max(pos if pos >= 0 else 0, neg - 0x8000 if neg >= 0x8000 else 0)


def check_bf16_rows(t: GGUFTensor, raw: np.ndarray) -> None:
    """Refuse NaN/Inf, and values that overflow t's f16, in rows of bf16 bit patterns."""
    top = _bf16_peak_bits(raw)  # finds NaN/Inf and f16 overflow alike
    if top >= 0x7F80:
        raise _nonfinite(t.source)
    if t.qtype == QT.F16 and top >= 0x4780:  # bf16 65536 and up are inf in f16; 65280 is not
        peak = float(np.left_shift(np.uint32(top), 16).view(np.float32))
        raise _f16_overflow(t, peak)


def _convert_rows(t: GGUFTensor, raw: np.ndarray, s: _Scratch) -> np.ndarray:
    """Turn rows in storage dtype into the bytes of t.qtype; refuse NaN/Inf and f16 overflow."""
    src, q = t.source, t.qtype
    if src.dtype == "BF16":
        check_bf16_rows(t, raw)
        if q == QT.BF16:
            return raw  # bf16 → f32 → bf16 is the identity for finite values
        if q == QT.F16:
            # ml_dtypes casts bf16 → f16 in one step, exactly as numpy's f32 → f16 rounds
            import ml_dtypes

            out = s.take(np.float16, raw.shape)
            np.copyto(out, raw.view(ml_dtypes.bfloat16), casting="unsafe")
            return out
        f32 = s.take(np.float32, raw.shape)
        np.left_shift(raw, 16, out=f32.view(np.uint32), dtype=np.uint32)
    else:
        f32 = s.take(np.float32, raw.shape)
        np.copyto(f32, raw, casting="unsafe")
        if not np.isfinite(f32).all():
            raise _nonfinite(src)
        if q == QT.F16:
            out = s.take(np.float16, raw.shape)
            with np.errstate(over="ignore"):
                np.copyto(out, f32, casting="unsafe")
            if not np.isfinite(out).all():
                raise _f16_overflow(t, float(np.abs(f32).max()))
            return out
    if q == QT.F32:
        return f32
    return gguf.quants.quantize(f32, q)


def _chunks(t: GGUFTensor) -> tuple[int, int, int]:
    """(rows, row bytes, rows per chunk) for streaming t's source."""
    src = t.source
    cols = src.shape[-1] if src.shape else 1
    rows = math.prod(src.shape[:-1]) if len(src.shape) > 1 else 1
    row_bytes = cols * _SOURCE_DTYPES[src.dtype].itemsize
    return rows, row_bytes, max(1, CHUNK_BYTES // row_bytes)


def _produce(
    tensors: list[GGUFTensor],
    ready: queue.Queue,
    free: queue.Queue,
    stop: threading.Event,
    pages: SourcePages | None = None,
    convert: Callable[[GGUFTensor, np.ndarray, _Scratch], np.ndarray] | None = None,
) -> None:
    """Read and convert chunk after chunk (with `convert`, default the intermediate's
    type); hand each to the writer through `ready`."""
    convert = convert or _convert_rows
    try:
        for t in tensors:
            src = t.source
            rows, row_bytes, per_chunk = _chunks(t)
            ready.put(("start", t))
            on_read = pages.reader("convert", src.path, src.offset, src.nbytes) if pages else None
            with open(src.path, "rb", buffering=0) as f:
                f.seek(src.offset)
                for start in range(0, rows, per_chunk):
                    scratch = free.get()
                    if stop.is_set():
                        return
                    n = min(per_chunk, rows - start)
                    if n * row_bytes > len(scratch.raw):  # one row bigger than a chunk
                        scratch = _Scratch(n * row_bytes)
                    view = memoryview(scratch.raw)[: n * row_bytes]
                    _read_exact(f, view, src)
                    if on_read is not None:
                        on_read((start + n) * row_bytes)
                    raw = np.frombuffer(view, dtype=_SOURCE_DTYPES[src.dtype])
                    data = convert(t, raw.reshape(n, -1), scratch)
                    ready.put(("data", np.ascontiguousarray(data), scratch, n * row_bytes))
            ready.put(("end", t))
        ready.put(("done",))
    except BaseException as exc:  # noqa: BLE001 - handed to the writer thread, raised there
        ready.put(("error", exc))


def write_tensor_data(
    out,
    tensors: list[GGUFTensor],
    alignment: int,
    on_tensor: Callable[[GGUFTensor, bool], None],
    on_bytes: Callable[[int], None],
    pages: SourcePages | None = None,
) -> int:
    """Append every tensor's data to out (positioned after the tensor infos), padded.

    A second thread reads and converts the next chunk while this one writes: reads, writes
    and the NumPy casts all release the GIL, so the two overlap on two cores.
    """
    pad = -out.tell() % alignment
    out.write(b"\0" * pad)
    written = pad
    ready: queue.Queue = queue.Queue()
    free: queue.Queue = queue.Queue()
    for _ in range(2):  # double buffering: bounded memory, one chunk in flight each way
        free.put(_Scratch(CHUNK_BYTES))
    stop = threading.Event()
    worker = threading.Thread(
        target=_produce,
        args=(tensors, ready, free, stop, pages),
        name="gguf-convert",
        daemon=True,
    )
    worker.start()
    done = 0
    try:
        while True:
            msg = ready.get()
            if msg[0] == "data":
                _, data, scratch, src_bytes = msg
                out.write(memoryview(data).cast("B"))
                done += data.nbytes
                free.put(scratch)
                on_bytes(src_bytes)
            elif msg[0] == "start":
                on_tensor(msg[1], False)
                done = 0
            elif msg[0] == "end":
                t = msg[1]
                if done != t.nbytes:  # a wrong size would only show as a corrupt file later
                    raise AssertionError(f"{t.name}: wrote {done} bytes, expected {t.nbytes}")
                pad = -t.nbytes % alignment
                out.write(b"\0" * pad)
                written += done + pad
                on_tensor(t, True)
                hold("convert")
            elif msg[0] == "error":
                raise msg[1]
            else:
                return written
    finally:
        stop.set()
        free.put(_Scratch(0))  # wake a worker waiting for a buffer; it sees `stop` and ends
        worker.join()


def write_header(path: Path, plan: GGUFPlan) -> tuple[int, int, int]:
    """Write the plan's header (key/values and tensor infos) to a new file at path.

    Returns (header bytes, data alignment, the size the whole file will have)."""
    writer = build_writer(plan)
    writer.write_header_to_file(path=Path(path))
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    alignment = writer.data_alignment
    writer.close()
    header = Path(path).stat().st_size
    data_start = header + (-header % alignment)
    size = data_start + sum(t.nbytes + (-t.nbytes % alignment) for t in plan.tensors)
    return header, alignment, size


def write_gguf(
    path: Path,
    plan: GGUFPlan,
    progress: ProgressReporter | None = None,
    pages: SourcePages | None = None,
) -> int:
    """Write the plan to path (which the caller renames into place); returns its size.

    With ``pages``, each source range is reported as read (`all` drops it from the page
    cache once every reader is past it).
    """
    bar = ensure(progress)
    header, alignment, size = write_header(path, plan)

    bar.start("convert:bytes", "convert", plan.source_bytes, "B")
    bar.start("convert:tensors", "tensors", len(plan.tensors), "")
    with open(path, "r+b") as out:
        out.seek(header)
        # kept in the page cache: quantize (or a first run) reads the GGUF next
        with appender(out, Path(path), header, size, keep_cached=True) as sink:
            write_tensor_data(
                sink,
                plan.tensors,
                alignment,
                on_tensor=lambda t, finished: bar.advance(
                    "convert:tensors", 1 if finished else 0, description=t.name
                ),
                on_bytes=lambda n: bar.advance("convert:bytes", n),
                pages=pages,
            )
        if sink.tell() != size or os.fstat(out.fileno()).st_size != size:
            raise AssertionError(f"wrote {sink.tell()} bytes, planned {size}")
    bar.finish("convert:tensors")
    bar.finish("convert:bytes")
    return size
