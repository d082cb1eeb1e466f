"""--deep: llama.cpp's final hidden state and audio-head logits against a torch reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UsageError, extra_hint
from ..gguf.read import file_type_name
from ..report import FAIL, PASS
from ..source.checkpoint import MossConfig
from ..tts.backbone import Backbone, BackboneSettings
from .context import WORKERS, Context
from .quality import DEEP_THRESHOLDS, deep_class
from .result import DeepResult


def deep_checks(ctx: Context) -> None:
    """llama.cpp's final hidden state and audio logits against the torch reference."""
    r = ctx.rows
    r.group = "deep"
    if ctx.tokenizer is None or ctx.facts is None or ctx.facts.moss is None:
        r.add(
            "deep: hidden state",
            FAIL,
            "not run: needs a loadable tokenizer and the model config",
        )
        return
    runnable = {p: g for p, g in ctx.ggufs.items() if g.size >= g.data_end}
    for p in ctx.t.ggufs:
        if p not in runnable:
            r.add(
                ctx.names(p, "deep: hidden state"),
                FAIL,
                "not run: the GGUF is unreadable or truncated",
            )
    if not runnable:
        return
    ctx.bar.start("verify:deep", "verify: deep check", 1 + len(runnable), "")
    ids = deep_prompt_ids(ctx.tokenizer, ctx.facts.moss)
    embeds = _deep_embeddings(ctx, ids)
    expected = reference_hidden(ctx.ck.root, embeds)
    ctx.bar.advance("verify:deep")
    heads = [
        _table_rows_f32(ctx, "head", f"lm_head_audio_{k:02d}.npy", f"lm_heads.{k + 1}.weight")
        for k in range(ctx.facts.n_vq)
    ]
    for path, g in runnable.items():
        got = llama_hidden(path, embeds)
        result = compare_deep(
            path.name, file_type_name(g), got, expected, heads, ctx.facts.moss.audio_pad_code
        )
        ctx.deep_results.append(result)
        _deep_rows(ctx, path, result)
        ctx.bar.advance("verify:deep")
    ctx.bar.finish("verify:deep")


def _deep_rows(ctx: Context, path: Path, d: DeepResult) -> None:
    hid, logit, top1 = d.thresholds
    kind = (d.file_type or "?").removeprefix("MOSTLY_")
    ok = d.hidden_cosine_min >= hid
    ctx.rows.add(
        ctx.names(path, "deep: hidden state"),
        PASS if ok else FAIL,
        f"cosine min {d.hidden_cosine_min:.5f}, mean {d.hidden_cosine_mean:.5f} over "
        f"{d.rows} prompt rows ({kind}; limit {hid})",
    )
    ok = d.logits_cosine_min >= logit and d.top1_agreement >= top1
    ctx.rows.add(
        ctx.names(path, "deep: audio logits"),
        PASS if ok else FAIL,
        f"cosine min {d.logits_cosine_min:.5f} over {ctx.facts.n_vq} heads, top-1 "
        f"agreement {d.top1_agreement:.1%} (limits {logit} / {top1:.0%})",
    )


def _table_rows_f32(ctx: Context, key: str, name: str, source_name: str, rows=None) -> np.ndarray:
    """Rows of a table as float32 (all rows: a memory map in the stored dtype): the
    target's .npy when it passed its checks, else the source tensor (a lone GGUF)."""
    folder = ctx.t.embedding_dir if key == "emb" else ctx.t.lm_head_dir
    res = next((x for x in ctx.tables.values() if x.job.path.name == name), None)
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
    ref = ctx.ck.tensors[source_name]
    if rows is None:
        return ref.read_f32()
    return np.stack([ref.read_f32(int(i), int(i) + 1)[0] for i in rows])


def _deep_embeddings(ctx: Context, ids: np.ndarray) -> np.ndarray:
    """docs/ARCHITECTURE.md §5 rows: the text row plus every audio table's pad-code row."""
    moss = ctx.facts.moss
    out = _table_rows_f32(ctx,
        "emb", "embed_tokens.npy", "language_model.embed_tokens.weight", ids
    )
    pad = [moss.audio_pad_code]
    for k in range(moss.n_vq):
        out += _table_rows_f32(ctx, "emb", f"emb_ext_{k:02d}.npy", f"emb_ext.{k}.weight", pad)
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


def check_deep_deps() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "--deep needs torch for the reference forward, which is not installed",
            hint=extra_hint("torch"),
        )
    if importlib.util.find_spec("llama_cpp") is None:
        raise UsageError(
            "--deep needs llama-cpp-python to run the GGUF, which is not installed",
            hint="pip install llama-cpp-python",
        )
