"""The model facts the files must agree with: n_vq, sizes, token ids, and where they were read.

From ``extraction_meta.json``'s ``moss_config`` or from ``--source``; the defaults of
docs/ARCHITECTURE.md §2 apply only to keys that are absent.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MossGgufError
from ..gguf.write import Qwen3Params
from ..report import FAIL, Rows
from ..source.checkpoint import MossConfig
from ..source.token_ids import TOKEN_DEFAULTS


@dataclass
class Facts:
    """What the files must agree with, and where it was read."""

    origin: str
    moss: MossConfig | None = None
    params: Any = None  # gguf.write.Qwen3Params: the backbone as llama.cpp's converter sees it
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
    moss = MossConfig.from_dict(config, path)
    try:
        params = Qwen3Params.from_config(dict(config["language_config"]), path)
    except MossGgufError:
        params = None  # a config the native converter refuses: compare what MossConfig knows
    return Facts(origin, moss, params, dict(config["language_config"]), moss.n_vq)


def read_meta_facts(meta_path: Path | None, rows: Rows) -> tuple[Facts | None, dict[str, Any]]:
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
    except (OSError, UnicodeDecodeError, ValueError, MossGgufError, RecursionError) as exc:
        msg = exc.message if isinstance(exc, MossGgufError) else str(exc)
        rows.add("model facts", FAIL, f"{meta_path.name} is unreadable: {msg}")
        return None, {}
    return facts, meta


def facts_line(f: Facts) -> str:
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


def facts_diff(a: Facts, b: Facts) -> list[str]:
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
