"""`verify`: check a converted MOSS-TTS model and report every check as a row.

TARGET is a weights folder (made by `layout`/`all`), a synth config YAML (its paths are
checked, relative to the YAML's folder), an `extract` output folder, or a single GGUF.
Model facts (n_vq, sizes, token ids) come from ``extraction_meta.json``'s ``moss_config``
or from ``--source``; the defaults of docs/ARCHITECTURE.md §2 apply only to keys that are absent.

A failing check is a row with status "fail", never an exception; exceptions are kept for
bad usage (a TARGET that does not exist or is not one of the four kinds, an unreadable
YAML, a --source that cannot be opened, --deep without torch).

Speed. Every file is read once, in chunks, by one worker thread per core, up to 8
(hashlib, file reads and the NumPy bit tests release the GIL): one pass hashes a file for
the manifest, tests a table's values and, with --source, compares it with its source
tensor (a file this process hashed already, as `all` does while writing, keeps that
digest: digests.py). The GGUF header is
parsed here rather than with ``gguf.GGUFReader``, which builds a Python object for every
one of the ~300k tokenizer array entries (16 s for the tiny model's header on the 2-core
test machine, against 0.1 s here); tensor data is read with ``os.pread`` and dequantized
with the ``gguf`` package's quant classes in row blocks sized for the CPU cache, on every
core. Without --source, the text head and text embedding tables are compared with the GGUF's
``output`` / ``token_embd`` on 512 sampled rows (32 evenly spread runs of 16): another
model's or a misplaced tensor measures a relative RMSE near 1.4 on any sample, while the cost
stays independent of the vocabulary; --source compares every row of every tensor.

Thresholds are calibrated on builtin:tiny (2 layers, Gaussian weights) quantized by the
pinned llama.cpp's llama-quantize: :data:`TENSOR_MAX_REL_RMSE`, :data:`DEEP_THRESHOLDS`,
:func:`bpw_range`. ``python benchmarks/verify.py calibrate`` measures them again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import mmap
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import TOKEN_DEFAULTS, MossCheckpoint, MossConfig, TensorRef, safe_child
from .digests import known_sha256, known_table, sha256_file
from .errors import InputError, MossGgufError, UsageError
from .extract import BACKBONE_DIR, EMBEDDING_DIR, LM_HEAD_DIR, META_NAME
from .layout import MANIFEST_NAME, TOKENIZER_DIR
from .progress import ProgressReporter, ensure
from .report import FAIL, PASS, WARN, CheckRows

log = logging.getLogger(__name__)


GROUPS = ("files", "tables", "manifest", "gguf", "tokenizer", "cross", "source", "deep")
TOKENIZER_REQUIRED = ("tokenizer.json", "tokenizer_config.json")
YAML_PATH_KEYS = ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir")
YAML_ONNX_KEYS = ("audio_encoder_onnx", "audio_decoder_onnx")
CODEC_ROW = "audio tokenizer"
CODEC_FIX = (
    "moss-gguf layout --output FOLDER --audio-tokenizer OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"
)
F16_MAX = 65504.0
CHUNK_BYTES = 16 << 20  # streaming read size per worker
WORKERS = max(1, min(os.cpu_count() or 1, 8))
# elements per dequantize call: K-quant dequantizing in NumPy is fastest with ~64-256k
# elements per call (temporaries stay in cache); gguf's own grouping of 16 rows is ~4x
# slower on 256-wide rows
_DEQUANT_ELEMS = 1 << 17
_BLOCK_ELEMS = 1 << 22  # elements per worker task when comparing with the source
ROUND_TRIP_TEXT = "Hello, world! Verify 123 — 你好，世界。"

# ----------------------------------------------------------------------------- thresholds

# Per tensor type: the largest relative RMSE (||q - s|| / ||s||) a GGUF tensor may have,
# dequantized, against its source tensor. The cosine limit follows from it: for an error
# uncorrelated with the weights cos = 1 / sqrt(1 + rel²), so min cosine = 1 / sqrt(1 + max²)
# (a scaled or rotated tensor fails it even when its RMSE passes). Calibrated on builtin:tiny
# (Gaussian weights) with the pinned llama-quantize over 23 file types: the worst tensor of
# each type is in the comment; each limit is ~2.5x that, room for the heavier tails of trained
# weights. A tensor of another model or another position measures ≈ 1.41 / cosine ≈ 0.
TENSOR_MAX_REL_RMSE: dict[str, float] = {
    "F32": 1e-6,  # bf16/f16 -> f32 is exact: measured 0
    "F16": 1e-3,  # bf16 -> f16 is exact for normal values: measured 0
    "BF16": 1e-6,  # an exact copy: measured 0
    "Q8_0": 0.015,  # measured 0.0054
    "Q6_K": 0.045,  # 0.0178
    "Q5_K": 0.09,  # 0.0363
    "Q5_1": 0.095,  # 0.0380
    "Q5_0": 0.11,  # 0.0431
    "Q4_K": 0.18,  # 0.0718
    "Q4_1": 0.2,  # 0.0786
    "IQ4_NL": 0.2,  # 0.0766
    "IQ4_XS": 0.2,  # 0.0772
    "Q4_0": 0.22,  # 0.0865
    "Q3_K": 0.38,  # 0.1527
    "IQ3_S": 0.42,  # 0.1677
    "Q2_K": 0.7,  # 0.2982
    # ternary types keep only ternary-trained weights: MOSS's measure 0.815 and fail, rightly
    "TQ1_0": 0.5,
    "TQ2_0": 0.5,
}
# types llama-quantize makes only with an importance matrix (IQ3_XXS, IQ2_*, IQ1_*) were not
# measured; they get this limit, still far from another model's 1.41
DEFAULT_MAX_REL_RMSE = 0.9

# --deep: llama.cpp's final hidden state and audio-head logits against the torch reference,
# per class of GGUF file type: (min cosine of the hidden states, min cosine of the audio
# logits over the n_vq heads, min top-1 agreement over prompt rows × heads). Measured on
# builtin:tiny (19 prompt rows), worst of each class: F16/BF16/F32 0.999999 / 0.999999 /
# 0.997; Q8_0 0.99998 / 0.99998 / 0.990; Q6_K, Q5_* 0.99929 / 0.99924 / 0.939; Q4_*, IQ4_*
# 0.99760 / 0.99736 / 0.883; Q3_K_*, IQ3_*, Q2_K 0.98690 / 0.98583 / 0.727. A GGUF of another
# model (same dims, other seed) measures 0.73 / 0.71 / 0.11: tiny's hidden state keeps much of
# its input through two layers, so the hidden-state limits sit above 0.73.
DEEP_THRESHOLDS: dict[str, tuple[float, float, float]] = {
    "float": (0.9995, 0.999, 0.95),
    "8bit": (0.998, 0.995, 0.9),
    "5-6bit": (0.99, 0.98, 0.75),
    "4bit": (0.98, 0.96, 0.6),
    "low": (0.95, 0.93, 0.4),  # 3 bits and below
}


def tensor_threshold(type_name: str) -> tuple[float, float]:
    """(max relative RMSE, min cosine) for a tensor of this type against its source."""
    limit = TENSOR_MAX_REL_RMSE.get(type_name, DEFAULT_MAX_REL_RMSE)
    # float32 dot products resolve a cosine to ~1e-6: exact types are held by their RMSE
    return limit, min(1.0 / math.sqrt(1.0 + limit * limit), 1.0 - 1e-5)


def _type_bpw(type_name: str) -> float:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return size * 8 / block


# file type -> its main tensor type, where the names differ (Q4_K_M -> Q4_K, IQ3_M -> IQ3_S)
_FTYPE_BASE_OVERRIDES = {"IQ3_XS": "IQ3_S", "IQ3_M": "IQ3_S", "IQ2_M": "IQ2_S", "Q2_K_S": "Q2_K"}


def file_type_base(ftype_name: str) -> str | None:
    """The tensor type most of a file type's weights get: MOSTLY_Q4_K_M -> Q4_K."""
    import gguf

    name = ftype_name
    for prefix in ("MOSTLY_", "ALL_"):
        name = name.removeprefix(prefix)
    name = _FTYPE_BASE_OVERRIDES.get(name, name)
    types = gguf.GGMLQuantizationType.__members__
    if name in types:
        return name
    stem = name.rsplit("_", 1)[0]  # Q4_K_M -> Q4_K
    return stem if stem in types else None


def bpw_range(ftype_name: str) -> tuple[float, float] | None:
    """Bits per weight (all tensor bytes × 8 / all elements) llama.cpp produces for a file type.

    Low end: the base type itself (a model made only of layers approaches it). High end: the
    wider of the base type and Q6_K, since llama-quantize writes the output head (and the
    attn_v / ffn_down of some layers) in Q6_K, and on a model dominated by its vocabulary
    (builtin:tiny: token_embd and output are 98% of the weights) bpw approaches the mean of
    the two. Calibrated with llama-quantize on builtin:tiny: Q2_K 4.56, Q3_K_S/M/L 4.97-4.98,
    Q4_0 5.51, Q4_1 5.77, Q5_0 6.02, Q5_1 6.28, Q4_K_S/M 5.51/5.52, Q5_K_S/M 6.02, Q6_K 6.56,
    Q8_0 8.50, IQ4_NL 5.51, IQ4_XS 5.38, IQ3_S/M 4.97, TQ1_0/TQ2_0 5.46, F16/BF16 16.00,
    F32 32.00; the guide's real MOSS-TTS figures: Q4_K_M 4.91, Q5_K_M 5.69, Q6_K 6.56,
    Q8_0 8.50. All lie inside the ranges.
    """
    base = file_type_base(ftype_name)
    if base is None:
        return None
    low = _type_bpw(base)
    if base in ("F32", "F16", "BF16"):
        return (low - 0.01, low + 0.1)  # f32 norms add a hair
    high = max(low, _type_bpw("Q6_K"))
    return (low - 0.05, high + 0.2)


def deep_class(ftype_name: str | None) -> str:
    base = file_type_base(ftype_name) if ftype_name else None
    if base in ("F32", "F16", "BF16"):
        return "float"
    if base == "Q8_0":
        return "8bit"
    if base in ("Q6_K", "Q5_K", "Q5_0", "Q5_1"):
        return "5-6bit"
    if base in ("Q4_K", "Q4_0", "Q4_1", "IQ4_NL", "IQ4_XS"):
        return "4bit"
    return "low"


# ----------------------------------------------------------------------------- report


@dataclass
class CheckRow:
    name: str
    status: str  # "pass" | "warn" | "fail"
    detail: str
    group: str


@dataclass
class TensorQuality:
    """One GGUF tensor dequantized and compared with its source tensor."""

    gguf: str
    name: str
    source: str
    type: str
    rel_rmse: float
    cosine: float
    max_rel_rmse: float
    min_cosine: float

    @property
    def ok(self) -> bool:
        return self.rel_rmse <= self.max_rel_rmse and self.cosine >= self.min_cosine

    @property
    def badness(self) -> float:
        """How close to its threshold (1.0 = at the limit)."""
        if not math.isfinite(self.rel_rmse) or self.max_rel_rmse <= 0:
            return math.inf
        return self.rel_rmse / self.max_rel_rmse


