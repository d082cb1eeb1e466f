"""The two LoRA routes measured: merged Q4_K_M vs base Q4_K_M + run-time adapter, and the cost
of a run-time adapter per step.

    python benchmarks/lora_runtime.py [--real-dims --layers 2] [--rank 16] [--steps 200]
        [--rounds 3] [--b-scale 1e-3]

The checkpoint is builtin:tiny, or with --real-dims the real-dims one of _common.py. The
adapter is benchmarks/lora.py's (the Norwegian adapter's shape: r 16, alpha 32, the MLPs' B
non-zero at --b-scale, attention B zero). Files:
- the float32 merge (the reference): the checkpoint merged in float32 (part 1's code), F32;
- the merged Q4_K_M: the same merge as F16, quantized by llama.cpp;
- base Q4_K_M + the adapter GGUF (`convert --format lora`, f32) applied by llama.cpp.
64 rows of inputs (text rows of fixed random ids plus the audio pad rows, as a prompt's)
go through each file (tts/backbone.py `hidden_states`), then the n_vq audio heads in float32.
Figures: rel_err = ||L − L_ref|| / ||L_ref||; of_update = ||L − L_ref|| / ||L_ref − L_base||
(the error as a share of what the adapter changes: above 1, the update is lost in noise);
update_err = ||(L − L_same_file_unmerged) − (L_ref − L_base_f32)|| / ||L_ref − L_base_f32||
(how well the file carries the update itself, its own base's rounding taken out);
argmax = share of (row, head) whose greedy code is the reference's.
The per-step cost: single-row decode steps (after a 32-row prefill) on the base Q4_K_M with
and without the adapter, alternated --rounds times in one process, median ms a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import real_dims_checkpoint
from lora import write_adapter

from moss_gguf_cli.pipeline.convert import convert
from moss_gguf_cli.pipeline.lora_convert import convert_lora
from moss_gguf_cli.quantize.llama import quantize
from moss_gguf_cli.source.checkpoint import open_checkpoint
from moss_gguf_cli.source.lora import AdapterSpec, merged, open_adapter, plan_merge
from moss_gguf_cli.source.tiny import ensure_tiny
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings


def logits(gguf: Path, rows: np.ndarray, heads: np.ndarray, lora: Path | None = None):
    with Backbone(gguf, BackboneSettings(n_ctx=512, n_batch=128)) as b:
        if lora is not None:
            b.use_adapters([(b.load_adapter(lora), 1.0)])
        return np.einsum("th,kvh->tkv", b.hidden_states(rows), heads)


def step_ms(gguf: Path, rows: np.ndarray, lora: Path | None, steps: int, rounds: int) -> dict:
    with Backbone(gguf, BackboneSettings(n_ctx=512, n_batch=128)) as b:
        handle = b.load_adapter(lora) if lora is not None else None
        out = {"base": [], "adapter": []}
        for _ in range(rounds):
            for case in out:
                b.use_adapters([(handle, 1.0)] if case == "adapter" else [])
                b.reset()
                b.prefill(rows[:32], logits=False)
                started = time.perf_counter()
                for i in range(steps):
                    b.step(rows[32 + i % 32], logits=False)
                out[case].append(1000 * (time.perf_counter() - started) / steps)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real-dims", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--b-scale", type=float, default=1e-3)
    args = ap.parse_args()
    ckpt = real_dims_checkpoint(layers=args.layers) if args.real_dims else ensure_tiny("tiny")
    work = Path(tempfile.mkdtemp(prefix="lora-runtime-"))
    adapter = write_adapter(ckpt, work / "adapter", args.rank)
    if args.b_scale != 1e-3:  # the same factors, B rescaled
        from safetensors.numpy import load_file, save_file

        path = adapter / "adapter_model.safetensors"
        t = load_file(path)
        save_file({k: v * np.float32(args.b_scale / 1e-3) if "lora_B" in k else v
                   for k, v in t.items()}, path)  # fmt: skip
    ck = open_checkpoint(ckpt)
    deltas = plan_merge(ck, [open_adapter(AdapterSpec(str(adapter)))])
    files = {
        "base_f32": convert(ck, work / "base_f32.gguf", "f32").outfile,
        "merge_f32": convert(merged(ck, deltas), work / "merge_f32.gguf", "f32").outfile,
        "base_f16": convert(ck, work / "base_f16.gguf", "f16").outfile,
        "merge_f16": convert(merged(ck, deltas), work / "merge_f16.gguf", "f16").outfile,
    }
    for name in ("base", "merge"):
        quantize(files[f"{name}_f16"], work / f"{name}_q4_k_m.gguf", "Q4_K_M")
        files[f"{name}_q4"] = work / f"{name}_q4_k_m.gguf"
    lora = convert_lora(str(adapter), str(ckpt), work / "adapter.gguf").outfile
    n_vq = ck.moss.n_vq
    rng = np.random.default_rng(0)
    text = ck.tensors["language_model.embed_tokens.weight"].read_f32()
    rows = text[rng.integers(0, text.shape[0] - 1, 64)]
    rows += sum(ck.tensors[f"emb_ext.{k}.weight"].read_f32()[-1] for k in range(n_vq))
    heads = np.stack([ck.tensors[f"lm_heads.{k + 1}.weight"].read_f32() for k in range(n_vq)])
    ref = logits(files["merge_f32"], rows, heads)
    ref_update = ref - logits(files["base_f32"], rows, heads)
    update = np.linalg.norm(ref_update)
    unmerged = {"F16": logits(files["base_f16"], rows, heads),
                "Q4_K_M": logits(files["base_q4"], rows, heads)}
    report = {"checkpoint": str(ckpt), "rank": args.rank, "b_scale": args.b_scale,
              "update_rel": float(update / np.linalg.norm(ref))}  # fmt: skip
    cases = {"merged F16": (files["merge_f16"], None),
             "merged Q4_K_M": (files["merge_q4"], None),
             "base Q4_K_M + adapter": (files["base_q4"], lora),
             "base F16 + adapter": (files["base_f16"], lora),
             "base Q4_K_M (no adapter)": (files["base_q4"], None)}  # fmt: skip
    for name, (gguf, ad) in cases.items():
        got = logits(gguf, rows, heads, ad)
        err = np.linalg.norm(got - ref)
        moved = got - unmerged["Q4_K_M" if "Q4_K_M" in name else "F16"]
        report[name] = {"rel_err": float(err / np.linalg.norm(ref)),
                        "update_err": float(np.linalg.norm(moved - ref_update) / update),
                        "of_update": float(err / update),
                        "argmax": float((got.argmax(-1) == ref.argmax(-1)).mean())}  # fmt: skip
    report["step_ms_q4_k_m"] = step_ms(files["base_q4"], rows, lora, args.steps, args.rounds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
