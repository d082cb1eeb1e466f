"""Per-step cost of `synth` outside llama_decode, at the real MOSS-TTS dimensions.

Run by hand (not in CI):

    python benchmarks/synth.py [--workdir /tmp/moss-synth-bench] [--steps 200]

Builds synthetic tables of the real shapes on disk once (text table 155648 × 4096
float16 = 1.27 GB, 32 audio tables and 32 audio heads of 1025 × 4096 float16),
then times what one generation step does besides the backbone:

- summing the 33 embedding rows (memory-mapped tables, float32 accumulation);
- the stacked audio heads (32·1025 × 4096) for each heads backend (numpy float32 BLAS, the
  default; ggml-f16), and the largest logit difference between the two on the same hidden
  state (the hidden state of a real backbone is rounded to f16 on the ggml-f16 path too);
- the delay state machine with sampling: text logits over 155648 ids (inside audio:
  only gen/delay slot are read; outside audio: a masked copy + top-k/top-p), audio
  sampling of 32 codebooks (temperature, top-k 25, top-p 0.8).

Prints min / median milliseconds per part and the total per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from moss_gguf_cli.delay.config import ModelInfo
from moss_gguf_cli.delay.embeddings import EmbeddingTables
from moss_gguf_cli.delay.heads import AudioHeads
from moss_gguf_cli.delay.pattern import DelayMachine
from moss_gguf_cli.tts.sampling import Sampler, SamplingParams

HIDDEN = 4096
TEXT_VOCAB = 155648
N_VQ = 32
AUDIO_ROWS = 1025


def build_tables(workdir: Path) -> tuple[Path, Path]:
    emb, heads = workdir / "embeddings", workdir / "lm_heads"
    emb.mkdir(parents=True, exist_ok=True)
    heads.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    text = emb / "embed_tokens.npy"
    if not text.is_file():
        table = np.lib.format.open_memmap(
            text, mode="w+", dtype=np.float16, shape=(TEXT_VOCAB, HIDDEN)
        )
        for start in range(0, TEXT_VOCAB, 8192):
            stop = min(TEXT_VOCAB, start + 8192)
            table[start:stop] = rng.standard_normal((stop - start, HIDDEN), np.float32) * 0.02
        table.flush()
        del table
    for k in range(N_VQ):
        for path in (emb / f"emb_ext_{k:02d}.npy", heads / f"lm_head_audio_{k:02d}.npy"):
            if not path.is_file():
                values = rng.standard_normal((AUDIO_ROWS, HIDDEN), np.float32) * 0.02
                np.save(path, values.astype(np.float16))
    return emb, heads


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def report(name: str, samples: list[float]) -> float:
    med = statistics.median(samples)
    print(f"  {name:<44} min {min(samples):7.2f} ms   median {med:7.2f} ms")
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/moss-synth-bench"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="synth's n_threads"
    )
    args = parser.parse_args()

    print(f"building/reusing tables in {args.workdir} ...")
    emb_dir, head_dir = build_tables(args.workdir)
    info = ModelInfo(n_vq=N_VQ)
    rng = np.random.default_rng(1)
    tables = EmbeddingTables(emb_dir, N_VQ, AUDIO_ROWS)
    hidden = rng.standard_normal(HIDDEN, dtype=np.float32)
    text_logits = rng.standard_normal(TEXT_VOCAB, dtype=np.float32) * 3
    embed = np.empty(HIDDEN, dtype=np.float32)
    steps = args.steps

    print(f"per step, {steps} repeats, {args.threads} threads:")
    # as in generation: the text column holds the gen/delay slot ids, the codes vary
    rows = np.full((steps, 1 + N_VQ), 0, dtype=np.int64)
    rows[:, 0] = rng.choice(
        [info.audio_assistant_gen_slot_token_id, info.audio_assistant_delay_slot_token_id], steps
    )
    rows[:, 1:] = rng.integers(0, 1024, (steps, N_VQ))
    for table in tables.audio:  # the 32 audio tables (8 MB each) are hot after a few steps
        np.asarray(table).sum(dtype=np.float32)
    it = iter(range(10**9))
    embed_ms = report(
        "embedding sum (33 memmapped f16 rows)",
        timed(lambda: tables.sum_row(rows[next(it) % steps], embed), steps),
    )

    backbone_logits = np.empty(TEXT_VOCAB, dtype=np.float32)
    copy_ms = report(
        "copy of llama.cpp's text logits (155648)",
        timed(lambda: np.copyto(backbone_logits, text_logits), steps),
    )

    heads_ms = {}
    outputs = {}
    for backend in ("numpy", "ggml-f16"):
        heads = AudioHeads(
            head_dir, N_VQ, AUDIO_ROWS, 1024, backend=backend, n_threads=args.threads
        )
        label = (
            f"audio heads [{heads.backend}: {'f32 BLAS' if heads.backend == 'numpy' else 'f16'}]"
        )
        heads_ms[heads.backend] = report(label, timed(lambda h=heads: h.logits(hidden), steps))
        outputs[heads.backend] = heads.logits(hidden).copy()
        heads.close()
    audio_logits = outputs["numpy"]
    if "ggml" in outputs:
        finite = np.isfinite(audio_logits)
        diff = np.abs(outputs["ggml"][finite] - audio_logits[finite])
        scale = np.abs(audio_logits[finite]).max()
        finite_argmax = audio_logits.argmax(1)
        print(f"  largest logit difference ggml-f16 vs float32: {diff.max():.4g} "
              f"({diff.max() / scale:.2e} of the largest logit {scale:.3g}); "
              f"argmax differs in {int((outputs['ggml'].argmax(1) != finite_argmax).sum())}"
              f" of {N_VQ} codebooks")

    # the state machine in steady audio: all 32 codebooks sampled each step
    prompt = np.full((4, 1 + N_VQ), info.audio_pad_code, dtype=np.int64)
    prompt[:, 0] = [1, 2, 3, info.audio_start_token_id]
    sampler = Sampler(SamplingParams(1.5, 1.0, 50), SamplingParams(1.7, 0.8, 25), seed=0)

    def inside_audio_step(machine=DelayMachine(info, prompt)) -> None:  # noqa: B008
        machine.state.audio_length = N_VQ + 5
        machine.state.time_step = N_VQ + 5
        machine.state.delayed_length = None
        plan = machine.plan()
        text = machine.choose_text(text_logits[plan.text_ids], sampler, plan)
        codes = machine.choose_audio(audio_logits.copy(), sampler, plan)
        machine.advance(
            text
            if text != info.audio_assistant_delay_slot_token_id
            else info.audio_assistant_gen_slot_token_id,
            codes,
            plan,
        )

    sampling_ms = report("delay step + sampling, inside audio", timed(inside_audio_step, steps))

    def outside_audio_text() -> None:
        machine = DelayMachine(info, prompt[:3])
        machine.state.time_step = N_VQ + 5
        machine.choose_text(text_logits, sampler, machine.plan())

    outside_ms = report(
        "text sampling outside audio (155648 ids)", timed(outside_audio_text, steps)
    )

    print("total per step outside llama_decode (steady audio):")
    for backend, ms in heads_ms.items():
        print(f"  heads {backend:<6}: {embed_ms + copy_ms + ms + sampling_ms:7.2f} ms")
    if len(heads_ms) == 2:
        speedup = heads_ms["numpy"] / heads_ms["ggml"]
        print(f"  ggml-f16 heads / float32 heads: {speedup:.2f}x faster")
    print(f"  (a step outside audio adds {outside_ms:.2f} ms of text sampling, no heads)")


if __name__ == "__main__":
    main()
