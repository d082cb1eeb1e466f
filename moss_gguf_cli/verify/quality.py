"""How close a GGUF must stay to its source: per-tensor limits, bits per weight, --deep limits.

Thresholds are calibrated on builtin:tiny (2 layers, Gaussian weights) quantized by the
pinned llama.cpp's llama-quantize: :data:`TENSOR_MAX_REL_RMSE`, :data:`DEEP_THRESHOLDS`,
:func:`bpw_range`. ``python benchmarks/verify.py calibrate`` measures them again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

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
_FILE_TYPE_BASE_OVERRIDES = {
    "IQ3_XS": "IQ3_S", "IQ3_M": "IQ3_S", "IQ2_M": "IQ2_S", "Q2_K_S": "Q2_K",
}  # fmt: skip


def file_type_base(file_type: str) -> str | None:
    """The tensor type most of a file type's weights get: MOSTLY_Q4_K_M -> Q4_K."""
    import gguf

    name = file_type
    for prefix in ("MOSTLY_", "ALL_"):
        name = name.removeprefix(prefix)
    name = _FILE_TYPE_BASE_OVERRIDES.get(name, name)
    types = gguf.GGMLQuantizationType.__members__
    if name in types:
        return name
    stem = name.rsplit("_", 1)[0]  # Q4_K_M -> Q4_K
    return stem if stem in types else None


def bpw_range(file_type: str) -> tuple[float, float] | None:
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
    base = file_type_base(file_type)
    if base is None:
        return None
    low = _type_bpw(base)
    if base in ("F32", "F16", "BF16"):
        return (low - 0.01, low + 0.1)  # f32 norms add a hair
    high = max(low, _type_bpw("Q6_K"))
    return (low - 0.05, high + 0.2)


def deep_class(file_type: str | None) -> str:
    base = file_type_base(file_type) if file_type else None
    if base in ("F32", "F16", "BF16"):
        return "float"
    if base == "Q8_0":
        return "8bit"
    if base in ("Q6_K", "Q5_K", "Q5_0", "Q5_1"):
        return "5-6bit"
    if base in ("Q4_K", "Q4_0", "Q4_1", "IQ4_NL", "IQ4_XS"):
        return "4bit"
    return "low"


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
