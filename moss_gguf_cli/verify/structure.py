"""The files: which must be there, named and shaped as the model facts say; the manifest."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from ..disk.confine import child
from ..disk.layout_names import BACKBONE_DIR, META_NAME
from ..errors import InputError, MossGgufError
from ..gguf.write import OutType, plan_backbone_tensors
from ..report import FAIL, WARN
from ..source.backbone import TOKENIZER_REQUIRED, open_backbone
from .context import Context
from .target import shown_path

CODEC_ROW = "audio tokenizer"


CODEC_FIX = (
    "moss-gguf layout --output FOLDER --audio-tokenizer OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"
)


def expected_tables(ctx: Context) -> list[tuple[str, str, tuple[int, int] | None]]:
    """(folder key, file name, expected shape) of every table."""
    f = ctx.facts
    n_vq = f.n_vq if f and f.n_vq else 0
    h, v, a = (f.hidden, f.vocab, f.audio_rows) if f else (None, None, None)
    big = (v, h) if v and h else None
    small = (a, h) if a and h else None
    out = [("emb", "embed_tokens.npy", big)]
    out += [("emb", f"emb_ext_{i:02d}.npy", small) for i in range(n_vq)]
    out += [("head", "lm_head_text.npy", big)]
    out += [("head", f"lm_head_audio_{i:02d}.npy", small) for i in range(n_vq)]
    return out


def file_rows(ctx: Context) -> None:
    t, r = ctx.t, ctx.rows
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
        _backbone_weights(ctx)
    if t.kind == "gguf":
        return
    n_vq = ctx.facts.n_vq if ctx.facts else None
    for key, label, folder in (
        ("emb", "embedding tables", t.embedding_dir),
        ("head", "head tables", t.lm_head_dir),
    ):
        names = [name for k, name, _ in expected_tables(ctx) if k == key]
        missing = [n for n in names if folder is None or not (folder / n).is_file()]
        problems = (
            [f"{shown_path(folder / n, t.root)} is missing" for n in missing]
            if folder
            else ["no folder"]
        )
        prefix = "emb_ext_" if key == "emb" else "lm_head_audio_"
        if folder is not None and folder.is_dir() and n_vq is not None:
            extra = sorted(p.name for p in folder.glob(f"{prefix}*.npy") if p.name not in names)
            problems += [f"{shown_path(folder / n, t.root)} is beyond n_vq {n_vq}" for n in extra]
        if n_vq is None:
            problems.append("n_vq unknown: the expected names cannot be listed")
        r.check(label, problems, f"{len(names)} files (1 + n_vq {n_vq})")
    tok = t.tokenizer_dir
    missing = [n for n in TOKENIZER_REQUIRED if tok is None or not (tok / n).is_file()]
    r.check(
        "tokenizer files",
        [f"{shown_path(tok / n, t.root) if tok else n} is missing" for n in missing],
        ", ".join(sorted(p.name for p in tok.iterdir() if p.is_file())) if tok else "",
    )
    made = ctx.meta.get("first_class")
    if isinstance(made, dict):  # laid out from a first-class GGUF: say how exact the tables are
        r.check(FIRST_CLASS_ROW, [], first_class_detail(made))


FIRST_CLASS_ROW = "tables from a first-class GGUF"


def first_class_detail(made: dict) -> str:
    """What extraction_meta.json's first_class record says of the tables."""
    types = ", ".join(f"{n} {t}" for t, n in sorted((made.get("table_types") or {}).items()))
    how = made.get("tables")
    if how == "exact":
        return f"exact: the f16 bytes of {made.get('file')} ({types})"
    if how == "dequantized":
        n = len(made.get("dequantized") or [])
        return f"{n} dequantized from {made.get('file')} ({types}): not the checkpoint's values"
    return f"rounded to f16 from {made.get('file')} ({types})"


