"""The GGUF's header: size, architecture, hyperparameters, tensors, file type, tokenizer keys."""

from __future__ import annotations

import math
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from ..gguf.read import GgufArray, GgufFile, GgufFormatError, file_type_name, read_gguf
from ..gguf.write import Qwen3Params
from ..report import FAIL, PASS, WARN
from ..source.token_ids import TOKEN_DEFAULTS
from .context import Context
from .quality import bpw_range, file_type_base
from .tensors import expected_gguf_tensors


def parse_ggufs(ctx: Context) -> None:
    for path in ctx.t.ggufs:
        if not path.is_file():
            ctx.gguf_errors[path] = f"{path.name} is missing"
            continue
        try:
            ctx.ggufs[path] = read_gguf(path)
        except (GgufFormatError, OSError, ValueError) as exc:
            ctx.gguf_errors[path] = f"{path.name}: {exc}"


def gguf_checks(ctx: Context) -> None:
    for path in ctx.t.ggufs:
        ctx.rows.group = "gguf"
        _one_gguf(ctx, path)


def _one_gguf(ctx: Context, path: Path) -> None:
    r = ctx.rows

    def name(check: str) -> str:
        return ctx.names(path, check)

    g = ctx.ggufs.get(path)
    if g is None:
        r.add(name("GGUF header"), FAIL, ctx.gguf_errors[path])
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
    hp = _gguf_params(ctx, g)
    _hparams_row(ctx, g, hp, name)
    _tensors_row(ctx, g, hp, name)
    _file_type_rows(ctx, g, name)
    _gguf_tokenizer_row(ctx, g, name)
    _gguf_values_row(ctx, path, g, name)


def _gguf_values_row(ctx: Context, path: Path, g: GgufFile, name) -> None:
    scan = ctx.gguf_scans.get(path)
    if scan is None or scan.error:
        ctx.rows.add(name("GGUF values"), FAIL, f"unreadable: {scan.error if scan else '?'}")
        return
    problems = [f"{n} holds Inf/NaN" for n in scan.gguf_nonfinite]
    cut = [t.name for t in g.tensors.values() if not g.in_file(t)]
    if cut:
        problems.append(f"{len(cut)} tensors past the end of the file were not read")
    warn = [f"{ty} blocks not tested (layout unknown)" for ty in sorted(scan.gguf_unscanned)]
    ctx.rows.check(
        name("GGUF values"),
        problems,
        f"no Inf/NaN in {len(g.tensors)} tensors (floats, and quantized block scales)",
        warn=warn,
    )


def _gguf_params(ctx: Context, g: GgufFile):
    """The hyperparameters to hold the GGUF to: the model facts, else its own keys."""
    if ctx.facts is not None and ctx.facts.params is not None:
        return ctx.facts.params
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


def _hparams_row(ctx: Context, g: GgufFile, hp, name) -> None:
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
    origin = ctx.facts.origin if ctx.facts and ctx.facts.params else "its own keys"
    r = ctx.rows
    if origin == "its own keys":
        r.check(
            name("GGUF hyperparameters"),
            problems,
            "all present (no model config to compare with; tensor shapes checked against them)",
        )
    else:
        r.check(name("GGUF hyperparameters"), problems, f"all 10 equal the config ({origin})")


def _tensors_row(ctx: Context, g: GgufFile, hp, name) -> None:
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
    ctx.rows.check(
        name("GGUF tensors"),
        problems,
        f"{len(want)} tensors (3 + 11 × {hp.n_layers} layers), shapes as the config",
    )


def _file_type_rows(ctx: Context, g: GgufFile, name) -> None:
    r = ctx.rows
    file_type = file_type_name(g)
    weights = [t for t in g.tensors.values() if len(t.dims) == 2]
    counts = Counter(t.type_name for t in weights)
    mix = ", ".join(f"{k} ×{v}" for k, v in counts.most_common())
    base = file_type_base(file_type) if file_type else None
    if file_type is None:
        raw = g.kv.get("general.file_type")
        r.add(
            name("GGUF file type"),
            FAIL,
            "general.file_type is missing"
            if raw is None
            else f"general.file_type {raw} is not a llama.cpp file type",
        )
    elif base is None:
        r.add(name("GGUF file type"), WARN, f"{file_type}: unknown to this check; matrices {mix}")
    elif base not in counts:
        r.add(name("GGUF file type"), FAIL, f"{file_type} but no {base} tensor: matrices {mix}")
    elif counts.most_common(1)[0][0] != base:
        r.add(
            name("GGUF file type"),
            WARN,
            f"{file_type} but {base} is not the most common type: matrices {mix}",
        )
    else:
        r.add(name("GGUF file type"), PASS, f"{file_type.removeprefix('MOSTLY_')}: matrices {mix}")
    n_el = sum(t.n_elements for t in g.tensors.values())
    bpw = sum(t.nbytes for t in g.tensors.values()) * 8 / max(n_el, 1)
    rng = bpw_range(file_type) if file_type else None
    if rng is None:
        r.add(name("GGUF bits per weight"), WARN, f"{bpw:.2f} bpw (no range for this type)")
    elif not rng[0] <= bpw <= rng[1]:
        r.add(
            name("GGUF bits per weight"),
            FAIL,
            f"{bpw:.2f} bpw, outside llama.cpp's {rng[0]:.2f}–{rng[1]:.2f} for {file_type}",
        )
    else:
        r.add(
            name("GGUF bits per weight"),
            PASS,
            f"{bpw:.2f} bpw (range {rng[0]:.2f}–{rng[1]:.2f})",
        )


def _gguf_tokenizer_row(ctx: Context, g: GgufFile, name) -> None:
    kv = g.kv
    problems, warns = [], []
    if kv.get("tokenizer.ggml.model") != "gpt2":
        problems.append(
            f"tokenizer.ggml.model is {kv.get('tokenizer.ggml.model')!r}, expected 'gpt2'"
        )
    tokens = kv.get("tokenizer.ggml.tokens")
    vocab = ctx.facts.vocab if ctx.facts else None
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
    ids = _special_expect(ctx)
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
        wanted = [i for i in ctx.facts.token_ids().values()] if ctx.facts else []
        try:
            ctx.gguf_special = g.strings("tokenizer.ggml.tokens", wanted)
        except (struct.error, IndexError, ValueError):
            problems.append("tokenizer.ggml.tokens cannot be read")
    count = tokens.count if isinstance(tokens, GgufArray) else 0
    ctx.rows.check(
        name("GGUF tokenizer"),
        problems,
        f"gpt2/{kv.get('tokenizer.ggml.pre')}, {count} tokens, bos/eos/pad ids as the config",
        warn=warns,
    )


def _special_expect(ctx: Context) -> dict[str, set[int] | None]:
    lang = ctx.facts.language if ctx.facts else {}
    ids = ctx.facts.token_ids() if ctx.facts else dict(TOKEN_DEFAULTS)

    def as_set(value: Any) -> set[int] | None:
        if value is None:
            return None
        return {int(v) for v in value} if isinstance(value, list) else {int(value)}

    if not ctx.facts or ctx.facts.moss is None:
        return {"bos_token_id": None, "eos_token_id": None, "padding_token_id": None}
    return {
        "bos_token_id": as_set(lang.get("bos_token_id")),
        "eos_token_id": as_set(lang.get("eos_token_id", ids["im_end_token_id"])),
        "padding_token_id": as_set(lang.get("pad_token_id") or ids["pad_token_id"]),
    }
