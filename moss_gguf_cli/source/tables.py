"""The extracted layout's tables (docs/ARCHITECTURE.md §3): which checkpoint tensor becomes
which ``.npy`` file. extract writes them, verify compares them, `all` plans its disk and its
page-cache dropping with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..disk.layout_names import EMBEDDING_DIR, LM_HEAD_DIR
from .checkpoint import MossCheckpoint, TensorRef


@dataclass(frozen=True)
class NpyJob:
    """One `.npy` table: where it goes and which source tensor fills it."""

    relpath: str
    source: TensorRef


def npy_jobs(ck: MossCheckpoint) -> list[NpyJob]:
    t = ck.tensors
    jobs = [NpyJob(f"{EMBEDDING_DIR}/embed_tokens.npy", t["language_model.embed_tokens.weight"])]
    jobs += [
        NpyJob(f"{EMBEDDING_DIR}/emb_ext_{i:02d}.npy", t[f"emb_ext.{i}.weight"])
        for i in range(ck.moss.n_vq)
    ]
    jobs.append(NpyJob(f"{LM_HEAD_DIR}/lm_head_text.npy", t["lm_heads.0.weight"]))
    jobs += [
        NpyJob(f"{LM_HEAD_DIR}/lm_head_audio_{i:02d}.npy", t[f"lm_heads.{i + 1}.weight"])
        for i in range(ck.moss.n_vq)
    ]
    return jobs