@dataclass
class QualitySummary:
    tensors: list[TensorQuality] = field(default_factory=list)

    @property
    def by_type(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for t in sorted({q.type for q in self.tensors}):
            mine = [q for q in self.tensors if q.type == t]
            out[t] = {
                "tensors": len(mine),
                "mean_rel_rmse": float(np.mean([q.rel_rmse for q in mine])),
                "max_rel_rmse": max(q.rel_rmse for q in mine),
                "mean_cosine": float(np.mean([q.cosine for q in mine])),
                "min_cosine": min(q.cosine for q in mine),
                "threshold_rel_rmse": mine[0].max_rel_rmse,
                "threshold_cosine": mine[0].min_cosine,
            }
        return out

    def worst(self, n: int = 5) -> list[TensorQuality]:
        return sorted(self.tensors, key=lambda q: q.badness, reverse=True)[:n]


@dataclass
class DeepResult:
    gguf: str
    file_type: str | None
    rows: int  # prompt rows fed
    hidden_cosine_min: float
    hidden_cosine_mean: float
    logits_cosine_min: float  # over the n_vq audio heads
    top1_agreement: float  # over rows × heads
    thresholds: tuple[float, float, float]


@dataclass
class VerifyReport(CheckRows):
    target: Path
    kind: str  # weights | config | extract | gguf
    rows: list[CheckRow] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    quality: QualitySummary | None = None
    deep: list[DeepResult] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        quality = None
        if self.quality is not None and self.quality.tensors:
            quality = {
                "by_type": self.quality.by_type,
                "worst": [_qdict(q) for q in self.quality.worst()],
                "tensors": [_qdict(q) for q in self.quality.tensors],
            }
        return _json_safe(
            {
                "target": str(self.target),
                "kind": self.kind,
                "ok": self.ok,
                "counts": self.counts,
                "seconds": round(self.seconds, 3),
                "model": self.model,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "quality": quality,
                "deep": [dataclasses.asdict(d) for d in self.deep] or None,
            }
        )


def _qdict(q: TensorQuality) -> dict[str, Any]:
    return {**dataclasses.asdict(q), "ok": q.ok}


def _json_safe(value: Any) -> Any:
    """JSON has no Inf/NaN: such floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return _json_safe(value.item())
    return value


class _Rows:
    """Collects rows; the group is set per section."""

    def __init__(self) -> None:
        self.rows: list[CheckRow] = []
        self.group = ""

    def add(self, name: str, status: str, detail: str) -> CheckRow:
        row = CheckRow(name, status, " ".join(detail.split()), self.group)
        self.rows.append(row)
        return row

    def check(self, name: str, problems: list[str], ok_detail: str, *, warn=()) -> CheckRow:
        """fail with the problems listed, else warn with the warnings, else pass."""
        if problems:
            return self.add(name, FAIL, _listing(problems))
        if warn:
            return self.add(name, WARN, _listing(list(warn)))
        return self.add(name, PASS, ok_detail)


def _listing(items: list[str], limit: int = 4) -> str:
    shown = "; ".join(items[:limit])
    return shown + (f"; … {len(items) - limit} more" if len(items) > limit else "")


# ----------------------------------------------------------------------------- target


@dataclass
class Target:
    """Where each part of the model is, for whichever kind TARGET is."""

    kind: str
    path: Path
    root: Path  # folder relative names are shown against
    ggufs: list[Path] = field(default_factory=list)
    embedding_dir: Path | None = None
    lm_head_dir: Path | None = None
    tokenizer_dir: Path | None = None
    meta: Path | None = None
    manifest: Path | None = None
    backbone_dir: Path | None = None
    yamls: list[Path] = field(default_factory=list)  # synth configs to check
    yaml_problems: list[str] = field(default_factory=list)
    codec_problems: list[str] = field(default_factory=list)


def _is_gguf_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def find_target(target: Path) -> Target:
    """Decide what TARGET is; InputError if it is none of the four kinds."""
    path = Path(target).expanduser()
    if not path.exists():
        raise InputError(
            "verify target not found",
            path=path,
            hint="pass a weights folder, a synth config YAML, an extract folder or a GGUF",
        )
    if path.is_file():
        if path.suffix.lower() in (".yaml", ".yml"):
            return _yaml_target(path)
        if path.suffix.lower() == ".gguf" or _is_gguf_file(path):
            return Target("gguf", path, path.parent, ggufs=[path])
        raise InputError(
            "not a GGUF or a synth config YAML",
            path=path,
            hint="pass a weights folder, a synth config YAML, an extract folder or a GGUF",
        )
    if (path / META_NAME).is_file() and (path / BACKBONE_DIR).is_dir():
        return Target(
            "extract",
            path,
            path,
            embedding_dir=path / EMBEDDING_DIR,
            lm_head_dir=path / LM_HEAD_DIR,
            tokenizer_dir=path / BACKBONE_DIR,
            meta=path / META_NAME,
            backbone_dir=path / BACKBONE_DIR,
        )
    ggufs = sorted(p for p in path.glob("*.gguf") if p.is_file())
    markers = [path / META_NAME, path / MANIFEST_NAME, path / EMBEDDING_DIR, path / LM_HEAD_DIR]
    if ggufs or any(m.exists() for m in markers):
        t = Target(
            "weights",
            path,
            path,
            ggufs=ggufs,
            embedding_dir=path / EMBEDDING_DIR,
            lm_head_dir=path / LM_HEAD_DIR,
            tokenizer_dir=path / TOKENIZER_DIR,
            meta=path / META_NAME,
            manifest=path / MANIFEST_NAME if (path / MANIFEST_NAME).is_file() else None,
        )
        t.yamls = sorted(p for p in path.glob("*.yaml") if p.is_file())
        for y in t.yamls:  # layout writes one per GGUF; each must point at files that exist
            try:
                _check_yaml(t, y, adopt=False)
            except InputError as exc:
                t.yaml_problems.append(f"{y.name}: {exc.message}")
        return t
    raise InputError(
        "not a weights folder, extract folder, synth config or GGUF (no extraction_meta.json, "
        "manifest.json, embeddings/ or *.gguf)",
        path=path,
        hint="pass the folder `moss-gguf layout` or `all` wrote",
    )


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(
            f"cannot read the YAML ({' '.join(str(exc).split())})",
            path=path,
            hint="pass a synth config written by `moss-gguf layout`",
        ) from exc
    if not isinstance(data, dict):
        raise InputError("the YAML is not a mapping of settings", path=path)
    return data


def _yaml_path(value: Any, base: Path) -> Path | None:
    if not isinstance(value, str) or not value.strip():
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _check_yaml(t: Target, path: Path, adopt: bool) -> dict[str, Any]:
    """Record what a synth YAML points at that is missing (paths relative to its folder);
    with ADOPT, the target's parts become what the YAML names."""
    data = _load_yaml(path)
    base = path.parent

    def problem(text: str) -> None:
        t.yaml_problems.append(f"{path.name}: {text}")

    for key in YAML_PATH_KEYS + YAML_ONNX_KEYS:
        value = data.get(key)
        onnx = key in YAML_ONNX_KEYS
        report = t.codec_problems.append if onnx else problem
        if value is None:
            report(f"{path.name}: {key} is not set" if onnx else f"{key} is not set")
            continue
        p = _yaml_path(value, base)
        if p is None:
            problem(f"{key} is not a path ({value!r})")
            continue
        is_dir = key.endswith("_dir")
        if not (p.is_dir() if is_dir else p.is_file()):
            msg = f"{key} points at a missing {_rel(p, base)}"
            report(f"{path.name}: {msg}" if onnx else msg)
        if adopt and key in YAML_PATH_KEYS:
            if key == "backbone_gguf":
                t.ggufs = [p]
            else:
                setattr(t, key, p)
    return data


def _yaml_target(path: Path) -> Target:
    t = Target("config", path, path.parent, yamls=[path])
    data = _check_yaml(t, path, adopt=True)
    if not any(k in data for k in YAML_PATH_KEYS):
        raise InputError(
            "not a synth config: none of " + ", ".join(YAML_PATH_KEYS) + " is set",
            path=path,
            hint="pass a synth config written by `moss-gguf layout`",
        )
    candidates = []
    model_config = _yaml_path(data.get("model_config"), path.parent)
    if model_config is not None:
        candidates.append(model_config)
    candidates.append(path.parent / META_NAME)
    if t.embedding_dir is not None:
        candidates.append(t.embedding_dir.parent / META_NAME)
    t.meta = next((c for c in candidates if c.is_file()), candidates[0])
    if (path.parent / MANIFEST_NAME).is_file():
        t.manifest = path.parent / MANIFEST_NAME
    return t


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- model facts


@dataclass
class Facts:
    """What the files must agree with, and where it was read."""

    origin: str
    moss: MossConfig | None = None
    params: Any = None  # gguf_write.Qwen3Params: the backbone as llama.cpp's converter sees it
    language: dict[str, Any] = field(default_factory=dict)
    n_vq: int | None = None

    @property
    def hidden(self) -> int | None:
        return self.params.hidden if self.params else (self.moss.hidden_size if self.moss else None)

    @property
    def vocab(self) -> int | None:
        return self.params.vocab if self.params else (self.moss.vocab_size if self.moss else None)

    @property
    def audio_rows(self) -> int | None:
        return self.moss.audio_rows if self.moss else None

    def token_ids(self) -> dict[str, int]:
        if self.moss is not None:
            return {k: getattr(self.moss, k) for k in TOKEN_DEFAULTS}
        return dict(TOKEN_DEFAULTS)  # ARCHITECTURE.md §2 defaults when no config says otherwise

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.origin, "n_vq": self.n_vq}
        if self.moss is not None:
            out.update(variant=self.moss.variant, audio_vocab_size=self.moss.audio_vocab_size)
        if self.params is not None:
            out.update(
                hidden_size=self.params.hidden,
                vocab_size=self.params.vocab,
                num_hidden_layers=self.params.n_layers,
            )
        return out


def facts_from_config(config: dict[str, Any], origin: str, path: Path | None = None) -> Facts:
    from .gguf_write import Qwen3Params

    moss = MossConfig.from_dict(config, path)
    try:
        params = Qwen3Params.from_config(dict(config["language_config"]), path)
    except MossGgufError:
        params = None  # a config the native converter refuses: compare what MossConfig knows
    return Facts(origin, moss, params, dict(config["language_config"]), moss.n_vq)


def _meta_facts(meta_path: Path | None, rows: _Rows) -> tuple[Facts | None, dict[str, Any]]:
    if meta_path is None:
        return None, {}
    if not meta_path.is_file():
        rows.add(
            "model facts",
            FAIL,
            f"{meta_path.name} is missing: n_vq, sizes and token ids "
            "are unknown (re-run layout, or pass --source)",
        )
        return None, {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or not isinstance(meta.get("moss_config"), dict):
            raise ValueError("no moss_config section")
        facts = facts_from_config(meta["moss_config"], meta_path.name, meta_path)
    except (OSError, UnicodeDecodeError, ValueError, MossGgufError) as exc:
        msg = exc.message if isinstance(exc, MossGgufError) else str(exc)
        rows.add("model facts", FAIL, f"{meta_path.name} is unreadable: {msg}")
        return None, {}
    return facts, meta


# ----------------------------------------------------------------------------- GGUF header

# GGUF value types: struct formats of the scalars; 8 is a string, 9 an array
_SCALARS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GgufFormatError(Exception):
    pass


@dataclass(frozen=True)
class GgufArray:
    """An array value, not decoded: its item type, length and where its items start."""

    itype: int
    count: int
    offset: int


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length
    type_name: str
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def n_rows(self) -> int:
        return math.prod(self.dims[1:]) if len(self.dims) > 1 else 1

    @property
    def row_bytes(self) -> int:
        import gguf

        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.type_name]]
        return self.dims[0] // block * size

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.n_rows


