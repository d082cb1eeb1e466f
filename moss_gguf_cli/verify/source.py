"""Comparisons: the tables against the GGUF (sampled rows, no source needed), and with --source
the source checkpoint against everything (its config, the tables exactly, every GGUF tensor).

Without --source, the text head and text embedding tables are compared with the GGUF's
``output`` / ``token_embd`` on 512 sampled rows (32 evenly spread runs of 16): another
model's or a misplaced tensor measures a relative RMSE near 1.4 on any sample, while the cost
stays independent of the vocabulary; --source compares every row of every tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..disk.layout_names import META_NAME
from ..errors import InputError, UsageError
from ..gguf.read import GgufFile
from ..report import FAIL, PASS
from ..source.checkpoint import BUILTIN_PREFIX, MossCheckpoint, open_checkpoint, resolve_model
from ..source.lora import AdapterSpec, merged, open_adapter, plan_merge
from .context import Context
from .model_facts import Facts, facts_diff, facts_from_config, facts_line, read_meta_facts
from .quality import QualitySummary, TensorQuality, tensor_threshold
from .tensors import (
    SOURCE_DTYPES,
    Sums,
    compare_block,
    compare_tensors,
    expected_gguf_tensors,
    moss_source_name,
    row_reader,
    same_bytes,
)
from .values import FileResult


def open_source(ctx: Context) -> None:
    r = ctx.rows
    r.group = "files"
    meta_facts, ctx.meta = read_meta_facts(ctx.t.meta, r)
    if ctx.source_arg is not None:
        ctx.ck = open_checkpoint(resolve_model(ctx.source_arg, progress=ctx.bar))
    elif ctx.deep:
        ctx.ck = _recorded_source(ctx)
    if ctx.ck is not None:
        ctx.ck = _with_recorded_adapters(ctx, ctx.ck)
    src_facts = None
    if ctx.ck is not None:
        src_facts = facts_from_config(ctx.ck.config, "source", ctx.ck.root / "config.json")
    ctx.facts = src_facts or meta_facts
    if meta_facts is not None:
        where = f"from {meta_facts.origin}"
        derived = (ctx.meta or {}).get("derived")
        if isinstance(derived, dict):  # pre-converted weights come without a config
            how = "; ".join(f"{k} from {v}" for k, v in derived.items() if k != "from")
            where += f", derived ({how})"
        r.add("model facts", PASS, f"{facts_line(meta_facts)} {where}")
    elif src_facts is not None and ctx.t.meta is None:
        r.add("model facts", PASS, f"{facts_line(src_facts)} from the source")
    if meta_facts is not None and src_facts is not None:
        r.group = "source"
        diffs = facts_diff(meta_facts, src_facts)
        r.check(
            "source config",
            [f"{META_NAME} says {d}" for d in diffs],
            f"{META_NAME} agrees with the source ({ctx.ck.root})",
        )
    if ctx.facts is None and ctx.t.meta is not None and ctx.t.embedding_dir is not None:
        n = len(list(ctx.t.embedding_dir.glob("emb_ext_*.npy")))
        ctx.facts = Facts("the tables present", n_vq=n or None)


def _with_recorded_adapters(ctx: Context, ck: MossCheckpoint) -> MossCheckpoint:
    """The source as the folder was made from it: with the LoRA adapters its manifest says
    were merged (each found again and its files' sha256 checked against the record)."""
    records = _manifest_lora(ctx)
    if not records:
        return ck
    if ctx.deep:  # the reference forward runs on the checkpoint's own files
        raise UsageError("--deep runs the source's torch forward, which knows nothing of the "
                         "LoRA adapters this folder was merged with", path=ctx.t.path,
                         hint="verify it with --source alone")  # fmt: skip
    adapters = []
    for record in records:
        adapter = open_adapter(AdapterSpec(str(record["adapter"]), float(record["scale"])),
                               progress=ctx.bar)  # fmt: skip
        if adapter.sha256 != record.get("sha256"):
            raise InputError("is not the adapter this folder was merged with (its files' "
                             "sha256 differ from the manifest's)", path=adapter.folder,
                             hint="give verify the adapter the folder was made with")  # fmt: skip
        adapters.append(adapter)
    ctx.rows.add("merged adapters", PASS, "; ".join(
        f"{r['adapter']} (scale {float(r['scale']):g})" for r in records) +
        ": the source is compared with their updates added")  # fmt: skip
    return merged(ck, plan_merge(ck, adapters))


def _manifest_lora(ctx: Context) -> list[dict]:
    path = ctx.t.manifest
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    except (OSError, ValueError, RecursionError):
        return []  # the manifest's own row says what is wrong with it
    lora = data.get("lora") if isinstance(data, dict) else None
    return [r for r in lora if isinstance(r, dict) and "adapter" in r] if isinstance(lora, list) \
        else []  # fmt: skip


def _recorded_source(ctx: Context) -> MossCheckpoint | None:
    """--deep without --source: the source_model in extraction_meta.json, if local."""
    recorded = ctx.meta.get("source_model")
    if isinstance(recorded, str) and (
        recorded.startswith(BUILTIN_PREFIX) or Path(recorded).expanduser().is_dir()
    ):
        return open_checkpoint(resolve_model(recorded, progress=ctx.bar))
    where = (
        f"{META_NAME} names {recorded!r}, not a local folder"
        if recorded
        else (f"no source_model in {META_NAME}")
    )
    raise UsageError(
        f"--deep needs the source checkpoint: {where}",
        path=ctx.t.path,
        hint="pass --source MODEL (a local folder, a Hub id or builtin:tiny)",
    )


def cross_checks(ctx: Context) -> None:
    r = ctx.rows
    r.group = "cross"
    hidden = {}
    for rel, res in ctx.tables.items():
        if res.shape and len(res.shape) == 2:
            hidden.setdefault(res.shape[1], []).append(rel)
    for path, g in ctx.ggufs.items():
        n_embd = g.kv.get(f"{g.arch or 'qwen3'}.embedding_length")
        if hidden:
            off = [f"{len(v)} tables have {h}" for h, v in hidden.items() if h != n_embd]
            r.check(
                ctx.names(path, "hidden size"),
                [f"GGUF embedding_length {n_embd}; " + "; ".join(off)] if off else [],
                f"{n_embd} in the GGUF and every table",
            )
        for table, tensor, label in (
            ("lm_head_text.npy", "output.weight", "text head vs GGUF output"),
            ("embed_tokens.npy", "token_embd.weight", "text embedding vs GGUF token_embd"),
        ):
            res = next((x for x in ctx.tables.values() if x.job.path.name == table), None)
            if res is None:
                continue
            _sampled_compare(ctx, path, g, res, tensor, ctx.names(path, label))


def _sampled_compare(ctx: Context, path: Path, g: GgufFile, res: FileResult, tensor: str, label):
    """A table against a GGUF tensor on sampled rows: 32 evenly spread runs of 16 rows."""
    r = ctx.rows
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
    sums = Sums()
    dtype = "F16" if np.dtype(res.dtype).itemsize == 2 else "F32"
    with open(path, "rb") as gf, open(res.job.path, "rb") as tf:
        read = row_reader(res.job.path, res.data_offset, res.shape[1], dtype, tf.fileno())
        for s in starts:
            s = max(0, s)
            compare_block(gf.fileno(), g, t, s, min(rows_total, s + run), read, sums)
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


def source_checks(ctx: Context) -> None:
    if ctx.ck is None:
        return
    r = ctx.rows
    r.group = "source"
    if ctx.tables:
        problems = [
            f"{rel}: {res.source_problem}"
            for rel, res in sorted(ctx.tables.items())
            if res.source_problem
        ]
        missing = [rel for rel, res in ctx.tables.items() if res.job.source is None]
        problems += [f"{rel}: no source tensor" for rel in missing]
        dtypes = sorted({np.dtype(x.dtype).name for x in ctx.tables.values() if x.dtype})
        r.check(
            "tables vs source",
            problems,
            f"{len(ctx.tables)} tables equal their source "
            f"tensors exactly (bf16 → {'/'.join(dtypes)})",
        )
    if ctx.t.kind == "extract" and ctx.backbone is not None:
        _backbone_vs_source(ctx)
    ctx.quality = QualitySummary()
    for path, g in ctx.ggufs.items():
        _gguf_vs_source(ctx, path, g)


def _backbone_vs_source(ctx: Context) -> None:
    """The extracted safetensors hold the source bytes unchanged."""
    problems = []
    src = {hf: ref for hf, ref in ctx.ck.backbone_tensors()}
    for name, t in ctx.backbone.tensors.items():
        ref = src.get(name)
        if ref is None:
            problems.append(f"{name}: not in the source")
        elif (t.dtype, tuple(t.shape)) != (ref.dtype, tuple(ref.shape)):
            problems.append(
                f"{name}: {t.dtype} {list(t.shape)} vs source {ref.dtype} {list(ref.shape)}"
            )
        elif not same_bytes(t.path, t.offset, ref.path, ref.offset, t.nbytes):
            problems.append(f"{name}: bytes differ from {ref.name}")
    ctx.rows.check(
        "backbone vs source",
        problems,
        f"{len(ctx.backbone.tensors)} tensors byte-identical to the source",
    )


def _gguf_vs_source(ctx: Context, path: Path, g: GgufFile) -> None:
    r = ctx.rows
    label = ctx.names(path, "GGUF vs source")
    if ctx.ck is None or ctx.facts is None or ctx.facts.params is None:
        return
    want = expected_gguf_tensors(ctx.facts.params)
    pairs, problems = [], []
    for gname, (hf, _shape) in want.items():
        t = g.tensors.get(gname)
        ref = ctx.ck.tensors.get(moss_source_name(hf))
        if t is None or ref is None:
            continue  # the tensor set row reports it
        if t.dims != tuple(reversed(ref.shape)):
            problems.append(
                f"{gname} is {list(t.dims)}, source {ref.name} is {list(ref.shape)}"
            )
        elif not g.in_file(t):
            problems.append(f"{gname}: data past the end of the file")
        elif ref.dtype not in SOURCE_DTYPES:
            problems.append(f"{gname}: source dtype {ref.dtype}")
        else:
            pairs.append((t, ref))
    results = compare_tensors(g, pairs, ctx.bar)
    for t, ref, rel, cos in results:
        max_rel, min_cos = tensor_threshold(t.type_name)
        q = TensorQuality(path.name, t.name, ref.name, t.type_name, rel, cos, max_rel, min_cos)
        ctx.quality.tensors.append(q)
        if not q.ok:
            problems.append(
                f"{t.name} ({t.type_name}) rel. RMSE {rel:.3g}, cosine {cos:.4f} "
                f"(limits {max_rel:g} / {min_cos:.5f})"
            )
    mine = [q for q in ctx.quality.tensors if q.gguf == path.name]
    worst = max(mine, key=lambda q: q.badness, default=None)
    detail = f"{len(mine)} tensors within their type's limits"
    if worst is not None:
        detail += (
            f"; worst {worst.name} ({worst.type}) rel. RMSE {worst.rel_rmse:.4f}, "
            f"cosine {worst.cosine:.5f}"
        )
    r.check(label, problems, detail)
