"""One verify run's state: what it was asked, what it has read so far, the rows it wrote."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..disk.digests import HashRecord
from ..gguf.read import GgufFile
from ..progress import ProgressReporter
from ..report import Rows
from ..source.checkpoint import MossCheckpoint
from .model_facts import Facts
from .quality import QualitySummary
from .result import DeepResult
from .target import Target

CHUNK_BYTES = 16 << 20  # streaming read size per worker
WORKERS = max(1, min(os.cpu_count() or 1, 8))


@dataclass
class Context:
    t: Target
    source_arg: str | None
    deep: bool
    bar: ProgressReporter
    rows: Rows = field(default_factory=Rows)
    facts: Facts | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    ck: MossCheckpoint | None = None
    ggufs: dict[Path, GgufFile] = field(default_factory=dict)
    tables: dict[str, Any] = field(default_factory=dict)  # rel -> values.FileResult
    tokenizer: Any = None
    quality: QualitySummary | None = None
    deep_results: list[DeepResult] = field(default_factory=list)
    gguf_errors: dict[Path, str] = field(default_factory=dict)
    gguf_scans: dict[Path, Any] = field(default_factory=dict)  # path -> values.FileResult
    gguf_special: dict[int, str] = field(default_factory=dict)  # GGUF token strings, special ids
    manifest_problems: list[str] = field(default_factory=list)
    backbone: Any = None  # source.backbone.Backbone of an extract folder
    record: HashRecord | None = None  # the run's (`all`): files its writers hashed and checked

    def names(self, gguf: Path, check: str) -> str:
        """A row's name: CHECK, or CHECK (file) when the target holds several GGUFs."""
        return check if len(self.t.ggufs) <= 1 else f"{check} ({gguf.name})"


