"""A load run of `moss-gguf serve`: many requests at a fixed concurrency against one folder.

    python benchmarks/serve.py [--folder W] [--requests 200] [--concurrency 8]
        [--max-new-tokens 48] [--workdir /tmp/moss-gguf-bench] [--keep]
    python benchmarks/serve.py --ttfa [--rounds 2] [--seconds 8,16] [--levels 1,2,4,8]
        [--max-batch 4] [--batch-width served]

--ttfa: two servers on the same folder, a 1-wide one (--max-batch 1) and a --max-batch one.
Per utterance length (--seconds of audio), one greedy pcm request streamed (stream_format
"audio": seconds to its first audio byte) and not (seconds to the whole response), on each
server in turn, alternated, medians and their ratio. Then 2 × N such requests (the first
length) at each concurrency N on the wide server, and at concurrency 1 on the 1-wide one,
the levels alternated round after round (medians): aggregate audio seconds per wall second,
p50/p95, each level against the wide server's own concurrency 1 and against the 1-wide
server's; and each server's peak RSS (VmHWM). It speaks with a copy of the checkpoint whose
text head keeps greedy decoding in audio (`speaking_checkpoint`), so an utterance really is
that many seconds of audio, every step running the audio heads.

Without --folder it speaks with the 2-layer real-dims checkpoint (written once by
make_checkpoint.py) converted by `moss-gguf all --quant Q4_K_M` with the tiny random audio
tokenizer (the real one is a download; the codec's cost is not what this measures) into
WORKDIR/serve-weights (serve-weights-speaking for --ttfa), made once and removed after
unless --keep.

The server is started as users start it (`moss-gguf serve --config W/moss-tts.yaml`), with a
fresh voices folder holding one registered voice. Requests cycle through the six response
formats and three voices (default, an OpenAI name, the registered one), greedy, with a seed;
each reply is decoded back (soundfile for wav/flac, the byte count for pcm, PyAV for
mp3/opus/aac). Reported: status counts (no 5xx allowed), replies that did not decode, the
server's RSS after the first 20 requests and after all (the second must be ≤ 1.05× the first),
wall time, latency p50/p95 and audio seconds per wall second. Then SIGTERM, which must exit 0.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import httpx
import numpy as np
import soundfile as sf
from _common import DEFAULT_DIR, real_dims_checkpoint, remove

FORMATS = ("wav", "mp3", "opus", "flac", "aac", "pcm")
RATE = 24000
MOSS = [sys.executable, "-m", "moss_gguf_cli"]


def build_folder(workdir: Path, speaking: bool = False) -> Path:
    """The 2-layer real-dims checkpoint as a Q4_K_M weights folder (made once)."""
    from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec

    folder = workdir / ("serve-weights-speaking" if speaking else "serve-weights")
    if (folder / "moss-tts.yaml").is_file():
        return folder
    checkpoint = real_dims_checkpoint(workdir)
    if speaking:
        checkpoint = speaking_checkpoint(checkpoint)
    codec = ensure_tiny_codec(workdir / "tiny-codec")[0].parent
    subprocess.run([*MOSS, "all", "--model", str(checkpoint), "--output", str(folder),
                    "--quant", "Q4_K_M", "--audio-tokenizer", str(codec), "-q"],
                   check=True)  # fmt: skip
    return folder


def speaking_checkpoint(checkpoint: Path) -> Path:
    """The random checkpoint with the text head's rows of the two in-audio choices (gen slot,
    delay slot) zeroed: their logits tie at 0, greedy takes the gen slot, and an utterance
    stays in audio for its whole budget, as a real one does (the random head leaves audio
    after a frame or two, and a step without audio skips the audio heads). The other files
    are hard links; the shard holding the head is rewritten (safetensors' own writer)."""
    import torch
    from safetensors.torch import load_file, save_file

    dest = checkpoint.parent / f"{checkpoint.name}-speaking"
    if (dest / "config.json").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    remove(tmp)
    tmp.mkdir()
    config = json.loads((checkpoint / "config.json").read_text())
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["lm_heads.0.weight"]
    for f in checkpoint.iterdir():
        if f.name != shard:
            os.link(f, tmp / f.name)
    tensors = load_file(checkpoint / shard)
    head = tensors["lm_heads.0.weight"]
    for key in ("audio_assistant_gen_slot_token_id", "audio_assistant_delay_slot_token_id"):
        head[config[key]] = torch.zeros_like(head[config[key]])
    save_file(tensors, tmp / shard, metadata={"format": "pt"})
    tmp.rename(dest)
    return dest


def start(folder: Path, voices: Path, log: Path, max_batch: int,
          batch_width: str = "served") -> tuple[subprocess.Popen, str]:  # fmt: skip
    cmd = [*MOSS, "serve", "--config", str(folder / "moss-tts.yaml"), "--port", "0",
           "--voices", str(voices), "--max-batch", str(max_batch),
           "--batch-width", batch_width]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{found.group(1)}"


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb(pid: int) -> float:
    """The most resident memory the process has had (the kernel's high-water mark)."""
    return round(rss_mb(pid, "VmHWM"), 1)


def decoded_seconds(fmt: str, data: bytes) -> float:
    """Seconds of audio in DATA; raises when it does not decode or is empty."""
    if fmt == "pcm":
        samples, rate = len(data) // 2, RATE
    elif fmt in ("wav", "flac"):
        wave, rate = sf.read(io.BytesIO(data))
        samples = wave.shape[0]
    else:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            samples = sum(f.samples for f in container.decode(stream))
            rate = stream.codec_context.sample_rate
    if samples <= 0:
        raise ValueError("no samples")
    return samples / rate


def one(client: httpx.Client, i: int, args: argparse.Namespace) -> dict:
    fmt = FORMATS[i % len(FORMATS)]
    voice = ("default", "alloy", "bench-voice")[i % 3]
    body = {"model": "moss-tts", "input": f"Request number {i}: the quick brown fox.",
            "voice": voice, "response_format": fmt, "seed": i, "text_temperature": 0,
            "audio_temperature": 0, "max_new_tokens": args.max_new_tokens}  # fmt: skip
    t0 = time.perf_counter()
    reply = client.post("/v1/audio/speech", json=body)
    out = {"status": reply.status_code, "latency": time.perf_counter() - t0, "format": fmt}
    if reply.status_code == 200:
        try:
            out["audio_s"] = decoded_seconds(fmt, reply.content)
        except Exception as exc:  # noqa: BLE001 - counted, reported
            out["decode_error"] = f"{fmt}: {exc}"
    else:
        out["error"] = reply.text[:200]
    return out


def load(url: str, pid: int, args: argparse.Namespace) -> dict:
    results: list[dict] = []
    with httpx.Client(base_url=url, timeout=3600) as client, \
            ThreadPoolExecutor(args.concurrency) as pool:  # fmt: skip
        clip = np.sin(2 * np.pi * 180 * np.arange(RATE * 2) / RATE).astype(np.float32) * 0.3
        buffer = io.BytesIO()
        sf.write(buffer, clip, RATE, format="WAV")
        reply = client.post("/v1/audio/voices", data={"name": "bench-voice"},
                            files={"file": ("voice.wav", buffer.getvalue())})  # fmt: skip
        reply.raise_for_status()
        start = time.perf_counter()
        first = min(20, args.requests)
        results += pool.map(lambda i: one(client, i, args), range(first))
        rss_first = rss_mb(pid)
        results += pool.map(lambda i: one(client, i, args), range(first, args.requests))
        wall = time.perf_counter() - start
        rss_all = rss_mb(pid)
        metrics = client.get("/metrics").text
    latencies = sorted(r["latency"] for r in results)
    audio = sum(r.get("audio_s", 0.0) for r in results)
    fps = re.search(r"^moss_gguf_generation_frames_per_second (\S+)", metrics, re.M)
    return {
        "requests": len(results),
        "concurrency": args.concurrency,
        "statuses": dict(Counter(r["status"] for r in results)),
        "server_errors": sum(r["status"] >= 500 for r in results),
        "decode_errors": [r["decode_error"] for r in results if "decode_error" in r],
        "other_errors": [r["error"] for r in results if "error" in r][:5],
        "rss_after_20_mb": round(rss_first, 1),
        "rss_after_all_mb": round(rss_all, 1),
        "rss_ratio": round(rss_all / rss_first, 4),
        "wall_s": round(wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 2),
        "latency_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 2),
        "audio_s": round(audio, 1),
        "audio_s_per_wall_s": round(audio / wall, 3),
        "last_generation_frames_per_s": float(fps.group(1)) if fps else None,
    }


def first_byte(client: httpx.Client, body: dict) -> tuple[float, float, float]:
    """(seconds to the first audio byte, to the last, seconds of audio) of one request."""
    t0 = time.perf_counter()
    first = None
    size = 0
    with client.stream("POST", "/v1/audio/speech", json=body) as reply:
        reply.raise_for_status()
        for piece in reply.iter_bytes():
            if piece and first is None:
                first = time.perf_counter() - t0
            size += len(piece)
    return first or float("nan"), time.perf_counter() - t0, size / 2 / RATE


FRAME_RATE = 12.5  # frames per second of audio (1920 samples at 24 kHz)


def speech(seconds: float, stream: bool = False) -> dict:
    """One greedy pcm request whose budget is SECONDS of audio (frames + the 32 delay-pattern
    steps + the final one); the speaking checkpoint uses all of it."""
    body = {"model": "moss-tts", "input": "A longer sentence, so that there is enough audio "
            "to stream for a while before it ends.", "voice": "default",
            "response_format": "pcm", "seed": 1, "text_temperature": 0, "audio_temperature": 0,
            "max_new_tokens": round(seconds * FRAME_RATE) + 33}  # fmt: skip
    return {**body, "stream_format": "audio"} if stream else body


def ttfa(lone: str, wide: str, args: argparse.Namespace) -> dict:
    """Streamed time to first audio vs the non-streamed response, per utterance length, on a
    1-wide server (LONE) and the --max-batch server (WIDE), alternated; then aggregate audio
    seconds per wall second at each concurrency on WIDE, and at concurrency 1 on LONE."""
    out: dict = {"max_batch": args.max_batch, "rounds": args.rounds}
    with httpx.Client(base_url=lone, timeout=3600) as a, \
            httpx.Client(base_url=wide, timeout=3600) as b:  # fmt: skip
        servers = {"1-wide": a, f"{args.max_batch}-wide": b}
        for client in servers.values():
            first_byte(client, speech(1.0))  # warm-up
        for seconds in args.seconds:
            times = {name: ([], [], []) for name in servers}
            for _ in range(args.rounds):
                for name, client in servers.items():
                    t_first, _, audio = first_byte(client, speech(seconds, stream=True))
                    times[name][0].append(t_first)
                    times[name][1].append(first_byte(client, speech(seconds))[1])
                    times[name][2].append(audio)
            for name, (firsts, wholes, audio) in times.items():
                first, whole = statistics.median(firsts), statistics.median(wholes)
                out[f"{seconds:g}s {name}"] = {
                    "audio_s": round(audio[-1], 2), "ttfa_streamed_s": round(first, 3),
                    "response_whole_s": round(whole, 3), "ttfa_ratio": round(first / whole, 3),
                }  # fmt: skip
        if not args.levels:
            return out
        body = speech(args.seconds[0])
        runs = [("1-wide c1", a, 1)] + [(f"{args.max_batch}-wide c{n}", b, n) for n in args.levels]
        rows: dict[str, list[dict]] = {name: [] for name, _, _ in runs}
        for _ in range(args.rounds):  # alternated: load that drifts touches every level alike
            for name, client, n in runs:
                rows[name].append(level(client, body, n))
        out["throughput"] = {
            name: {key: statistics.median(r[key] for r in got) for key in got[0]}
            for name, got in rows.items()
        }  # fmt: skip
    put = out["throughput"]
    alone = put["1-wide c1"]["audio_s_per_wall_s"]
    own = put.get(f"{args.max_batch}-wide c1", {}).get("audio_s_per_wall_s")
    for name, row in put.items():
        row["vs_1wide_c1"] = round(row["audio_s_per_wall_s"] / alone, 2)
        if own and name != "1-wide c1":
            row["vs_own_c1"] = round(row["audio_s_per_wall_s"] / own, 2)
    return out


def level(client: httpx.Client, body: dict, n: int) -> dict:
    """2 × N requests at concurrency N: aggregate audio seconds per wall second, p50/p95."""
    with ThreadPoolExecutor(n) as pool:
        start = time.perf_counter()
        runs = list(pool.map(lambda _i: first_byte(client, body), range(n * 2)))
        wall = time.perf_counter() - start
    lat = sorted(r[1] for r in runs)
    return {"audio_s_per_wall_s": round(sum(r[2] for r in runs) / wall, 3),
            "p50_s": round(statistics.median(lat), 2),
            "p95_s": round(lat[math.ceil(0.95 * len(lat)) - 1], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, help="a weights folder (default: build one)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--keep", action="store_true", help="keep the folder this built")
    parser.add_argument("--ttfa", action="store_true",
                        help="measure streamed time to first audio and throughput per "
                        "concurrency level instead of the mixed load run")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="--ttfa: alternated rounds")
    parser.add_argument("--max-batch", type=int, default=4, help="the server's --max-batch")
    parser.add_argument("--batch-width", default="served",
                        help="the --max-batch server's --batch-width")  # fmt: skip
    parser.add_argument("--levels", type=lambda v: [int(x) for x in v.split(",") if x],
                        default=[1, 2, 4, 8],
                        help="--ttfa: concurrency levels ('' for none)")  # fmt: skip
    parser.add_argument("--seconds", type=lambda v: [float(x) for x in v.split(",")],
                        default=[8.0, 16.0], help="--ttfa: utterance lengths (audio seconds)")
    args = parser.parse_args()

    folder = args.folder or build_folder(args.workdir, speaking=args.ttfa)
    with tempfile.TemporaryDirectory(prefix="moss-serve-bench-") as tmp:
        log = Path(tmp) / "serve.log"
        proc, url = start(folder, Path(tmp) / "voices", log, args.max_batch, args.batch_width)
        lone = None
        try:
            if args.ttfa:
                lone, lone_url = start(folder, Path(tmp) / "voices1", Path(tmp) / "serve1.log", 1)
                report = ttfa(lone_url, url, args)
                report["peak_rss_mb"] = {"1-wide": peak_rss_mb(lone.pid),
                                         f"{args.max_batch}-wide": peak_rss_mb(proc.pid)}
            else:
                report = load(url, proc.pid, args)
        finally:
            for p in (proc, lone):
                if p is not None:
                    p.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            if lone is not None:
                lone.wait(timeout=60)
        report["exit_code_after_sigterm"] = code
        report["tracebacks_in_log"] = log.read_text().count("Traceback")
    if args.folder is None and not args.keep:
        remove(folder)
    print(json.dumps(report, indent=2))
    if args.ttfa:
        return
    ok = (report["server_errors"] == 0 and not report["decode_errors"]
          and report["rss_ratio"] <= 1.05 and code == 0)  # fmt: skip
    print("PASS" if ok else "FAIL", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
