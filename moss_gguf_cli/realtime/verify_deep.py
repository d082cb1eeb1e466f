"""`verify --deep` of a Realtime folder: each GGUF run as the engine runs it, against the exact
F32 files written from the source (realtime/backbone_gguf.py, realtime/depth_gguf.py, in a
temporary folder), on probe rows laid out as upstream's are: the prompt of a short text (text
rows, the last carrying audio BOS) and frame rows (text_pad and one random code a codebook),
each the sum of the source's 17 tables. The backbone: llama.cpp's hidden states for every
probe row; the depth transformer: its first position's logits for each exact hidden state
(the only position whose input does not depend on an earlier pick). The limits are the delay
family's for hidden states (quality.DEEP_THRESHOLDS)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..gguf.write import OutType, write_gguf
from ..report import Rows
from ..tts.sampling import Sampler, SamplingParams
from ..verify.deep import llama_hidden
from ..verify.quality import DEEP_THRESHOLDS, deep_class
from .backbone_gguf import plan_backbone
from .checkpoint import RealtimeCheckpoint
from .depth import DepthTransformer
from .depth_gguf import write_depth
from .layout import BACKBONE_STEM, TEXT_LEAD
from .prompt import PromptIds, prompt_rows

FRAME_ROWS = 16
TEXT = "Hello there, this is a check of the converted model."


def probe_rows(checkpoint: RealtimeCheckpoint, encode, seed: int = 0) -> np.ndarray:
    """The prompt rows of TEXT, then FRAME_ROWS frame rows, embedded from the source."""
    rt, rng = checkpoint.realtime, np.random.default_rng(seed)
    ids = PromptIds(rt.rvq, rt.audio_pad, rt.audio_bos, rt.reference_audio_pad, rt.text_pad)
    prompt = prompt_rows(encode, ids, encode(TEXT), TEXT_LEAD)
    frames = np.concatenate([np.full((FRAME_ROWS, 1), rt.text_pad),
                             rng.integers(0, rt.codes, (FRAME_ROWS, rt.rvq))], axis=1)  # fmt: skip
    rows = np.concatenate([prompt, frames])
    text = checkpoint.tensors["embed_tokens.0.weight"]  # read a row at a time: 1.2 GB whole
    out = np.concatenate([text.read_f32(int(i), int(i) + 1) for i in rows[:, 0]])
    for q in range(1, rt.rvq + 1):
        out += checkpoint.tensors[f"embed_tokens.{q}.weight"].read_f32()[rows[:, q]]
    return out


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                        1e-300)  # fmt: skip


def _first_logits(path: Path, checkpoint: RealtimeCheckpoint, hidden: np.ndarray) -> np.ndarray:
    rt = checkpoint.realtime
    depth = DepthTransformer(path, rt.rvq, rt.audio_eos, threads=2)
    try:
        greedy = SamplingParams(temperature=0.0)
        seen = np.zeros((rt.rvq, depth.vocab), np.float32)
        out = []
        for h in hidden:
            depth.frame(h, Sampler(greedy, greedy, 0), seen, allow_stop=True)
            out.append(depth.logits[0].copy())
        return np.stack(out)
    finally:
        depth.close()


def deep_rows(checkpoint: RealtimeCheckpoint, ggufs: dict[Path, str], encode,
              rows: Rows) -> None:  # fmt: skip
    """One row per GGUF (path → its file type): the worst probe's cosine against the exact
    file's, held to its type's limit."""
    rows.group = "deep"
    embeds = probe_rows(checkpoint, encode)
    with tempfile.TemporaryDirectory(prefix="moss-gguf-realtime-deep-") as tmp:
        exact_backbone = Path(tmp) / "backbone.gguf"
        write_gguf(exact_backbone, plan_backbone(checkpoint, OutType.F32))
        exact = llama_hidden(exact_backbone, embeds)
        exact_backbone.unlink()  # room for the depth file at real dims
        exact_depth = write_depth(checkpoint, Path(tmp) / "depth.gguf", "F32")
        exact_logits = _first_logits(exact_depth, checkpoint, exact)
    for path, file_type in ggufs.items():
        limit = DEEP_THRESHOLDS[deep_class(file_type)][0]
        if path.name.startswith(BACKBONE_STEM):
            worst, what = float(_cosines(llama_hidden(path, embeds), exact).min()), "hidden-state"
        else:
            worst = float(_cosines(_first_logits(path, checkpoint, exact), exact_logits).min())
            what = "first-position logit"
        problems = [] if worst >= limit else [f"{what} cosine {worst:.5f} < {limit}"]
        rows.check(f"{path.name}: ours vs exact", problems,
                   f"{len(embeds)} probe rows, {what} cosine ≥ {worst:.5f} "
                   f"(limit {limit})")  # fmt: skip
