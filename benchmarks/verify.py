"""`verify` on the real-dims checkpoint, and the calibration of its thresholds.

    python benchmarks/verify.py [--rounds 3] [--engine auto] [--keep]
    python benchmarks/verify.py calibrate

Timing: writes the real-dims checkpoint once (benchmarks/_common.py), builds its Q4_K_M
weights folder once (extract + convert + quantize + layout, under $MOSS_GGUF_BENCH_DIR),
then runs A B C A B C …: `moss-gguf quantize` of the f16 GGUF to Q4_K_M, `moss-gguf verify`
of the folder, and `moss-gguf verify --source` of it. Prints the medians, the verify time
against its 15 s target and the --source time as a multiple of the quantize time (target
≤ 1.5). What it built is removed at the end unless --keep.

calibrate: quantizes builtin:tiny's f16 GGUF to every llama.cpp file type that needs no
importance matrix, and prints, per tensor type, the worst relative RMSE and cosine against
the source (TENSOR_MAX_REL_RMSE), bits per weight per file type (bpw_range) and the --deep
figures per file type (DEEP_THRESHOLDS), next to the limits moss_gguf_cli/verify/quality.py holds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import DEFAULT_DIR, measure, real_dims_checkpoint, remove, report

CAL_TYPES = [
    "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M",
    "Q4_K_S", "Q4_1", "Q4_0", "IQ4_NL", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "IQ3_M",
    "IQ3_S", "Q2_K", "TQ2_0", "TQ1_0",
]  # fmt: skip


def build_folder(work: Path, model: Path, engine: str) -> dict[str, Path]:
    """extract + convert + quantize + layout of the real-dims checkpoint (once)."""
    from moss_gguf_cli.pipeline.convert import convert
    from moss_gguf_cli.pipeline.extract import extract
    from moss_gguf_cli.pipeline.layout import layout
    from moss_gguf_cli.quantize.llama import quantize

    paths = {
        "extracted": work / "extracted",
        "f16": work / "backbone_f16.gguf",
        "q4": work / "backbone_q4_k_m.gguf",
        "weights": work / "weights",
    }
    if (paths["weights"] / "manifest.json").is_file() and paths["f16"].is_file():
        return paths
    free = shutil.disk_usage(work.parent).free
    if free < 12e9:
        raise SystemExit(f"need ~12 GB free under {work} for this benchmark, have {free / 1e9:.1f}")
    work.mkdir(parents=True, exist_ok=True)
    steps = [
        ("extract", lambda: extract(model, paths["extracted"], backbone_weights=False,
                                    source_model=str(model), force=True)),
        ("convert", lambda: convert(model, paths["f16"], outtype="f16", force=True)),
        ("quantize", lambda: quantize(paths["f16"], paths["q4"], ["Q4_K_M"], engine=engine,
                                      force=True)),
        ("layout", lambda: layout(paths["extracted"], paths["q4"], paths["weights"], force=True)),
    ]  # fmt: skip
    for name, step in steps:
        t = time.perf_counter()
        step()
        print(f"built: {name} {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return paths


def timing(args: argparse.Namespace) -> None:
    model = real_dims_checkpoint()
    work = DEFAULT_DIR / "verify-bench"
    paths = build_folder(work, model, args.engine)
    moss = shutil.which("moss-gguf") or sys.exit("moss-gguf is not installed")
    q_out = work / "bench_q4_k_m.gguf"
    quant = [moss, "quantize", str(paths["f16"]), str(q_out), "Q4_K_M", "--engine", args.engine,
             "--force", "-q"]  # fmt: skip
    plain = [moss, "verify", str(paths["weights"]), "-q"]
    source = [moss, "verify", str(paths["weights"]), "--source", str(model), "-q"]
    runs = []
    try:
        for _ in range(args.rounds):
            runs.append(measure("quantize Q4_K_M", quant, q_out))
            runs.append(measure("verify", plain, paths["q4"]))
            runs.append(measure("verify --source", source, paths["q4"]))
    finally:
        remove(q_out)
        if not args.keep:
            remove(work)
    table = report(runs)
    q, v, s = table["quantize Q4_K_M"], table["verify"], table["verify --source"]
    table["verify_target_s"] = 15
    table["verify_within_target"] = v["wall_median_s"] <= 15
    table["source_over_quantize"] = round(s["wall_median_s"] / q["wall_median_s"], 3)
    table["source_within_1.5x"] = table["source_over_quantize"] <= 1.5
    print(json.dumps(table, indent=2))


def calibrate(args: argparse.Namespace) -> None:
    import numpy as np
    from tokenizers import Tokenizer

    from moss_gguf_cli import verify as V
    from moss_gguf_cli.pipeline.convert import convert
    from moss_gguf_cli.pipeline.extract import extract
    from moss_gguf_cli.progress import NullProgress
    from moss_gguf_cli.quantize.llama import quantize
    from moss_gguf_cli.source.checkpoint import open_checkpoint
    from moss_gguf_cli.source.tiny import ensure_tiny

    ck = open_checkpoint(ensure_tiny("tiny"))
    facts = V.facts_from_config(ck.config, "source")
    want = V.expected_gguf_tensors(facts.params)
    per_type: dict[str, list] = defaultdict(list)
    rows = []
    with tempfile.TemporaryDirectory(prefix="verify-calibrate-") as tmp:
        work = Path(tmp)
        extracted = work / "extracted"
        extract(ck.root, extracted, backbone_weights=False)
        f16 = work / "f16.gguf"
        convert(ck.root, f16, outtype="f16")
        tok = Tokenizer.from_file(str(extracted / "qwen3_backbone" / "tokenizer.json"))
        ids = V.deep_prompt_ids(tok, ck.moss)
        embed = np.load(extracted / "embeddings" / "embed_tokens.npy", mmap_mode="r")
        x = np.asarray(embed[ids], dtype=np.float32)
        for k in range(ck.moss.n_vq):
            table = np.load(extracted / "embeddings" / f"emb_ext_{k:02d}.npy")
            x += table[ck.moss.audio_pad_code].astype(np.float32)
        heads = [
            np.load(extracted / "lm_heads" / f"lm_head_audio_{k:02d}.npy").astype(np.float32)
            for k in range(ck.moss.n_vq)
        ]
        reference = V.reference_hidden(ck.root, x)
        for ftype in CAL_TYPES:
            out = work / f"{ftype}.gguf"
            quantize(f16, out, [ftype], engine=args.engine, force=True)
            g = V.read_gguf(out)
            pairs = [
                (g.tensors[n], ck.tensors[V.moss_source_name(hf)]) for n, (hf, _) in want.items()
            ]
            for t, _, rel, cos in V.compare_tensors(g, pairs, NullProgress()):
                per_type[t.type_name].append((rel, cos, ftype, t.name))
            n_el = sum(t.n_elements for t in g.tensors.values())
            bpw = sum(t.nbytes for t in g.tensors.values()) * 8 / n_el
            name = V.file_type_name(g)
            d = V.compare_deep(out.name, name, V.llama_hidden(out, x), reference, heads,
                               ck.moss.audio_pad_code)  # fmt: skip
            rows.append({
                "file_type": ftype, "bpw": round(bpw, 3), "bpw_range": V.bpw_range(name),
                "deep_class": V.deep_class(name), "hidden_cos": round(d.hidden_cosine_min, 6),
                "logits_cos": round(d.logits_cosine_min, 6), "top1": round(d.top1_agreement, 3),
                "deep_limits": d.thresholds,
            })  # fmt: skip
            out.unlink()
    tensors = {}
    for ty, values in sorted(per_type.items()):
        worst = max(values, key=lambda v: v[0])
        tensors[ty] = {
            "tensors": len(values),
            "max_rel_rmse": round(worst[0], 5),
            "min_cosine": round(min(v[1] for v in values), 6),
            "worst": f"{worst[2]} {worst[3]}",
            "limit": [round(x, 6) for x in V.tensor_threshold(ty)],
        }
    print(json.dumps({"tensor_types": tensors, "file_types": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="timing", choices=["timing", "calibrate"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="auto", help="quantize engine: auto, binary, library")
    parser.add_argument("--keep", action="store_true", help="keep the built weights folder")
    args = parser.parse_args()
    calibrate(args) if args.mode == "calibrate" else timing(args)


if __name__ == "__main__":
    main()