@dataclass
class GgufFile:
    path: Path
    size: int
    version: int
    endian: str
    kv: dict[str, Any]
    tensors: dict[str, GgufTensorInfo]
    data_offset: int
    alignment: int

    @property
    def data_end(self) -> int:
        ends = [t.offset + t.nbytes for t in self.tensors.values()]
        return self.data_offset + max(ends, default=0)

    @property
    def arch(self) -> str | None:
        value = self.kv.get("general.architecture")
        return value if isinstance(value, str) else None

    def abs_offset(self, t: GgufTensorInfo) -> int:
        return self.data_offset + t.offset

    def in_file(self, t: GgufTensorInfo) -> bool:
        return self.abs_offset(t) + t.nbytes <= self.size

    def strings(self, key: str, wanted: Iterable[int] = ()) -> dict[int, str]:
        """Items of a string array (only the indices in WANTED), read from the file."""
        arr = self.kv.get(key)
        want = set(wanted)
        if not isinstance(arr, GgufArray) or arr.itype != _STRING or not want:
            return {}
        out: dict[int, str] = {}
        last = max(want)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = arr.offset
            fmt = self.endian + "Q"
            for i in range(min(arr.count, last + 1)):
                (n,) = struct.unpack_from(fmt, mm, pos)
                if i in want:
                    out[i] = mm[pos + 8 : pos + 8 + n].decode("utf-8", "replace")
                pos += 8 + n
        return out


def read_gguf(path: Path) -> GgufFile:
    """Parse a GGUF header (key/values with arrays skipped, tensor infos); GgufFormatError
    names what is wrong. Tensor data is not touched."""
    import gguf

    size = path.stat().st_size
    if size < 24:
        raise GgufFormatError(f"only {size} bytes: not a GGUF")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise GgufFormatError("bad magic bytes: not a GGUF file")
        version = struct.unpack_from("<I", mm, 4)[0]
        endian = "<"
        if version & 0xFFFF == 0:  # a big-endian file
            version, endian = struct.unpack_from(">I", mm, 4)[0], ">"
        if version not in (2, 3):
            raise GgufFormatError(f"unsupported GGUF version {version}")
        pos = 8

        def take(fmt: str) -> Any:
            nonlocal pos
            value = struct.unpack_from(endian + fmt, mm, pos)[0]
            pos += struct.calcsize(fmt)
            return value

        def string() -> str:
            nonlocal pos
            n = take("Q")
            if pos + n > size:
                raise GgufFormatError("header ends inside a string")
            s = mm[pos : pos + n].decode("utf-8", "replace")
            pos += n
            return s

        def skip_array(itype: int, count: int) -> None:
            nonlocal pos
            if itype in _SCALARS:
                pos += count * struct.calcsize(_SCALARS[itype])
            elif itype == _STRING:
                fmt = endian + "Q"
                for _ in range(count):
                    pos += 8 + struct.unpack_from(fmt, mm, pos)[0]
            else:
                raise GgufFormatError(f"unsupported array item type {itype}")
            if pos > size:
                raise GgufFormatError("header ends inside an array")

        try:
            n_tensors, n_kv = take("Q"), take("Q")
            if n_tensors > 1 << 24 or n_kv > 1 << 24:
                raise GgufFormatError(f"implausible counts ({n_tensors} tensors, {n_kv} keys)")
            kv: dict[str, Any] = {}
            for _ in range(n_kv):
                key = string()
                vtype = take("I")
                if vtype in _SCALARS:
                    kv[key] = take(_SCALARS[vtype])
                elif vtype == _STRING:
                    kv[key] = string()
                elif vtype == _ARRAY:
                    itype, count = take("I"), take("Q")
                    kv[key] = GgufArray(itype, count, pos)
                    skip_array(itype, count)
                else:
                    raise GgufFormatError(f"key {key!r} has unknown value type {vtype}")
            tensors: dict[str, GgufTensorInfo] = {}
            for _ in range(n_tensors):
                name = string()
                n_dims = take("I")
                if n_dims > 8:
                    raise GgufFormatError(f"tensor {name!r} has {n_dims} dimensions")
                dims = tuple(take("Q") for _ in range(n_dims))
                type_id, offset = take("I"), take("Q")
                try:
                    qtype = gguf.GGMLQuantizationType(type_id)
                except ValueError:
                    raise GgufFormatError(
                        f"tensor {name!r} has unknown type id {type_id}"
                    ) from None
                block = gguf.GGML_QUANT_SIZES[qtype][0]
                if not dims or dims[0] % block:
                    raise GgufFormatError(
                        f"tensor {name!r}: row length {dims[:1]} does not split into "
                        f"{qtype.name} blocks of {block}"
                    )
                tensors[name] = GgufTensorInfo(name, dims, qtype.name, offset)
        except (struct.error, IndexError):
            raise GgufFormatError(f"the header ends early ({size} bytes)") from None
        align = kv.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        data_offset = -(-pos // align) * align
    return GgufFile(path, size, version, endian, kv, tensors, data_offset, align)


def _file_type_name(g: GgufFile) -> str | None:
    import gguf

    value = g.kv.get("general.file_type")
    if not isinstance(value, int):
        return None
    try:
        return gguf.LlamaFileType(value).name
    except ValueError:
        return None


# ----------------------------------------------------------------------------- tensor data


def _quant_class(type_name: str):
    """gguf's quant class for a type (its dequantize_rows takes any number of rows)."""
    from gguf import quants

    cls = getattr(quants, type_name, None)
    if cls is None or not hasattr(cls, "dequantize_rows"):
        return None
    cls.init_grid()
    return cls


def dequantize_rows(raw: np.ndarray, type_name: str) -> np.ndarray:
    """(rows, row_bytes) uint8 → (rows, row_len) float32, with the gguf package."""
    import gguf

    if type_name == "F32":
        return raw.view(np.float32)
    if type_name == "F16":
        return raw.view(np.float16).astype(np.float32)
    if type_name == "BF16":
        return np.left_shift(raw.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
    cls = _quant_class(type_name)
    if cls is not None:
        return cls.dequantize_rows(raw)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])


_SOURCE_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


def _to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return np.left_shift(raw, 16, dtype=np.uint32).view(np.float32)
    return raw.astype(np.float32)


def _pread(fd: int, nbytes: int, offset: int) -> bytes:
    """Exactly nbytes at offset, or fewer if the file ends (the caller checks)."""
    parts = []
    while nbytes > 0:
        chunk = os.pread(fd, nbytes, offset)
        if not chunk:
            break
        parts.append(chunk)
        nbytes -= len(chunk)
        offset += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Sums:
    """Σd², Σs², Σq², Σqs of a tensor compared block by block (float64 totals)."""

    def __init__(self) -> None:
        self.dd = self.ss = self.qq = self.qs = 0.0
        self.lock = threading.Lock()

    def add(self, q: np.ndarray, s: np.ndarray) -> None:
        q, s = q.reshape(-1), s.reshape(-1)
        d = q - s
        dd, ss, qq, qs = (float(np.dot(a, b)) for a, b in ((d, d), (s, s), (q, q), (q, s)))
        with self.lock:
            self.dd += dd
            self.ss += ss
            self.qq += qq
            self.qs += qs

    def result(self) -> tuple[float, float]:
        """(relative RMSE, cosine similarity)."""
        if self.ss == 0:
            rel = 0.0 if self.dd == 0 else math.inf
        else:
            rel = math.sqrt(self.dd / self.ss)
        denom = math.sqrt(self.qq * self.ss)
        cos = self.qs / denom if denom > 0 else (1.0 if self.dd == 0 else 0.0)
        return rel, cos


