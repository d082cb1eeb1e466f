"""What TARGET is (weights folder, synth YAML, extract folder or GGUF) and where its parts are."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..disk.layout_names import (
    BACKBONE_DIR,
    EMBEDDING_DIR,
    LM_HEAD_DIR,
    MANIFEST_NAME,
    META_NAME,
    TOKENIZER_DIR,
)
from ..errors import InputError

YAML_PATH_KEYS = ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir")


YAML_ONNX_KEYS = ("audio_encoder_onnx", "audio_decoder_onnx")


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
            msg = f"{key} points at a missing {shown_path(p, base)}"
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


def shown_path(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
