"""How far each `--audio-tables-type` moves the 32 audio heads' logits from the source.

    python benchmarks/audio_tables.py [--layers 2] [--quant Q4_K_M] [--positions 64] [--keep]

On the real-dims checkpoint (_common.real_dims_checkpoint), `all --format moss-tts-delay
--quant Q4_K_M` is run once per choice: the base type (the fork's quantizer's choice: Q4_K in
Q4_K_M), then --audio-tables-type f16, bf16 and q8_0. One teacher-forced sequence (fixed seed:
text ids, and n_vq audio codes per position) is fed through:

- the source: the checkpoint's bf16 weights, widened to float32;
- each file: its stored tensors, dequantized with gguf-py's own `gguf.quants.dequantize`.

The forward is moss-gguf's torch reference (verify/reference.py) in float32: input = text row
+ n_vq audio rows, the Qwen3 backbone, then the n_vq audio heads. Figures per file:
rel_err = ||L_file - L_src|| / ||L_src|| over all heads and positions; worst head's rel_err;
argmax_agree = share of (position, head) whose greedy code is the source's. "tables only"
runs the source backbone and text row with the file's 2 x n_vq audio tables, isolating what
the choice itself changes;
"whole file" has the quantized backbone too. The file sizes come with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from _common import DEFAULT_DIR, measure, real_dims_checkpoint, remove

from moss_gguf_cli.gguf.first_class import AUDIO_EMBD, AUDIO_HEAD, gguf_name
from moss_gguf_cli.gguf.stream import SourceTensor
from moss_gguf_cli.gguf.write import Qwen3Params
from moss_gguf_cli.source.backbone import backbone_config
from moss_gguf_cli.source.checkpoint import open_checkpoint
from moss_gguf_cli.source.safetensors_io import bf16_to_f32
from moss_gguf_cli.verify.reference import forward, read_source_f32

CHOICES = ("base", "f16", "bf16", "q8_0")


class Weights:
    """What reference.forward reads: params, and Hugging Face name → float32 tensor."""

    def __init__(self, params: Qwen3Params, load) -> None:
        self.params, self.load, self.dtype, self.sources = params, load, torch.float32, {}
        self.cache: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.cache:
            self.cache[name] = torch.from_numpy(np.array(self.load(name)))
        return self.cache[name]


def dequantized(t: gguf.ReaderTensor, rows: np.ndarray | None = None) -> np.ndarray:
    """A GGUF tensor (or some of its rows) as float32 through gguf-py's dequantize, in the
    source's shape (a norm stays a vector)."""
    data = t.data if rows is None else t.data[rows]
    out = np.asarray(gguf.quants.dequantize(np.asarray(data), t.tensor_type), dtype=np.float32)
    if rows is None:
        return out.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
    return out.reshape(len(data), -1)


def sequence(n_vq: int, vocab: int, audio_rows: int, positions: int) -> np.ndarray:
    """(positions, 1 + n_vq) ids: a fixed-seed teacher-forced input (text id, then codes)."""
    rng = np.random.default_rng(29)
    text = rng.integers(0, vocab, size=(positions, 1))
    codes = rng.integers(0, audio_rows, size=(positions, n_vq))
    return np.concatenate([text, codes], axis=1)


def logits(weights: Weights, table, ids: np.ndarray, n_vq: int) -> np.ndarray:
    """(n_vq, positions, audio_rows) audio logits for the ids, tables from TABLE(name, rows)."""
    embeds = table("model.embed_tokens.weight", ids[:, 0])
    for i in range(n_vq):
        embeds = embeds + table(f"emb_ext.{i}.weight", ids[:, 1 + i])
    hidden = torch.from_numpy(forward(weights, embeds))
    heads = [hidden @ torch.from_numpy(table(f"lm_heads.{k}.weight", None)).T
             for k in range(1, n_vq + 1)]  # fmt: skip
    return torch.stack(heads).numpy()


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    per_head = np.linalg.norm(got - ref, axis=(1, 2)) / np.linalg.norm(ref, axis=(1, 2))
    agree = (got.argmax(-1) == ref.argmax(-1)).mean()
    return {
        "rel_err": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
        "worst_head_rel_err": float(per_head.max()),
        "argmax_agree": float(agree),
    }