def _backbone_weights(ctx: Context) -> None:
    """An extract folder's qwen3_backbone/: config, shards and every tensor's shape."""
    r = ctx.rows
    folder = ctx.t.backbone_dir
    try:
        bb = open_backbone(folder)
        plan_backbone_tensors(bb.params, bb.tensors, OutType.F16, folder)
    except MossGgufError as exc:
        if "no model.safetensors" in exc.message:  # `all` extracts without them
            r.add("backbone weights", WARN, f"{BACKBONE_DIR}/ holds no weights, only its "
                  "config and tokenizer (extracted without them, as `all` does)")  # fmt: skip
        else:
            r.add("backbone weights", FAIL, exc.one_line())
        return
    ctx.backbone = bb
    problems = []
    want = ctx.facts.params if ctx.facts else None
    # extract always unties lm_head (MOSS keeps lm_heads.0 apart from the embeddings)
    if want is not None and bb.params != dataclasses.replace(want, tied=bb.params.tied):
        problems.append(f"config.json differs from {META_NAME}'s language_config")
    size = sum(s.nbytes for s in bb.tensors.values())
    r.check(
        "backbone weights",
        problems,
        f"{len(bb.tensors)} tensors, {size / 1e9:.2f} GB, shapes as its config",
    )


def table_rows(ctx: Context) -> None:
    r = ctx.rows
    r.group = "tables"
    if ctx.t.kind == "gguf":
        return
    fmt, shapes, sizes, values, warn_values = [], [], [], [], []
    for rel, res in sorted(ctx.tables.items()):
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
    n = len(ctx.tables)
    dtypes = sorted({np.dtype(x.dtype).name for x in ctx.tables.values() if x.dtype})
    r.check("table format", fmt, f"{n} .npy headers readable, {'/'.join(dtypes) or '-'}")
    known = ctx.facts and ctx.facts.hidden and ctx.facts.vocab and ctx.facts.audio_rows
    r.check(
        "table shapes",
        shapes,
        "vocab × hidden and (audio vocab + 1) × hidden"
        if known
        else "2-D (no model facts to compare sizes with)",
    )
    r.check("table sizes", sizes, "every file is as long as its header and data")
    r.check("table values", values, "all values finite", warn=warn_values)


def manifest_entries(ctx: Context) -> dict[str, dict[str, Any]]:
    m = ctx.t.manifest
    if m is None:
        return {}
    root = m.parent
    try:
        data = json.loads(m.read_text(encoding="utf-8"))
        files = data["files"]
        if not isinstance(files, list):
            raise TypeError("'files' is not a list")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        ctx.manifest_problems.append(f"{m.name} is unreadable ({exc})")
        return {}
    out: dict[str, dict[str, Any]] = {}
    for entry in files:
        try:
            rel, size, sha = str(entry["path"]), int(entry["size"]), str(entry["sha256"])
        except (KeyError, TypeError, ValueError):
            ctx.manifest_problems.append(f"malformed entry {entry!r:.80}")
            continue
        try:
            p = child(root, rel, "manifest entry", m)
        except InputError:
            ctx.manifest_problems.append(f"{rel}: path outside the folder")
            p = None
        out[rel] = {"path": p, "size": size, "sha256": sha.lower()}
    return out


def manifest_row(ctx: Context, entries: dict[str, dict[str, Any]], by_path) -> None:
    if ctx.t.manifest is None:
        return
    r = ctx.rows
    r.group = "manifest"
    problems = list(ctx.manifest_problems)
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
    _download_rows(ctx)


def _download_rows(ctx: Context) -> None:
    """What each downloaded input's hashes were checked against when the folder was made."""
    try:
        checks = json.loads(ctx.t.manifest.read_text(encoding="utf-8")).get("checks") or {}
    except (OSError, ValueError, AttributeError, RecursionError):
        return
    for what, how in sorted(checks.items()):
        if isinstance(how, str):
            unchecked = how.startswith("not checked")
            name = f"{what.replace('_', ' ')} download"
            ctx.rows.check(name, [], how, warn=[how] if unchecked else ())
