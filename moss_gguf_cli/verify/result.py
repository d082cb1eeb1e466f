"""What `verify` returns: the rows, the model facts, the quality figures, the deep results."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..report import CheckRow, CheckRows, json_safe
from .quality import QualitySummary, TensorQuality

# the sections, in the order their rows are shown
GROUPS = ("files", "tables", "manifest", "gguf", "tokenizer", "cross", "source", "deep")


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
        return json_safe(
            {
                "target": str(self.target),
                "kind": self.kind,
                "ok": self.ok,
                "counts": self.counts,
                "seconds": round(self.seconds, 3),
                "model": self.model,
                "rows": [_row_dict(r) for r in self.rows],
                "quality": quality,
                "deep": [dataclasses.asdict(d) for d in self.deep] or None,
            }
        )


def _qdict(q: TensorQuality) -> dict[str, Any]:
    return {**dataclasses.asdict(q), "ok": q.ok}


def _row_dict(r: CheckRow) -> dict[str, Any]:
    return {"name": r.name, "status": r.status, "detail": r.detail, "group": r.group}