def make_files(ckpt: Path, work: Path, quant: str) -> dict[str, Path]:
    """One `all --format moss-tts-delay` run per choice (no codec: the tables are the point);
    a file a --keep run left is used again."""
    files = {}
    for choice in CHOICES:
        out = work / choice
        files[choice] = out / f"moss-tts-delay_{quant.lower()}.gguf"
        if files[choice].is_file():
            continue
        cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(ckpt), "--output",
               str(out), "--format", "moss-tts-delay", "--quant", quant,
               "--audio-tokenizer", "none", "--quiet"]  # fmt: skip
        if choice != "base":
            cmd += ["--audio-tables-type", choice]
        measure(choice, cmd, out)
    return files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--positions", type=int, default=64)
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the four files")
    args = parser.parse_args()
    torch.set_num_threads(2)
    ckpt = real_dims_checkpoint(DEFAULT_DIR, args.layers)
    ck = open_checkpoint(ckpt)
    params = Qwen3Params.from_config(backbone_config(ck), ckpt / "config.json")
    n_vq, audio_rows = ck.moss.n_vq, ck.moss.audio_vocab_size + 1
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, params.n_layers)
    hf = {}  # Qwen3ForCausalLM name (model.*) → checkpoint name, first-class name
    for name in ck.tensors:
        if (new := gguf_name(name, names)) is not None:
            short = name.removeprefix("language_model.")
            hf[name if short == name else "model." + short] = (name, new)

    def source_load(name: str) -> np.ndarray:
        ref = ck.tensors[hf[name][0]]
        src = SourceTensor(ref.name, ref.path, ref.dtype, tuple(ref.shape), ref.offset, ref.nbytes)
        return read_source_f32(src)

    def source_table(name: str, rows) -> np.ndarray:
        if rows is None:
            return source_load(name)
        ref = ck.tensors[hf[name][0]]  # only the rows: the text table is 2.5 GB as float32
        picked = np.asarray(ref.array()[rows])
        return bf16_to_f32(picked) if ref.dtype == "BF16" else picked.astype(np.float32)

    ids = sequence(n_vq, params.vocab, audio_rows, args.positions)
    src_weights = Weights(params, source_load)
    ref = logits(src_weights, source_table, ids, n_vq)
    # other runs may share DEFAULT_DIR; --keep runs share (and reuse) one folder
    name = "audio-tables-bench" if args.keep else f"audio-tables-bench-{os.getpid()}"
    work = DEFAULT_DIR / name
    if not args.keep:
        remove(work)
    files = make_files(ckpt, work, args.quant)
    results = {}
    backbone: Weights | None = None
    for choice, path in files.items():
        reader = gguf.GGUFReader(path)
        tensors = {t.name: t for t in reader.tensors}

        def file_table(name: str, rows, tensors=tensors) -> np.ndarray:
            return dequantized(tensors[hf[name][1]], rows)

        def audio_only(name: str, rows, file_table=file_table) -> np.ndarray:
            # the file's audio tables, the source's text row: what --audio-tables-type changes
            text = name == "model.embed_tokens.weight"
            return (source_table if text else file_table)(name, rows)

        if backbone is None:  # the backbone's bytes are the same in every file (checked below)
            backbone = Weights(params, lambda n, t=tensors: dequantized(t[hf[n][1]]))
            first = tensors
        same = all(np.array_equal(first[n].data, t.data) for n, t in tensors.items()
                   if not n.startswith((AUDIO_EMBD, AUDIO_HEAD)))  # fmt: skip
        if not same:
            raise SystemExit(f"{path}: the backbone differs from {choice}'s first file")
        tables = sorted({t.tensor_type.name for n, t in tensors.items()
                         if n.startswith((AUDIO_EMBD, AUDIO_HEAD))})  # fmt: skip
        results[choice] = {
            "audio_tables": "/".join(tables),
            "file_mb": round(path.stat().st_size / 1e6, 1),
            "tables_only": compare(ref, logits(src_weights, audio_only, ids, n_vq)),
            "whole_file": compare(ref, logits(backbone, file_table, ids, n_vq)),
        }
        print(choice, json.dumps(results[choice]), file=sys.stderr)
    if not args.keep:
        remove(work)
    print(json.dumps({"quant": args.quant, "layers": args.layers, "positions": args.positions,
                      "results": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
