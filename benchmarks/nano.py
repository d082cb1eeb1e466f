"""MOSS-TTS-Nano at its real dims on this machine: frames/s, real-time factor end to end, first
audio, whether a stream keeps ahead of playback, two requests at once (issue #48).

    python benchmarks/nano.py [--types Q8_0,Q4_K_M,F16] [--threads 1,2] [--frames 100]
                              [--rounds 3] [--tokenizer 16k|tiny] [--json out.json] [--keep]

Writes a real-dims Nano checkpoint of random weights once (768 wide, 12 global layers, 1 local
layer, 16 × 1024 codes, vocabulary 16384; bf16 `pytorch_model.bin` as the release ships it;
a tokenizer of 16384 pieces trained here, or the builtin's tiny one) under
$MOSS_GGUF_BENCH_DIR (default /tmp/moss-gguf-bench), converts it with `moss-gguf all` (the
builtin tiny codec: a codec of the release's size is not public as ONNX weights here) and
measures, for each file type and thread count, medians of ROUNDS:

- engine: frames/s of the frame loop (global + local + heads + sampling + codec), and where the
  time goes, in-process;
- served: `moss-gguf serve` on 127.0.0.1, one streamed `pcm` request of FRAMES frames (the stop
  masked: min = max), timed from the request to the last byte (RTF), to the first audio byte,
  and each chunk's arrival against the audio before it (a stream falls behind when a chunk
  arrives after the audio sent before it has played out, playback starting at the first
  chunk); then two such requests at once.

The random weights speak noise; only the time is measured. Upstream's own CPU runtimes on the
same weights: benchmarks/nano_upstream.py.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path

import httpx

from moss_gguf_cli.nano.tiny import (
    CONFIG,
    TOKENIZER_DATA,
    ensure_tiny_nano_codec_folder,
    tiny_nano_state,
)
from moss_gguf_cli.source.torch_save import write_state_dict

ROOT = Path(os.environ.get("MOSS_GGUF_BENCH_DIR", "/tmp/moss-gguf-bench"))
REAL = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": 3072, "vocab_size": 16384,
        "n_positions": 2048}  # fmt: skip
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away."
RATE, PCM_RATE = 48_000, 24_000


def tokenizer_16k() -> bytes:
    """A SentencePiece model of the release's size (16384 pieces; the builtin tiny one has
    384, which cuts TEXT into 54 pieces where a vocabulary this size makes ~22), laid out as
    the tiny one (scripts/make_tiny_nano_tokenizer.py), trained on the first 400k lines of
    this Python's standard library: the release's own tokenizer is not reachable offline."""
    import io
    import sysconfig

    import sentencepiece as spm

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from make_tiny_nano_tokenizer import CONTROL

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))

    def lines():
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            yield from (line.strip() for line in text.splitlines() if len(line.strip()) > 20)

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(), model_writer=model, model_type="bpe", vocab_size=16384,
        hard_vocab_limit=False, byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="nmt_nfkc", unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        user_defined_symbols=list(CONTROL), num_threads=2, minloglevel=2,
        input_sentence_size=400_000, shuffle_input_sentence=False)  # fmt: skip
    return model.getvalue()


def checkpoint(tokenizer: str) -> Path:
    dest = ROOT / ("nano-real" if tokenizer == "tiny" else "nano-real-16k")
    if (dest / "config.json").is_file():
        return dest
    tmp = ROOT / f".{dest.name}.partial"
    tmp.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(CONFIG)
    config["gpt2_config"].update(REAL)
    write_state_dict(tmp / "pytorch_model.bin", tiny_nano_state(config))
    shipped = resources.files("moss_gguf_cli.nano") / "data" / TOKENIZER_DATA
    model = shipped.read_bytes() if tokenizer == "tiny" else tokenizer_16k()
    (tmp / "tokenizer.model").write_bytes(model)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tmp.rename(dest)
    return dest


def folder(types: list[str], tokenizer: str) -> Path:
    out = ROOT / ("nano-real-folder" if tokenizer == "tiny" else "nano-real-16k-folder")
    if not out.is_dir():
        cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", str(checkpoint(tokenizer)),
               "--output", str(out), "-q", "--audio-tokenizer",
               str(ensure_tiny_nano_codec_folder())]  # fmt: skip
        for t in types:
            cmd += ["--file-type", t]
        subprocess.run(cmd, check=True)
    return out


def config_for(out: Path, file_type: str, threads: int) -> Path:
    """The folder's YAML for FILE_TYPE's GGUF, with THREADS."""
    import yaml

    data = yaml.safe_load((out / "moss-tts-nano.yaml").read_text())
    data["global_gguf"] = f"nano_global_{file_type.lower()}.gguf"
    data["n_threads"] = threads
    path = out / f"bench-{file_type.lower()}-{threads}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def engine_run(config: Path, frames: int) -> dict[str, float]:
    """One in-process run of the frame loop: frames/s and ms a frame by part."""
    from moss_gguf_cli.nano.engine import NanoEngine, NanoFolderConfig
    from moss_gguf_cli.nano.settings import NanoSettings

    engine = NanoEngine(NanoFolderConfig.from_yaml(config))
    try:
        speech = engine.speak(TEXT, None, NanoSettings(min_new_tokens=frames,
                                                       max_new_tokens=frames, seed=1))  # fmt: skip
        start = time.perf_counter()
        with engine.lock:
            samples = sum(piece.shape[1] for piece in speech)
        wall = time.perf_counter() - start
    finally:
        engine.close()
    p = speech.profile
    per = 1000.0 / p.frames
    # frames/s counted as benchmarks/nano_upstream.py counts upstream's: the prompt included
    return {"frames_per_s": p.frames / wall, "steady_frames_per_s": p.frames / (wall - p.prefill_s),
            "rtf": wall / (samples / RATE),
            "prefill_ms": 1000 * p.prefill_s, "prompt_rows": p.prompt_rows,
            "global_ms": p.global_s * per, "local_heads_sampling_ms": p.local_s * per,
            "codec_ms": p.decode_s * per}  # fmt: skip


def serve(config: Path, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "moss_gguf_cli", "serve", "--config", str(config), "--port", "0",
           *extra]  # fmt: skip
    out = open(log, "wb")  # noqa: SIM115 - the server writes it while it runs
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"serve did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{found.group(1)}"


_client: httpx.Client | None = None


def request(url: str, frames: int, seed: int = 1,
            client: httpx.Client | None = None) -> dict[str, float]:  # fmt: skip
    """One streamed pcm request: RTF from the request to the last byte, first audio, and the
    worst lead of the stream over playback (negative: it fell behind). Timed from the request
    being sent by a client made before (an httpx.Client loads a TLS context even for plain
    http: 40-47 ms here, which a one-off `httpx.stream` put inside the timing), as an
    application that keeps its client sends it."""
    global _client
    if client is None:
        _client = client = _client or httpx.Client(timeout=600)
    body = {"model": "moss-tts-nano", "input": TEXT, "response_format": "pcm",
            "stream_format": "audio", "min_new_tokens": frames, "max_new_tokens": frames,
            "seed": seed}  # fmt: skip
    arrivals, sizes = [], []
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/audio/speech", json=body) as reply:
        reply.raise_for_status()
        for data in reply.iter_raw():
            arrivals.append(time.perf_counter() - start)
            sizes.append(len(data))
    last = arrivals[-1]
    audio = sum(sizes) / 2 / PCM_RATE
    played_from, before, lead = arrivals[0], sizes[0] / 2 / PCM_RATE, float("inf")
    for at, size in zip(arrivals[1:], sizes[1:], strict=True):
        lead = min(lead, played_from + before - at)  # audio left to play when this arrives
        before += size / 2 / PCM_RATE
    lead = lead if len(arrivals) > 1 else 0.0
    return {"rtf": last / audio, "first_audio_s": arrivals[0], "audio_s": audio,
            "worst_lead_s": lead, "chunks": len(arrivals)}  # fmt: skip


def two_at_once(url: str, frames: int) -> dict[str, float]:
    results: list[dict] = [{}, {}]
    clients = [httpx.Client(timeout=600) for _ in range(2)]

    def one(i: int) -> None:
        results[i] = request(url, frames, seed=10 + i, client=clients[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for client in clients:
        client.close()
    audio = sum(r["audio_s"] for r in results)
    return {"wall_s": wall, "audio_per_wall": audio / wall,
            "first_audio_s": [r["first_audio_s"] for r in results]}  # fmt: skip


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_K_M,F16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokenizer", choices=["16k", "tiny"], default="16k",
                    help="16k: one of the release's size, trained here (default); tiny: the "
                    "builtin's 384 pieces (a prompt 2.5x as long)")  # fmt: skip
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-serve", action="store_true", help="the engine figures only")
    ap.add_argument("--keep", action="store_true", help="keep the converted folder")
    args = ap.parse_args()
    types = args.types.split(",")
    out = folder(types, args.tokenizer)
    load = os.getloadavg()[0]
    table: dict[str, dict] = {}
    for file_type in types:
        for threads in (int(t) for t in args.threads.split(",")):
            config = config_for(out, file_type, threads)
            runs = [engine_run(config, args.frames) for _ in range(args.rounds)]
            row = {k: median(runs, k) for k in runs[0]}
            if not args.no_serve:
                proc, url = serve(config, out / f"serve-{file_type}-{threads}.log")
                try:
                    request(url, 8)  # warm: the first request pays the page cache
                    served = [request(url, args.frames) for _ in range(args.rounds)]
                    row.update({f"served_{k}": median(served, k) for k in served[0]})
                    row["two_at_once"] = two_at_once(url, args.frames)
                finally:
                    proc.terminate()
                    proc.wait(30)
            table[f"{file_type} / {threads} thread(s)"] = row
            print(f"{file_type:7} {threads} thr: " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in row.items() if not isinstance(v, dict)), flush=True)  # fmt: skip
            if "two_at_once" in row:
                print(f"          two at once: {row['two_at_once']}", flush=True)
    result = {"load_average_at_start": load, "frames": args.frames, "rounds": args.rounds,
              "tokenizer": args.tokenizer, "rows": table}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if not args.keep:
        import shutil

        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