def _compare_block(
    g_fd: int,
    g: GgufFile,
    t: GgufTensorInfo,
    row0: int,
    row1: int,
    source_rows: Callable[[int, int], np.ndarray],
    sums: _Sums,
) -> None:
    """Dequantize GGUF rows [row0, row1) and add their comparison with the source rows."""
    n = row1 - row0
    raw = _pread(g_fd, n * t.row_bytes, g.abs_offset(t) + row0 * t.row_bytes)
    q_all = np.frombuffer(raw, dtype=np.uint8).reshape(n, t.row_bytes)
    src = source_rows(row0, row1)
    step = max(1, _DEQUANT_ELEMS // t.dims[0])
    with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN become a failing figure
        for a in range(0, n, step):
            q = dequantize_rows(q_all[a : a + step], t.type_name)
            sums.add(q, src[a : a + step])


def _row_reader(path: Path, offset: int, row_len: int, dtype: str, fd: int):
    """source_rows(row0, row1) → float32 rows of a row-major tensor stored at offset."""
    np_dtype = _SOURCE_DTYPES[dtype]
    row_bytes = row_len * np_dtype.itemsize

    def read(row0: int, row1: int) -> np.ndarray:
        raw = _pread(fd, (row1 - row0) * row_bytes, offset + row0 * row_bytes)
        if len(raw) != (row1 - row0) * row_bytes:
            raise InputError("tensor data ends early", path=path)
        arr = np.frombuffer(raw, dtype=np_dtype).reshape(row1 - row0, row_len)
        return _to_f32(arr, dtype)

    return read


# ----------------------------------------------------------------------------- the file pass


@dataclass
class _FileJob:
    rel: str
    path: Path
    table: bool = False
    shape: tuple[int, int] | None = None  # expected, for a table
    source: TensorRef | None = None  # for a table, with --source
    sha256: str | None = None  # expected, from the manifest
    gguf: GgufFile | None = None  # a GGUF whose tensor values are scanned


@dataclass
class _FileResult:
    job: _FileJob
    size: int = 0
    sha256: str | None = None
    error: str | None = None  # unreadable file
    header_error: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    fortran: bool = False
    data_offset: int = 0
    expected_size: int | None = None
    nonfinite: int = 0
    first_nonfinite_row: int | None = None
    beyond_f16: int = 0  # float32 values a float16 table could not hold
    source_problem: str | None = None
    gguf_nonfinite: list[str] = field(default_factory=list)  # tensors holding Inf/NaN
    gguf_unscanned: set[str] = field(default_factory=set)  # types without a known layout


def _read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    return tuple(shape), bool(fortran), np.dtype(dtype), f.tell()


def _nonfinite_f16(bits: np.ndarray, scratch: np.ndarray) -> np.ndarray | None:
    """Positions whose exponent bits are all ones (Inf/NaN in float16), or None."""
    np.bitwise_and(bits, 0x7C00, out=scratch)
    if int(scratch.max(initial=0)) != 0x7C00:
        return None
    return np.flatnonzero(scratch == 0x7C00)


def _stream_file(job: _FileJob, on_bytes: Callable[[int], None]) -> _FileResult:
    """One read of a file: sha256 (if the manifest lists it); for a table its header,
    length, values and (with --source) equality with its source tensor."""
    res = _FileResult(job)
    try:
        res.size = job.path.stat().st_size
        if job.table and job.source is None and (written := known_table(job.path)):
            # written by this process, which checked every value as it wrote it
            facts, digest = written
            res.shape, res.dtype, res.data_offset = facts.shape, facts.dtype, facts.data_offset
            data = math.prod(facts.shape) * np.dtype(facts.dtype).itemsize
            res.expected_size = facts.data_offset + data
            res.sha256 = digest if job.sha256 is not None else None
            on_bytes(res.size)
            return res
        known = known_sha256(job.path) if job.sha256 is not None else None
        if known is not None:  # hashed by this process as it wrote or listed the file
            res.sha256, job = known, dataclasses.replace(job, sha256=None)
        if job.gguf is not None:
            _stream_gguf(job, res, on_bytes)
            return res
        if not job.table:
            if job.sha256 is not None:
                res.sha256 = sha256_file(job.path)
            on_bytes(res.size)
            return res
        with open(job.path, "rb", buffering=0) as f:
            digest = hashlib.sha256() if job.sha256 is not None else None
            try:
                shape, fortran, dtype, offset = _read_npy_header(f)
            except (ValueError, OSError, SyntaxError, EOFError) as exc:
                res.header_error = " ".join(str(exc).split())[:120]
                if digest is not None:
                    f.seek(0)
                    while chunk := f.read(CHUNK_BYTES):
                        digest.update(chunk)
                    res.sha256 = digest.hexdigest()
                on_bytes(res.size)
                return res
            res.shape, res.fortran, res.dtype, res.data_offset = shape, fortran, dtype.str, offset
            res.expected_size = offset + math.prod(shape) * dtype.itemsize
            if digest is not None:
                f.seek(0)
                digest.update(f.read(offset))
            _stream_table(f, res, dtype, digest, on_bytes)
            on_bytes(offset)
            if digest is not None:
                res.sha256 = digest.hexdigest()
    except OSError as exc:
        res.error = exc.strerror or str(exc)
    return res


def _stream_table(f, res: _FileResult, dtype: np.dtype, digest, on_bytes) -> None:
    job = res.job
    item = dtype.itemsize
    row_len = res.shape[-1] if res.shape and len(res.shape) >= 1 and res.shape[-1] else 1
    n_expected = math.prod(res.shape) if res.shape else 0
    is_float = dtype.kind == "f" and item in (2, 4)
    chunk_elems = max(row_len, (CHUNK_BYTES // item) // row_len * row_len)
    buf = bytearray(chunk_elems * item)
    view = memoryview(buf)
    scratch = np.empty(chunk_elems, dtype=np.uint16) if item == 2 else None
    src = job.source
    src_ok = src is not None and is_float and tuple(src.shape) == tuple(res.shape)
    if src is not None and not src_ok:
        res.source_problem = (
            f"shape {list(res.shape)} {dtype.name} vs source {src.name} {list(src.shape)}"
        )
    src_fd = os.open(src.path, os.O_RDONLY) if src_ok else -1
    try:
        done = 0  # elements read
        while True:
            n = f.readinto(view)
            if not n:
                break
            if digest is not None:
                digest.update(view[:n])
            on_bytes(n)
            whole = min(n // item, max(0, n_expected - done))
            if whole and is_float:
                values = np.frombuffer(buf, dtype=dtype, count=whole)
                _check_values(values, res, done, row_len, scratch)
                if src_ok and res.source_problem is None:
                    _compare_with_source(values, res, src, src_fd, done, row_len, dtype)
            done += n // item
    finally:
        if src_fd >= 0:
            os.close(src_fd)


# Byte offsets of the float16 scales inside one block of each quantized type (ggml's block
# structs): an Inf/NaN scale is the only way a quantized block dequantizes to Inf/NaN, so
# testing the scales finds them without dequantizing. tests/test_verify.py checks every
# entry against gguf's own dequantizer.
SCALE_OFFSETS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "IQ3_S": (0,),
    "IQ3_XXS": (0,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ1_S": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
}
_FLOAT_EXP = {
    "F32": (np.uint32, 0x7F800000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
}


def finite_blocks(buf: bytes, type_name: str) -> bool | None:
    """Whether whole blocks of a tensor type hold only finite values (None: layout unknown)."""
    if type_name in _FLOAT_EXP:
        dtype, exp = _FLOAT_EXP[type_name]
        bits = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"))
        return not bool(np.any(np.bitwise_and(bits, exp) == exp))
    offsets = SCALE_OFFSETS.get(type_name)
    if offsets is None:
        return None
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    blocks = np.frombuffer(buf, dtype=np.uint8).reshape(-1, block)
    for off in offsets:
        scale = np.ascontiguousarray(blocks[:, off : off + 2]).view("<u2")
        if np.any(np.bitwise_and(scale, 0x7C00) == 0x7C00):
            return False
    return True


def _stream_gguf(job: _FileJob, res: _FileResult, on_bytes: Callable[[int], None]) -> None:
    """Read a GGUF once, in file order: hash it (if the manifest lists it) and test every
    tensor's values (floats) or block scales (quantized types) for Inf/NaN."""
    import gguf

    g = job.gguf
    digest = hashlib.sha256() if job.sha256 is not None else None
    with open(job.path, "rb", buffering=0) as f:
        pos = 0

        def read(n: int) -> bytes:
            nonlocal pos
            chunk = f.read(n)
            pos += len(chunk)
            if digest is not None:
                digest.update(chunk)
            on_bytes(len(chunk))
            return chunk

        def skip_to(end: int) -> bool:
            while pos < end:
                if not read(min(CHUNK_BYTES, end - pos)):
                    return False
            return True

        for t in sorted(g.tensors.values(), key=lambda t: t.offset):
            start = g.abs_offset(t)
            if start < pos or (g.endian != "<" and t.type_name in _FLOAT_EXP):
                res.gguf_unscanned.add(t.type_name)
                continue
            if not skip_to(start):
                break
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.type_name]][1]
            step = max(block, CHUNK_BYTES // block * block)
            left = t.nbytes
            while left > 0:
                chunk = read(min(step, left))
                if not chunk:
                    break
                left -= len(chunk)
                whole = len(chunk) // block * block
                ok = finite_blocks(chunk[:whole], t.type_name) if whole else True
                if ok is None:
                    res.gguf_unscanned.add(t.type_name)
                elif not ok and t.name not in res.gguf_nonfinite:
                    res.gguf_nonfinite.append(t.name)
        skip_to(res.size)
    if digest is not None:
        res.sha256 = digest.hexdigest()


def _check_values(values, res: _FileResult, done: int, row_len: int, scratch) -> None:
    if values.dtype.itemsize == 2:
        bad = _nonfinite_f16(values.view(np.uint16), scratch[: values.size])
        bad_count = 0 if bad is None else bad.size
        first = None if bad is None else int(bad[0])
    else:
        finite = np.isfinite(values)
        bad_count = int(values.size - np.count_nonzero(finite))
        first = int(np.argmin(finite)) if bad_count else None
        with np.errstate(invalid="ignore"):
            res.beyond_f16 += int(np.count_nonzero(np.abs(values) > F16_MAX))
    if bad_count:
        res.nonfinite += bad_count
        if res.first_nonfinite_row is None:
            res.first_nonfinite_row = (done + first) // row_len


def _compare_with_source(values, res, src: TensorRef, fd: int, done: int, row_len: int, dtype):
    import ml_dtypes

    sdt = _SOURCE_DTYPES.get(src.dtype)
    if sdt is None:
        res.source_problem = f"source {src.name} has dtype {src.dtype}"
        return
    raw = _pread(fd, values.size * sdt.itemsize, src.offset + done * sdt.itemsize)
    if len(raw) != values.size * sdt.itemsize:
        res.source_problem = f"source {src.name} ends early"
        return
    s = np.frombuffer(raw, dtype=sdt)
    cast = s.view(ml_dtypes.bfloat16).astype(dtype) if src.dtype == "BF16" else s.astype(dtype)
    uint = np.dtype(f"<u{dtype.itemsize}")
    if not np.array_equal(cast.view(uint), values.view(uint)):
        first = int(np.flatnonzero(cast.view(uint) != values.view(uint))[0])
        row = (done + first) // row_len
        res.source_problem = f"differs from {src.name} from row {row}"


# ----------------------------------------------------------------------------- the checks


class _Verifier:
    def __init__(self, target: Target, source: str | None, deep: bool, progress):
        self.t = target
        self.source_arg = source
        self.deep = deep
        self.bar = ensure(progress)
        self.rows = _Rows()
        self.facts: Facts | None = None
        self.meta: dict[str, Any] = {}
        self.ck: MossCheckpoint | None = None
        self.ggufs: dict[Path, GgufFile] = {}
        self.tables: dict[str, _FileResult] = {}
        self.tokenizer = None
        self.quality: QualitySummary | None = None
        self.deep_results: list[DeepResult] = []
        self.gguf_errors: dict[Path, str] = {}
        self.gguf_scans: dict[Path, _FileResult] = {}
        self._gguf_special: dict[int, str] = {}  # token strings the GGUF has at special ids
        self._manifest_problems: list[str] = []
        self.backbone = None

    # -- orchestration

    def run(self) -> None:
        steps = [
            self._open_source,
            self._files,
            self._parse_ggufs,
            self._file_pass,
            self._gguf_checks,
            self._tokenizer_checks,
            self._cross_checks,
        ]
        steps += [self._source_checks] if self.source_arg is not None or self.deep else []
        steps += [self._deep] if self.deep else []
        for step in steps:
            started = time.perf_counter()
            step()
            log.debug("verify %s: %.2f s", step.__name__.strip("_"), time.perf_counter() - started)

    def _names(self, gguf: Path, check: str) -> str:
        return check if len(self.t.ggufs) <= 1 else f"{check} ({gguf.name})"

    # -- source and facts

    def _open_source(self) -> None:
        from .checkpoint import open_checkpoint, resolve_model

        r = self.rows
        r.group = "files"
        meta_facts, self.meta = _meta_facts(self.t.meta, r)
        if self.source_arg is not None:
            self.ck = open_checkpoint(resolve_model(self.source_arg, progress=self.bar))
        elif self.deep:
            self.ck = self._recorded_source()
        src_facts = None
        if self.ck is not None:
            src_facts = facts_from_config(self.ck.config, "source", self.ck.root / "config.json")
        self.facts = src_facts or meta_facts
        if meta_facts is not None:
            where = f"from {meta_facts.origin}"
            derived = (self.meta or {}).get("derived")
            if isinstance(derived, dict):  # pre-converted weights come without a config
                how = "; ".join(f"{k} from {v}" for k, v in derived.items() if k != "from")
                where += f", derived ({how})"
            r.add("model facts", PASS, f"{_facts_line(meta_facts)} {where}")
        elif src_facts is not None and self.t.meta is None:
            r.add("model facts", PASS, f"{_facts_line(src_facts)} from the source")
        if meta_facts is not None and src_facts is not None:
            r.group = "source"
            diffs = _facts_diff(meta_facts, src_facts)
            r.check(
                "source config",
                [f"{META_NAME} says {d}" for d in diffs],
                f"{META_NAME} agrees with the source ({self.ck.root})",
            )
        if self.facts is None and self.t.meta is not None and self.t.embedding_dir is not None:
            n = len(list(self.t.embedding_dir.glob("emb_ext_*.npy")))
            self.facts = Facts("the tables present", n_vq=n or None)

    def _recorded_source(self) -> MossCheckpoint | None:
        """--deep without --source: the source_model in extraction_meta.json, if local."""
        from .checkpoint import BUILTIN_PREFIX, open_checkpoint, resolve_model

        recorded = self.meta.get("source_model")
        if isinstance(recorded, str) and (
            recorded.startswith(BUILTIN_PREFIX) or Path(recorded).expanduser().is_dir()
        ):
            return open_checkpoint(resolve_model(recorded, progress=self.bar))
        where = (
            f"{META_NAME} names {recorded!r}, not a local folder"
            if recorded
            else (f"no source_model in {META_NAME}")
        )
        raise UsageError(
            f"--deep needs the source checkpoint: {where}",
            path=self.t.path,
            hint="pass --source MODEL (a local folder, a Hub id or builtin:tiny)",
        )

    # -- files

    def _expected_tables(self) -> list[tuple[str, str, tuple[int, int] | None]]:
        """(folder key, file name, expected shape) of every table."""
        f = self.facts
        n_vq = f.n_vq if f and f.n_vq else 0
        h, v, a = (f.hidden, f.vocab, f.audio_rows) if f else (None, None, None)
        big = (v, h) if v and h else None
        small = (a, h) if a and h else None
        out = [("emb", "embed_tokens.npy", big)]
        out += [("emb", f"emb_ext_{i:02d}.npy", small) for i in range(n_vq)]
        out += [("head", "lm_head_text.npy", big)]
        out += [("head", f"lm_head_audio_{i:02d}.npy", small) for i in range(n_vq)]
        return out

    def _files(self) -> None:
        t, r = self.t, self.rows
        r.group = "files"
        if t.yamls:
            names = ", ".join(y.name for y in t.yamls)
            r.check(
                "synth config", t.yaml_problems, f"{names}: every path names a file that exists"
            )
            if t.codec_problems:
                t.codec_problems.append(f"the folder cannot speak; add a codec: {CODEC_FIX}")
            r.check(CODEC_ROW, t.codec_problems, "encoder and decoder ONNX are there")
        if t.kind in ("weights", "config"):
            r.check(
                "backbone GGUF",
                [] if t.ggufs else ["no *.gguf in the folder"],
                ", ".join(g.name for g in t.ggufs),
            )
        if t.kind == "extract":
            self._backbone_weights()
        if t.kind == "gguf":
            return
        n_vq = self.facts.n_vq if self.facts else None
        for key, label, folder in (
            ("emb", "embedding tables", t.embedding_dir),
            ("head", "head tables", t.lm_head_dir),
        ):
            names = [name for k, name, _ in self._expected_tables() if k == key]
            missing = [n for n in names if folder is None or not (folder / n).is_file()]
            problems = (
                [f"{_rel(folder / n, t.root)} is missing" for n in missing]
                if folder
                else ["no folder"]
            )
            prefix = "emb_ext_" if key == "emb" else "lm_head_audio_"
            if folder is not None and folder.is_dir() and n_vq is not None:
                extra = sorted(p.name for p in folder.glob(f"{prefix}*.npy") if p.name not in names)
                problems += [f"{_rel(folder / n, t.root)} is beyond n_vq {n_vq}" for n in extra]
            if n_vq is None:
                problems.append("n_vq unknown: the expected names cannot be listed")
            r.check(label, problems, f"{len(names)} files (1 + n_vq {n_vq})")
        tok = t.tokenizer_dir
        missing = [n for n in TOKENIZER_REQUIRED if tok is None or not (tok / n).is_file()]
        r.check(
            "tokenizer files",
            [f"{_rel(tok / n, t.root) if tok else n} is missing" for n in missing],
            ", ".join(sorted(p.name for p in tok.iterdir() if p.is_file())) if tok else "",
        )

    def _backbone_weights(self) -> None:
        """An extract folder's qwen3_backbone/: config, shards and every tensor's shape."""
        from .convert import open_backbone
        from .gguf_write import OutType, plan_tensors

        r = self.rows
        folder = self.t.backbone_dir
        try:
            bb = open_backbone(folder)
            plan_tensors(bb.params, bb.tensors, OutType.F16, folder)
        except MossGgufError as exc:
            if "no model.safetensors" in exc.message:  # `all` extracts without them
                r.add("backbone weights", WARN, f"{BACKBONE_DIR}/ holds no weights, only its "
                      "config and tokenizer (extracted without them, as `all` does)")  # fmt: skip
            else:
                r.add("backbone weights", FAIL, exc.one_line())
            return
        self.backbone = bb
        problems = []
        want = self.facts.params if self.facts else None
        # extract always unties lm_head (MOSS keeps lm_heads.0 apart from the embeddings)
        if want is not None and bb.params != dataclasses.replace(want, tied=bb.params.tied):
            problems.append(f"config.json differs from {META_NAME}'s language_config")
        size = sum(s.nbytes for s in bb.tensors.values())
        r.check(
            "backbone weights",
            problems,
            f"{len(bb.tensors)} tensors, {size / 1e9:.2f} GB, shapes as its config",
        )

    # -- one pass over the files

    def _file_pass(self) -> None:
        t = self.t
        jobs: dict[Path, _FileJob] = {}
        src_tables: dict[str, TensorRef] = {}
        if self.ck is not None:
            from .extract import npy_jobs

            src_tables = {Path(j.relpath).name: j.source for j in npy_jobs(self.ck)}
        for key, name, shape in self._expected_tables() if t.kind != "gguf" else []:
            folder = t.embedding_dir if key == "emb" else t.lm_head_dir
            p = folder / name if folder else None
            if p is not None and p.is_file():
                jobs[p] = _FileJob(_rel(p, t.root), p, True, shape, src_tables.get(name))
        for path, g in self.ggufs.items():
            jobs[path] = _FileJob(_rel(path, t.root), path, gguf=g)
        manifest = self._manifest_entries()
        for rel, entry in manifest.items():
            p = entry["path"]
            if p is None or not p.is_file() or p.stat().st_size != entry["size"]:
                continue  # reported by the manifest row without reading
            job = jobs.setdefault(p, _FileJob(rel, p))
            job.sha256 = entry["sha256"]
        ordered = sorted(jobs.values(), key=lambda j: -j.path.stat().st_size)
        total = sum(j.path.stat().st_size for j in ordered)
        self.bar.start("verify:read", "verify: read files", total, "B")
        lock = threading.Lock()

        def on_bytes(n: int) -> None:
            with lock:
                self.bar.advance("verify:read", n)

        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="verify") as pool:
            results = list(pool.map(lambda j: _stream_file(j, on_bytes), ordered))
        self.bar.finish("verify:read")
        by_path = {res.job.path: res for res in results}
        self.tables = {res.job.rel: res for res in results if res.job.table}
        self.gguf_scans = {res.job.path: res for res in results if res.job.gguf is not None}
        self._table_rows()
        self._manifest_row(manifest, by_path)

    def _table_rows(self) -> None:
        r = self.rows
        r.group = "tables"
        if self.t.kind == "gguf":
            return
        fmt, shapes, sizes, values, warn_values = [], [], [], [], []
        for rel, res in sorted(self.tables.items()):
            if res.error:
                fmt.append(f"{rel}: {res.error}")
                continue
            if res.header_error:
                fmt.append(f"{rel}: unreadable .npy header ({res.header_error})")
                continue
            dtype = np.dtype(res.dtype)
            if dtype not in (np.dtype("<f2"), np.dtype("<f4")):
                fmt.append(f"{rel}: dtype {dtype} (expected float16 or float32)")
            if res.fortran:
                fmt.append(f"{rel}: Fortran order (expected C order)")
            want = res.job.shape
            if len(res.shape) != 2:
                shapes.append(f"{rel}: shape {list(res.shape)} is not 2-D")
            elif want is not None and tuple(res.shape) != want:
                shapes.append(f"{rel}: shape {list(res.shape)}, expected {list(want)}")
            if res.size != res.expected_size:
                what = "truncated" if res.size < res.expected_size else "trailing bytes"
                sizes.append(
                    f"{rel}: {res.size} bytes, header + data = {res.expected_size} ({what})"
                )
            if res.nonfinite:
                overflow = " (float16 overflow?)" if dtype.itemsize == 2 else ""
                values.append(
                    f"{rel}: {res.nonfinite} Inf/NaN values{overflow}, first in row "
                    f"{res.first_nonfinite_row}"
                )
            if res.beyond_f16:
                warn_values.append(
                    f"{rel}: {res.beyond_f16} values beyond ±65504 (fine in "
                    "float32; would overflow float16)"
                )
        n = len(self.tables)
        dtypes = sorted({np.dtype(x.dtype).name for x in self.tables.values() if x.dtype})
        r.check("table format", fmt, f"{n} .npy headers readable, {'/'.join(dtypes) or '-'}")
        known = self.facts and self.facts.hidden and self.facts.vocab and self.facts.audio_rows
        r.check(
            "table shapes",
            shapes,
            "vocab × hidden and (audio vocab + 1) × hidden"
            if known
            else "2-D (no model facts to compare sizes with)",
        )
        r.check("table sizes", sizes, "every file is as long as its header and data")
        r.check("table values", values, "all values finite", warn=warn_values)

    def _manifest_entries(self) -> dict[str, dict[str, Any]]:
        m = self.t.manifest
        if m is None:
            return {}
        root = m.parent
        try:
            data = json.loads(m.read_text(encoding="utf-8"))
            files = data["files"]
            if not isinstance(files, list):
                raise TypeError("'files' is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._manifest_problems.append(f"{m.name} is unreadable ({exc})")
            return {}
        out: dict[str, dict[str, Any]] = {}
        for entry in files:
            try:
                rel, size, sha = str(entry["path"]), int(entry["size"]), str(entry["sha256"])
            except (KeyError, TypeError, ValueError):
                self._manifest_problems.append(f"malformed entry {entry!r:.80}")
                continue
            try:
                p = safe_child(root, rel, "manifest entry", m)
            except InputError:
                self._manifest_problems.append(f"{rel}: path outside the folder")
                p = None
            out[rel] = {"path": p, "size": size, "sha256": sha.lower()}
        return out

    def _manifest_row(self, entries: dict[str, dict[str, Any]], by_path) -> None:
        if self.t.manifest is None:
            return
        r = self.rows
        r.group = "manifest"
        problems = list(self._manifest_problems)
        for rel, e in entries.items():
            p = e["path"]
            if p is None:
                continue
            if not p.is_file():
                problems.append(f"{rel} is missing")
                continue
            size = p.stat().st_size
            if size != e["size"]:
                problems.append(f"{rel}: {size} bytes, manifest says {e['size']}")
                continue
            res = by_path.get(p)
            if res is None or res.error:
                problems.append(f"{rel}: unreadable ({res.error if res else 'not read'})")
            elif res.sha256 != e["sha256"]:
                problems.append(f"{rel}: sha256 mismatch")
        total = sum(e["size"] for e in entries.values())
        r.check(
            "manifest",
            problems,
            f"{len(entries)} files, {total / 1e9:.2f} GB, sizes and sha256 match",
        )

    # -- GGUF

    def _parse_ggufs(self) -> None:
        for path in self.t.ggufs:
            if not path.is_file():
                self.gguf_errors[path] = f"{path.name} is missing"
                continue
            try:
                self.ggufs[path] = read_gguf(path)
            except (GgufFormatError, OSError, ValueError) as exc:
                self.gguf_errors[path] = f"{path.name}: {exc}"

    def _gguf_checks(self) -> None:
        for path in self.t.ggufs:
            self.rows.group = "gguf"
            self._one_gguf(path)

    def _one_gguf(self, path: Path) -> None:
        r = self.rows

        def name(check: str) -> str:
            return self._names(path, check)

        g = self.ggufs.get(path)
        if g is None:
            r.add(name("GGUF header"), FAIL, self.gguf_errors[path])
            return
        r.add(
            name("GGUF header"),
            PASS,
            f"GGUF v{g.version}, {len(g.kv)} keys, {len(g.tensors)} tensors",
        )
        if g.size < g.data_end:
            r.add(
                name("GGUF size"),
                FAIL,
                f"truncated: {g.size} bytes, its tensor data needs "
                f"{g.data_end} ({g.data_end - g.size} missing)",
            )
        else:
            r.add(name("GGUF size"), PASS, f"{g.size} bytes hold all tensor data")
        arch = g.arch
        r.check(
            name("GGUF architecture"),
            [] if arch == "qwen3" else [f"general.architecture is {arch!r}, expected 'qwen3'"],
            "qwen3",
        )
        hp = self._gguf_params(g)
        self._hparams_row(g, hp, name)
        self._tensors_row(g, hp, name)
        self._file_type_rows(g, name)
        self._gguf_tokenizer_row(g, name)
        self._gguf_values_row(path, g, name)

    def _gguf_values_row(self, path: Path, g: GgufFile, name) -> None:
        scan = self.gguf_scans.get(path)
        if scan is None or scan.error:
            self.rows.add(name("GGUF values"), FAIL, f"unreadable: {scan.error if scan else '?'}")
            return
        problems = [f"{n} holds Inf/NaN" for n in scan.gguf_nonfinite]
        cut = [t.name for t in g.tensors.values() if not g.in_file(t)]
        if cut:
            problems.append(f"{len(cut)} tensors past the end of the file were not read")
        warn = [f"{ty} blocks not tested (layout unknown)" for ty in sorted(scan.gguf_unscanned)]
        self.rows.check(
            name("GGUF values"),
            problems,
            f"no Inf/NaN in {len(g.tensors)} tensors (floats, and quantized block scales)",
            warn=warn,
        )

    def _gguf_params(self, g: GgufFile):
        """The hyperparameters to hold the GGUF to: the model facts, else its own keys."""
        from .gguf_write import Qwen3Params

        if self.facts is not None and self.facts.params is not None:
            return self.facts.params
        a = g.arch or "qwen3"
        kv = g.kv

        def get(key: str, default: Any = 0) -> Any:
            v = kv.get(f"{a}.{key}", default)
            return v if isinstance(v, (int, float)) else default

        tokens = kv.get("tokenizer.ggml.tokens")
        emb = g.tensors.get("token_embd.weight")
        vocab = tokens.count if isinstance(tokens, GgufArray) else (emb.dims[1] if emb else 0)
        return Qwen3Params(
            n_layers=int(get("block_count")),
            hidden=int(get("embedding_length")),
            ff=int(get("feed_forward_length")),
            heads=int(get("attention.head_count")),
            kv_heads=int(get("attention.head_count_kv")),
            head_dim=int(get("attention.key_length")),
            vocab=int(vocab),
            context=int(get("context_length")),
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 0.0)),
            rope_theta=float(get("rope.freq_base", 0.0)),
            tied=False,
        )

    def _hparams_row(self, g: GgufFile, hp, name) -> None:
        a = g.arch or "qwen3"
        want = {
            "block_count": hp.n_layers,
            "context_length": hp.context,
            "embedding_length": hp.hidden,
            "feed_forward_length": hp.ff,
            "attention.head_count": hp.heads,
            "attention.head_count_kv": hp.kv_heads,
            "attention.key_length": hp.head_dim,
            "attention.value_length": hp.head_dim,
            "attention.layer_norm_rms_epsilon": hp.rms_eps,
            "rope.freq_base": hp.rope_theta,
        }
        problems = []
        for key, expected in want.items():
            value = g.kv.get(f"{a}.{key}")
            if value is None:
                problems.append(f"{a}.{key} is missing")
            elif isinstance(expected, float):
                if not math.isclose(float(value), expected, rel_tol=1e-6):
                    problems.append(f"{a}.{key} = {value:g}, config says {expected:g}")
            elif value != expected:
                problems.append(f"{a}.{key} = {value}, config says {expected}")
        origin = self.facts.origin if self.facts and self.facts.params else "its own keys"
        r = self.rows
        if origin == "its own keys":
            r.check(
                name("GGUF hyperparameters"),
                problems,
                "all present (no model config to compare with; tensor shapes checked against them)",
            )
        else:
            r.check(name("GGUF hyperparameters"), problems, f"all 10 equal the config ({origin})")

    def _tensors_row(self, g: GgufFile, hp, name) -> None:
        want = expected_gguf_tensors(hp)
        problems = []
        missing = [n for n in want if n not in g.tensors]
        extra = [n for n in g.tensors if n not in want]
        if missing:
            problems.append(f"{len(missing)} missing: {', '.join(missing[:3])}")
        if extra:
            problems.append(f"{len(extra)} unexpected: {', '.join(extra[:3])}")
        for n, (_, shape) in want.items():
            t = g.tensors.get(n)
            if t is not None and t.dims != tuple(reversed(shape)):
                problems.append(f"{n} is {list(t.dims)}, expected {list(reversed(shape))}")
        misaligned = [t.name for t in g.tensors.values() if t.offset % g.alignment]
        if misaligned:  # llama.cpp refuses to load such a file
            problems.append(f"{misaligned[0]} data is not {g.alignment}-byte aligned")
        self.rows.check(
            name("GGUF tensors"),
            problems,
            f"{len(want)} tensors (3 + 11 × {hp.n_layers} layers), shapes as the config",
        )

    def _file_type_rows(self, g: GgufFile, name) -> None:
        r = self.rows
        ftype = _file_type_name(g)
        weights = [t for t in g.tensors.values() if len(t.dims) == 2]
        counts = Counter(t.type_name for t in weights)
        mix = ", ".join(f"{k} ×{v}" for k, v in counts.most_common())
        base = file_type_base(ftype) if ftype else None
        if ftype is None:
            raw = g.kv.get("general.file_type")
            r.add(
                name("GGUF file type"),
                FAIL,
                "general.file_type is missing"
                if raw is None
                else f"general.file_type {raw} is not a llama.cpp file type",
            )
        elif base is None:
            r.add(name("GGUF file type"), WARN, f"{ftype}: unknown to this check; matrices {mix}")
        elif base not in counts:
            r.add(name("GGUF file type"), FAIL, f"{ftype} but no {base} tensor: matrices {mix}")
        elif counts.most_common(1)[0][0] != base:
            r.add(
                name("GGUF file type"),
                WARN,
                f"{ftype} but {base} is not the most common type: matrices {mix}",
            )
        else:
            r.add(name("GGUF file type"), PASS, f"{ftype.removeprefix('MOSTLY_')}: matrices {mix}")
        n_el = sum(t.n_elements for t in g.tensors.values())
        bpw = sum(t.nbytes for t in g.tensors.values()) * 8 / max(n_el, 1)
        rng = bpw_range(ftype) if ftype else None
        if rng is None:
            r.add(name("GGUF bits per weight"), WARN, f"{bpw:.2f} bpw (no range for this type)")
        elif not rng[0] <= bpw <= rng[1]:
            r.add(
                name("GGUF bits per weight"),
                FAIL,
                f"{bpw:.2f} bpw, outside llama.cpp's {rng[0]:.2f}–{rng[1]:.2f} for {ftype}",
            )
        else:
            r.add(
                name("GGUF bits per weight"),
                PASS,
                f"{bpw:.2f} bpw (range {rng[0]:.2f}–{rng[1]:.2f})",
            )

    def _gguf_tokenizer_row(self, g: GgufFile, name) -> None:
        kv = g.kv
        problems, warns = [], []
        if kv.get("tokenizer.ggml.model") != "gpt2":
            problems.append(
                f"tokenizer.ggml.model is {kv.get('tokenizer.ggml.model')!r}, expected 'gpt2'"
            )
        tokens = kv.get("tokenizer.ggml.tokens")
        vocab = self.facts.vocab if self.facts else None
        if not isinstance(tokens, GgufArray):
            problems.append("tokenizer.ggml.tokens is missing")
        elif vocab is not None and tokens.count != vocab:
            problems.append(f"{tokens.count} tokens, config vocab_size is {vocab}")
        types = kv.get("tokenizer.ggml.token_type")
        if isinstance(tokens, GgufArray) and (
            not isinstance(types, GgufArray) or types.count != tokens.count
        ):
            problems.append("tokenizer.ggml.token_type is missing or of another length")
        merges = kv.get("tokenizer.ggml.merges")
        if not isinstance(merges, GgufArray) or merges.count == 0:
            problems.append("tokenizer.ggml.merges is missing")
        ids = self._special_expect()
        for key, expected in ids.items():
            value = kv.get(f"tokenizer.ggml.{key}")
            if value is None:
                (warns if key == "bos_token_id" else problems).append(
                    f"tokenizer.ggml.{key} is missing"
                )
            elif expected is not None and value not in expected:
                problems.append(
                    f"tokenizer.ggml.{key} = {value}, config says "
                    f"{'/'.join(map(str, sorted(expected)))}"
                )
        if isinstance(tokens, GgufArray):
            wanted = [i for i in self.facts.token_ids().values()] if self.facts else []
            try:
                self._gguf_special = g.strings("tokenizer.ggml.tokens", wanted)
            except (struct.error, IndexError, ValueError):
                problems.append("tokenizer.ggml.tokens cannot be read")
        count = tokens.count if isinstance(tokens, GgufArray) else 0
        self.rows.check(
            name("GGUF tokenizer"),
            problems,
            f"gpt2/{kv.get('tokenizer.ggml.pre')}, {count} tokens, bos/eos/pad ids as the config",
            warn=warns,
        )

    def _special_expect(self) -> dict[str, set[int] | None]:
        lang = self.facts.language if self.facts else {}
        ids = self.facts.token_ids() if self.facts else dict(TOKEN_DEFAULTS)

        def as_set(value: Any) -> set[int] | None:
            if value is None:
                return None
            return {int(v) for v in value} if isinstance(value, list) else {int(value)}

        if not self.facts or self.facts.moss is None:
            return {"bos_token_id": None, "eos_token_id": None, "padding_token_id": None}
        return {
            "bos_token_id": as_set(lang.get("bos_token_id")),
            "eos_token_id": as_set(lang.get("eos_token_id", ids["im_end_token_id"])),
            "padding_token_id": as_set(lang.get("pad_token_id") or ids["pad_token_id"]),
        }

    # -- tokenizer

    def _tokenizer_checks(self) -> None:
        tok_dir = self.t.tokenizer_dir
        if tok_dir is None and self.ck is not None:
            tok_dir = self.ck.root  # a lone GGUF checked against its source
        r = self.rows
        r.group = "tokenizer"
        if tok_dir is None:
            return
        path = tok_dir / "tokenizer.json"
        if not path.is_file():
            r.add("tokenizer loads", FAIL, f"{_rel(path, self.t.root)} is missing")
            return
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exceptions
            r.add("tokenizer loads", FAIL, f"tokenizers cannot load it: {exc}")
            return
        self.tokenizer = tok
        n = tok.get_vocab_size(with_added_tokens=True)
        vocab = self.facts.vocab if self.facts else None
        # BPE ids are 0..base-1, then the added tokens (get_vocab would build a 150k dict)
        added = tok.get_added_tokens_decoder()
        top = max([tok.get_vocab_size(with_added_tokens=False) - 1, *added])
        r.check(
            "tokenizer loads",
            [f"token id {top} is beyond the config vocab_size {vocab}"]
            if vocab is not None and top >= vocab
            else [],
            f"{n} tokens",
        )
        self._special_tokens_row(tok)
        enc = tok.encode(ROUND_TRIP_TEXT, add_special_tokens=False)
        back = tok.decode(enc.ids, skip_special_tokens=False)
        r.check(
            "tokenizer round trip",
            [] if back == ROUND_TRIP_TEXT else [f"{ROUND_TRIP_TEXT!r} decodes as {back!r}"],
            f"{len(enc.ids)} tokens, exact",
        )

    def _special_tokens_row(self, tok) -> None:
        ids = self.facts.token_ids() if self.facts else dict(TOKEN_DEFAULTS)
        added = tok.get_added_tokens_decoder()
        problems, warns, shown = [], [], []
        for key, token_id in ids.items():
            text = tok.id_to_token(token_id)
            role = key.removesuffix("_token_id")
            if text is None:
                problems.append(f"{role} id {token_id} is not in the tokenizer")
                continue
            expected = EXPECTED_SPECIAL.get(key, ())
            if token_id not in added:
                problems.append(f"{role} id {token_id} ({text}) is not an added special token")
            elif tok.encode(text, add_special_tokens=False).ids != [token_id]:
                problems.append(f"{text} does not encode to the single id {token_id}")
            elif expected and text not in expected:
                warns.append(f"{role} id {token_id} is {text}, expected {' or '.join(expected)}")
            gguf_text = self._gguf_special.get(token_id) if self._gguf_special else None
            if gguf_text is not None and gguf_text != text:
                problems.append(
                    f"the GGUF's token {token_id} is {gguf_text!r}, the tokenizer's {text!r}"
                )
            shown.append(f"{token_id} {text}")
        self.rows.check(
            "special tokens",
            problems,
            f"{len(ids)} ids: " + ", ".join(shown[:3]) + ", …",
            warn=warns,
        )

    # -- cross checks (no source needed)

    def _cross_checks(self) -> None:
        r = self.rows
        r.group = "cross"
        hidden = {}
        for rel, res in self.tables.items():
            if res.shape and len(res.shape) == 2:
                hidden.setdefault(res.shape[1], []).append(rel)
        for path, g in self.ggufs.items():
            n_embd = g.kv.get(f"{g.arch or 'qwen3'}.embedding_length")
            if hidden:
                off = [f"{len(v)} tables have {h}" for h, v in hidden.items() if h != n_embd]
                r.check(
                    self._names(path, "hidden size"),
                    [f"GGUF embedding_length {n_embd}; " + "; ".join(off)] if off else [],
                    f"{n_embd} in the GGUF and every table",
                )
            for table, tensor, label in (
                ("lm_head_text.npy", "output.weight", "text head vs GGUF output"),
                ("embed_tokens.npy", "token_embd.weight", "text embedding vs GGUF token_embd"),
            ):
                res = next((x for x in self.tables.values() if x.job.path.name == table), None)
                if res is None:
                    continue
                self._sampled_compare(path, g, res, tensor, self._names(path, label))

    def _sampled_compare(self, path: Path, g: GgufFile, res: _FileResult, tensor: str, label):
        """A table against a GGUF tensor on sampled rows: 32 evenly spread runs of 16 rows."""
        r = self.rows
        t = g.tensors.get(tensor)
        if t is None or res.header_error or res.error or res.shape is None:
            return  # the tensor / table rows already fail
        if len(res.shape) != 2 or tuple(reversed(t.dims)) != tuple(res.shape):
            r.add(
                label,
                FAIL,
                f"{res.job.rel} is {list(res.shape)}, {tensor} is {list(reversed(t.dims))}",
            )
            return
        if not g.in_file(t):
            r.add(label, FAIL, f"{tensor}'s data lies past the end of the truncated GGUF")
            return
        if res.size < (res.expected_size or 0):
            return  # a truncated table fails its own row
        rows_total = t.n_rows
        runs, run = 32, 16
        starts = sorted({min(rows_total - run, i * rows_total // runs) for i in range(runs)})
        sums = _Sums()
        dtype = "F16" if np.dtype(res.dtype).itemsize == 2 else "F32"
        with open(path, "rb") as gf, open(res.job.path, "rb") as tf:
            read = _row_reader(res.job.path, res.data_offset, res.shape[1], dtype, tf.fileno())
            for s in starts:
                s = max(0, s)
                _compare_block(gf.fileno(), g, t, s, min(rows_total, s + run), read, sums)
        rel, cos = sums.result()
        max_rel, min_cos = tensor_threshold(t.type_name)
        n = len(starts) * run
        detail = f"{t.type_name}: rel. RMSE {rel:.4f}, cosine {cos:.5f} on {n} sampled rows"
        ok = rel <= max_rel and cos >= min_cos
        r.add(
            label,
            PASS if ok else FAIL,
            detail if ok else f"{detail}, limits {max_rel:g} / {min_cos:.5f}: another model's?",
        )

    # -- with the source

    def _source_checks(self) -> None:
        if self.ck is None:
            return
        r = self.rows
        r.group = "source"
        if self.tables:
            problems = [
                f"{rel}: {res.source_problem}"
                for rel, res in sorted(self.tables.items())
                if res.source_problem
            ]
            missing = [rel for rel, res in self.tables.items() if res.job.source is None]
            problems += [f"{rel}: no source tensor" for rel in missing]
            dtypes = sorted({np.dtype(x.dtype).name for x in self.tables.values() if x.dtype})
            r.check(
                "tables vs source",
                problems,
                f"{len(self.tables)} tables equal their source "
                f"tensors exactly (bf16 → {'/'.join(dtypes)})",
            )
        if self.t.kind == "extract" and self.backbone is not None:
            self._backbone_vs_source()
        self.quality = QualitySummary()
        for path, g in self.ggufs.items():
            self._gguf_vs_source(path, g)

    def _backbone_vs_source(self) -> None:
        """The extracted safetensors hold the source bytes unchanged."""
        problems = []
        src = {hf: ref for hf, ref in self.ck.backbone_tensors()}
        for name, t in self.backbone.tensors.items():
            ref = src.get(name)
            if ref is None:
                problems.append(f"{name}: not in the source")
            elif (t.dtype, tuple(t.shape)) != (ref.dtype, tuple(ref.shape)):
                problems.append(
                    f"{name}: {t.dtype} {list(t.shape)} vs source {ref.dtype} {list(ref.shape)}"
                )
            elif not _same_bytes(t.path, t.offset, ref.path, ref.offset, t.nbytes):
                problems.append(f"{name}: bytes differ from {ref.name}")
        self.rows.check(
            "backbone vs source",
            problems,
            f"{len(self.backbone.tensors)} tensors byte-identical to the source",
        )

    def _gguf_vs_source(self, path: Path, g: GgufFile) -> None:
        r = self.rows
        label = self._names(path, "GGUF vs source")
        if self.ck is None or self.facts is None or self.facts.params is None:
            return
        want = expected_gguf_tensors(self.facts.params)
        pairs, problems = [], []
        for gname, (hf, _shape) in want.items():
            t = g.tensors.get(gname)
            ref = self.ck.tensors.get(moss_source_name(hf))
            if t is None or ref is None:
                continue  # the tensor set row reports it
            if t.dims != tuple(reversed(ref.shape)):
                problems.append(
                    f"{gname} is {list(t.dims)}, source {ref.name} is {list(ref.shape)}"
                )
            elif not g.in_file(t):
                problems.append(f"{gname}: data past the end of the file")
            elif ref.dtype not in _SOURCE_DTYPES:
                problems.append(f"{gname}: source dtype {ref.dtype}")
            else:
                pairs.append((t, ref))
        results = compare_tensors(g, pairs, self.bar)
        for t, ref, rel, cos in results:
            max_rel, min_cos = tensor_threshold(t.type_name)
            q = TensorQuality(path.name, t.name, ref.name, t.type_name, rel, cos, max_rel, min_cos)
            self.quality.tensors.append(q)
            if not q.ok:
                problems.append(
                    f"{t.name} ({t.type_name}) rel. RMSE {rel:.3g}, cosine {cos:.4f} "
                    f"(limits {max_rel:g} / {min_cos:.5f})"
                )
        mine = [q for q in self.quality.tensors if q.gguf == path.name]
        worst = max(mine, key=lambda q: q.badness, default=None)
        detail = f"{len(mine)} tensors within their type's limits"
        if worst is not None:
            detail += (
                f"; worst {worst.name} ({worst.type}) rel. RMSE {worst.rel_rmse:.4f}, "
                f"cosine {worst.cosine:.5f}"
            )
        r.check(label, problems, detail)

    # -- deep

    def _deep(self) -> None:
        """llama.cpp's final hidden state and audio logits against the torch reference."""
        r = self.rows
        r.group = "deep"
        if self.tokenizer is None or self.facts is None or self.facts.moss is None:
            r.add(
                "deep: hidden state",
                FAIL,
                "not run: needs a loadable tokenizer and the model config",
            )
            return
        runnable = {p: g for p, g in self.ggufs.items() if g.size >= g.data_end}
        for p in self.t.ggufs:
            if p not in runnable:
                r.add(
                    self._names(p, "deep: hidden state"),
                    FAIL,
                    "not run: the GGUF is unreadable or truncated",
                )
        if not runnable:
            return
        self.bar.start("verify:deep", "verify: deep check", 1 + len(runnable), "")
        ids = deep_prompt_ids(self.tokenizer, self.facts.moss)
        embeds = self._deep_embeddings(ids)
        expected = reference_hidden(self.ck.root, embeds)
        self.bar.advance("verify:deep")
        heads = [
            self._table_rows_f32("head", f"lm_head_audio_{k:02d}.npy", f"lm_heads.{k + 1}.weight")
            for k in range(self.facts.n_vq)
        ]
        for path, g in runnable.items():
            got = llama_hidden(path, embeds)
            result = compare_deep(
                path.name, _file_type_name(g), got, expected, heads, self.facts.moss.audio_pad_code
            )
            self.deep_results.append(result)
            self._deep_rows(path, result)
            self.bar.advance("verify:deep")
        self.bar.finish("verify:deep")

    def _deep_rows(self, path: Path, d: DeepResult) -> None:
        hid, logit, top1 = d.thresholds
        kind = (d.file_type or "?").removeprefix("MOSTLY_")
        ok = d.hidden_cosine_min >= hid
        self.rows.add(
            self._names(path, "deep: hidden state"),
            PASS if ok else FAIL,
            f"cosine min {d.hidden_cosine_min:.5f}, mean {d.hidden_cosine_mean:.5f} over "
            f"{d.rows} prompt rows ({kind}; limit {hid})",
        )
        ok = d.logits_cosine_min >= logit and d.top1_agreement >= top1
        self.rows.add(
            self._names(path, "deep: audio logits"),
            PASS if ok else FAIL,
            f"cosine min {d.logits_cosine_min:.5f} over {self.facts.n_vq} heads, top-1 "
            f"agreement {d.top1_agreement:.1%} (limits {logit} / {top1:.0%})",
        )

    def _table_rows_f32(self, key: str, name: str, source_name: str, rows=None) -> np.ndarray:
        """Rows of a table as float32 (all rows: a memory map in the stored dtype): the
        target's .npy when it passed its checks, else the source tensor (a lone GGUF)."""
        folder = self.t.embedding_dir if key == "emb" else self.t.lm_head_dir
        res = next((x for x in self.tables.values() if x.job.path.name == name), None)
        good = (
            res is not None
            and folder is not None
            and res.job.path.parent == folder
            and not (res.error or res.header_error or res.nonfinite)
            and res.shape == res.job.shape
            and res.size == res.expected_size
        )
        if good:
            table = np.load(res.job.path, mmap_mode="r", allow_pickle=False)
            return table if rows is None else np.asarray(table[rows], dtype=np.float32)
        ref = self.ck.tensors[source_name]
        if rows is None:
            return ref.read_f32()
        return np.stack([ref.read_f32(int(i), int(i) + 1)[0] for i in rows])

    def _deep_embeddings(self, ids: np.ndarray) -> np.ndarray:
        """docs/ARCHITECTURE.md §5 rows: the text row plus every audio table's pad-code row."""
        moss = self.facts.moss
        out = self._table_rows_f32(
            "emb", "embed_tokens.npy", "language_model.embed_tokens.weight", ids
        )
        pad = [moss.audio_pad_code]
        for k in range(moss.n_vq):
            out += self._table_rows_f32("emb", f"emb_ext_{k:02d}.npy", f"emb_ext.{k}.weight", pad)
        return out


def moss_source_name(hf_name: str) -> str:
    """Qwen3ForCausalLM name → MOSS checkpoint name (model.X → language_model.X)."""
    if hf_name == "lm_head.weight":
        return "lm_heads.0.weight"
    return "language_model." + hf_name.removeprefix("model.")


def expected_gguf_tensors(hp) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF tensor name → (Qwen3ForCausalLM name, HF shape), output head always present."""
    import gguf

    from .gguf_write import ARCH, expected_shapes

    names = gguf.get_tensor_name_map(ARCH, hp.n_layers)
    out = {}
    for hf, shape in expected_shapes(hp).items():
        new = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if new is not None:
            out[new] = (hf, shape)
    return out


def compare_tensors(
    g: GgufFile, pairs: list[tuple[GgufTensorInfo, TensorRef]], progress: ProgressReporter
) -> list[tuple[GgufTensorInfo, TensorRef, float, float]]:
    """(tensor, source, rel. RMSE, cosine) for every pair; both cores, row blocks."""
    total = sum(t.n_elements for t, _ in pairs)
    progress.start(f"verify:compare:{g.path.name}", f"verify: {g.path.name} vs source", total, "")
    fds: dict[Path, int] = {}
    sums = {t.name: _Sums() for t, _ in pairs}
    tasks = []
    for t, ref in pairs:
        per = max(1, _BLOCK_ELEMS // t.dims[0])
        for a in range(0, t.n_rows, per):
            tasks.append((t, ref, a, min(t.n_rows, a + per)))
    lock = threading.Lock()
    try:
        fds[g.path] = os.open(g.path, os.O_RDONLY)
        for _, ref in pairs:
            if ref.path not in fds:
                fds[ref.path] = os.open(ref.path, os.O_RDONLY)

        def work(task) -> None:
            t, ref, a, b = task
            read = _row_reader(ref.path, ref.offset, t.dims[0], ref.dtype, fds[ref.path])
            _compare_block(fds[g.path], g, t, a, b, read, sums[t.name])
            with lock:
                progress.advance(f"verify:compare:{g.path.name}", (b - a) * t.dims[0])

        with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="verify") as pool:
            for _ in pool.map(work, tasks):
                pass
    finally:
        for fd in fds.values():
            os.close(fd)
        progress.finish(f"verify:compare:{g.path.name}")
    return [(t, ref, *sums[t.name].result()) for t, ref in pairs]


def _same_bytes(a: Path, a_off: int, b: Path, b_off: int, n: int) -> bool:
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        fa.seek(a_off)
        fb.seek(b_off)
        while n > 0:
            step = min(n, CHUNK_BYTES)
            x, y = fa.read(step), fb.read(step)
            if x != y or len(x) != step:
                return False
            n -= step
    return True


def _facts_line(f: Facts) -> str:
    parts = [f"n_vq {f.n_vq}"]
    if f.params is not None:
        parts += [
            f"hidden {f.params.hidden}",
            f"vocab {f.params.vocab}",
            f"{f.params.n_layers} layers",
        ]
    if f.moss is not None:
        parts.append(f"audio vocab {f.moss.audio_vocab_size}")
    return ", ".join(parts)


def _facts_diff(a: Facts, b: Facts) -> list[str]:
    out = []
    if a.n_vq != b.n_vq:
        out.append(f"n_vq {a.n_vq}, the source {b.n_vq}")
    if a.params is not None and b.params is not None and a.params != b.params:
        for f in dataclasses.fields(a.params):
            x, y = getattr(a.params, f.name), getattr(b.params, f.name)
            if x != y:
                out.append(f"{f.name} {x}, the source {y}")
    if a.moss is not None and b.moss is not None:
        for key in ("audio_vocab_size", "audio_pad_code", *TOKEN_DEFAULTS):
            x, y = getattr(a.moss, key), getattr(b.moss, key)
            if x != y:
                out.append(f"{key} {x}, the source {y}")
    return out


DEEP_TEXT = "The quick brown fox jumps over the lazy dog."


def deep_prompt_ids(tokenizer, moss: MossConfig) -> np.ndarray:
    """Token ids of a short real user turn, ending in audio-start (docs/ARCHITECTURE.md §5)."""
    start = tokenizer.id_to_token(moss.im_start_token_id)
    end = tokenizer.id_to_token(moss.im_end_token_id)
    text = f"{start}user\n{DEEP_TEXT}{end}\n{start}assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False).ids + [moss.audio_start_token_id]
    return np.asarray(ids, dtype=np.int64)


class _StreamingWeights:
    """Qwen3Weights without its cache: the forward reads each tensor once per layer, so
    memory stays at one tensor (the real model would not fit in float64)."""

    def __init__(self, weights) -> None:
        self.params, self.sources, self.dtype = weights.params, weights.sources, weights.dtype

    def __getitem__(self, name: str):
        import torch

        from .reference import read_source_f32

        return torch.from_numpy(read_source_f32(self.sources[name])).to(self.dtype)


def reference_hidden(source_root: Path, embeds: np.ndarray) -> np.ndarray:
    """Final-norm hidden states of the source backbone for EMBEDS (torch, float64)."""
    from .reference import forward, load_weights

    return forward(_StreamingWeights(load_weights(source_root)), embeds)


def llama_hidden(gguf_path: Path, embeds: np.ndarray) -> np.ndarray:
    """Final-norm hidden states llama.cpp computes from the GGUF for EMBEDS."""
    from .tts.backbone import Backbone, BackboneSettings

    n = max(64, -(-embeds.shape[0] // 64) * 64)
    settings = BackboneSettings(n_ctx=max(256, n), n_batch=n, n_threads=WORKERS, n_gpu_layers=0)
    with Backbone(gguf_path, settings) as backbone:
        return np.array(backbone.hidden_states(embeds), dtype=np.float32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    num = (a * b).sum(axis=-1)
    den = np.sqrt((a * a).sum(axis=-1) * (b * b).sum(axis=-1))
    return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


def compare_deep(
    name: str,
    file_type: str | None,
    got: np.ndarray,
    expected: np.ndarray,
    heads: list[np.ndarray],
    pad_code: int,
) -> DeepResult:
    """Cosines of hidden states and audio logits, and top-1 agreement of the audio heads."""
    hidden = _cosines(got, expected)
    logit_cos, agree = [], []
    for head in heads:
        head = np.asarray(head, dtype=np.float32)  # one head in memory at a time
        a, b = got @ head.T, expected @ head.T
        if 0 <= pad_code < head.shape[0]:  # synth never samples the pad code
            a[:, pad_code] = b[:, pad_code] = -np.inf
        keep = np.isfinite(a[0])
        logit_cos.append(float(_cosines(a[:, keep].reshape(-1), b[:, keep].reshape(-1))))
        agree.append(a.argmax(axis=1) == b.argmax(axis=1))
    return DeepResult(
        gguf=name,
        file_type=file_type,
        rows=int(got.shape[0]),
        hidden_cosine_min=float(hidden.min()),
        hidden_cosine_mean=float(hidden.mean()),
        logits_cosine_min=min(logit_cos, default=0.0),
        top1_agreement=float(np.mean(agree)) if agree else 0.0,
        thresholds=DEEP_THRESHOLDS[deep_class(file_type)],
    )


# The strings MOSS-TTS's tokenizer has for its special ids, and the Qwen3 names the same ids
# carry in a plain Qwen3 tokenizer (builtin:tiny uses one); anything else is a warning.
EXPECTED_SPECIAL: dict[str, tuple[str, ...]] = {
    "pad_token_id": ("<|endoftext|>",),
    "im_start_token_id": ("<|im_start|>",),
    "im_end_token_id": ("<|im_end|>",),
    "audio_start_token_id": ("<|audio_start|>", "<|vision_start|>"),
    "audio_end_token_id": ("<|audio_end|>", "<|vision_end|>"),
    "audio_user_slot_token_id": ("<|audio_user_slot|>", "<|vision_pad|>"),
    "audio_assistant_gen_slot_token_id": ("<|audio_assistant_gen_slot|>", "<|video_pad|>"),
    "audio_assistant_delay_slot_token_id": ("<|audio_assistant_delay_slot|>", "<|fim_pad|>"),
}


# ----------------------------------------------------------------------------- entry point


def verify(
    target: Path,
    *,
    source: str | None = None,
    deep: bool = False,
    progress: ProgressReporter | None = None,
) -> VerifyReport:
    """Check TARGET (weights folder, synth YAML, extract folder or GGUF); one row per check.

    ``source`` (a local folder, Hub id or builtin:tiny) adds the exact and numeric
    comparisons with the source checkpoint; ``deep`` runs the backbone in llama.cpp
    against a torch reference forward of the source. Failing checks are rows
    (``report.ok`` is False); bad usage raises UsageError / InputError.
    """
    started = time.perf_counter()
    if target is None or str(target).strip() == "":
        raise UsageError("no TARGET given", hint="moss-gguf verify WEIGHTS_FOLDER")
    if deep:
        _check_deep_deps()
    t = find_target(Path(target))
    if deep and not t.ggufs:
        raise UsageError(
            f"--deep runs a GGUF in llama.cpp, and this {t.kind} target has none",
            path=t.path,
            hint="verify the weights folder or the GGUF",
        )
    v = _Verifier(t, source, deep, progress)
    v.run()
    report = VerifyReport(
        target=t.path,
        kind=t.kind,
        rows=sorted(v.rows.rows, key=lambda r: GROUPS.index(r.group)),
        model=v.facts.summary() if v.facts else {},
        quality=v.quality,
        deep=v.deep_results,
        seconds=time.perf_counter() - started,
    )
    return report


def _check_deep_deps() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "--deep needs torch for the reference forward, which is not installed",
            hint="pip install torch==2.13.0",
        )
    if importlib.util.find_spec("llama_cpp") is None:
        raise UsageError(
            "--deep needs llama-cpp-python to run the GGUF, which is not installed",
            hint="pip install llama-cpp-python",
        )
