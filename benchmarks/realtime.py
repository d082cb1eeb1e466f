"""MOSS-TTS-Realtime at its real dims on this machine (issue #63): `all` and `verify` on a
checkpoint of random weights of the release's shape, and the frame loop's time.

    python benchmarks/realtime.py [--types Q8_0] [--frames 40] [--threads 2] [--json out.json]
                                  [--keep] [--served ROUNDS]

Writes the checkpoint once under $MOSS_GGUF_BENCH_DIR (default /tmp/moss-gguf-bench):
upstream's config with the release's dims (a Qwen3-1.7B backbone: hidden 2048, 28 layers, 16/8
heads of 128, FFN 6144, vocabulary 151,936; the depth transformer's 4 layers of the same
shape; 16 codebooks of 1024 + 3 rows), bf16 safetensors in 4 shards, 403 tensors, the real
Qwen3 tokenizer. Then, per file type: `moss-gguf all` (the builtin tiny codec: the random
weights speak noise, only the time counts) timed with its peak memory, `moss-gguf verify`
timed, and in-process the frame loop as a stream-input request runs it (the prompt's head filled
before the text comes; then the text, its 12-token lead and more, at once): the first frame's
time after the text came, in seconds and in frames, FRAMES frames (the EOS masked), the
depth transformer's share of a frame, and the bytes a frame reads (the backbone's matrices
once, the depth transformer's layers, norm and one head sixteen times) against the read
bandwidth a NumPy sum reaches (delay/floor.read_bandwidth): the frame's memory floor. The
converted folders are deleted unless --keep; the checkpoint is kept for the next run.
--served ROUNDS: `moss-gguf serve` on the folder and the stream-input WebSocket on 127.0.0.1,
the first audio message's time after the text was sent (medians of the rounds after the first,
which also fills the prompt's head).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np

from moss_gguf_cli.delay.floor import read_bandwidth
from moss_gguf_cli.realtime.tiny import (
    CONFIG,
    tiny_realtime_state,
    write_safetensors,
    write_tokenizer,
)
from moss_gguf_cli.source.tiny import cache_root
from moss_gguf_cli.source.tiny_codec import ensure_tiny_codec

ROOT = Path(os.environ.get("MOSS_GGUF_BENCH_DIR", "/tmp/moss-gguf-bench"))
DIMS = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 6144}  # fmt: skip
TEXT = ("Welcome to MOSS TTS Realtime, a streaming speech model for voice agents. It speaks as "
        "soon as the text arrives.")


def real_config() -> dict:
    config = copy.deepcopy(CONFIG)
    config["language_config"].update(DIMS, num_hidden_layers=28, max_window_layers=28)
    config["local_config"].update(DIMS, num_hidden_layers=4)
    return config


def checkpoint() -> Path:
    folder = ROOT / "moss-tts-realtime-real"
    if (folder / "config.json").is_file():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    t = time.perf_counter()
    config = real_config()
    write_safetensors(partial, tiny_realtime_state(config, seed=63), shards=4)
    write_tokenizer(partial)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    partial.rename(folder)
    print(f"checkpoint written in {time.perf_counter() - t:.0f} s: {folder}", flush=True)
    return folder


def timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(seconds, peak RSS of the child in GB, the run)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} … failed:\n{done.stderr[-2000:]}")
    # ru_maxrss of children is the largest child so far: a later, smaller one reports the same
    return seconds, max(peak, before) / 1e6, done


def frame_bytes(folder: Path, file_type: str) -> dict[str, int]:
    t = file_type.lower()
    backbone = gguf.GGUFReader(folder / f"realtime_backbone_{t}.gguf")
    depth = gguf.GGUFReader(folder / f"realtime_depth_{t}.gguf")
    # the text table is read a row a frame, not whole
    once = sum(int(x.n_bytes) for x in backbone.tensors if x.name != "token_embd.weight")
    layers = sum(int(x.n_bytes) for x in depth.tensors
                 if x.name.startswith("blk.") or x.name == "output_norm.weight")  # fmt: skip
    head = max(int(x.n_bytes) for x in depth.tensors if x.name.startswith("depth_head."))
    return {"backbone": once, "depth_each_position": layers + head,
            "frame": once + 16 * (layers + head)}


def frames(folder: Path, n: int, threads: int) -> dict[str, float]:
    """The frame loop as a stream-input request runs it: the prompt's head filled while no
    text is there, then the text arrives at once (its 12-token lead and more) and ends; the
    first frame's time after it (first audio, the codec's decode aside) and the frames after."""
    from moss_gguf_cli.realtime.engine import EngineSettings, RealtimeEngine
    from moss_gguf_cli.realtime.feed import TextFeed
    from moss_gguf_cli.realtime.prompt import text_encoder
    from moss_gguf_cli.realtime.synth import RealtimeFolderConfig
    from moss_gguf_cli.tts.sampling import Sampler, SamplingParams

    config = RealtimeFolderConfig.from_yaml(folder / "moss-tts-realtime.yaml")
    engine = RealtimeEngine(config.backbone, config.depth, config.ids, config.audio_eos,
                            EngineSettings(n_ctx=1024, n_threads=threads))  # fmt: skip
    encode = text_encoder(config.tokenizer)
    params = SamplingParams(0.8, 0.6, 30, 1.1)
    depth_s, stamps = 0.0, []
    frame = engine.depth.frame

    def timed_frame(*args, **kwargs):
        nonlocal depth_s
        t = time.perf_counter()
        out = frame(*args, **kwargs)
        depth_s += time.perf_counter() - t
        return out

    engine.depth.frame = timed_frame
    feed = TextFeed(encode, 10_000)
    made = engine.frames(feed, encode, Sampler(params, params, 1), lead=config.lead,
                         max_frames=n, min_frames=n)  # fmt: skip
    t0 = time.perf_counter()
    assert next(made) is None  # the head filled; the text not there yet
    head_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    feed.push(TEXT)
    feed.end()
    for codes in made:
        if codes is not None:
            stamps.append(time.perf_counter())
    engine.close()
    steady = np.diff(stamps)
    return {"head_fill_s": head_s, "first_frame_after_text_s": stamps[0] - t1,
            "frame_ms_median": 1000 * float(np.median(steady)),
            "depth_ms_mean": 1000 * depth_s / len(stamps),
            "frames_per_s": 1.0 / float(np.median(steady)),
            "first_frame_in_frames": (stamps[0] - t1) / float(np.median(steady))}


def served(folder: Path, rounds: int) -> dict[str, float]:
    """`moss-gguf serve` on the folder, the stream-input WebSocket on 127.0.0.1: the opening
    message, then the text (its 12-token lead and more) in one piece and the end; seconds
    from sending the text to the first audio message, ROUNDS times (medians; the first round
    also fills the prompt's head)."""
    import base64
    import re
    import tempfile

    from websockets.sync.client import connect

    log = Path(tempfile.mkstemp(prefix="realtime-serve-", suffix=".log")[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moss_gguf_cli", "serve", "--config",
                                 str(folder / "moss-tts-realtime.yaml"), "--port", "0",
                                 "--max-batch", "1"], stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
            if proc.poll() is not None:
                raise SystemExit(f"serve exited: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        url = f"ws://127.0.0.1:{found.group(1)}/v1/text-to-speech/alloy/stream-input"
        firsts, audio_s = [], []
        for _ in range(rounds):
            with connect(url, open_timeout=600) as ws:
                ws.send(json.dumps({"text": " ", "seed": 1, "min_new_tokens": 8,
                                    "max_new_tokens": 8}))  # fmt: skip
                t = time.perf_counter()
                ws.send(json.dumps({"text": TEXT}))
                ws.send(json.dumps({"text": ""}))
                first, pcm = None, b""
                for message in ws:
                    reply = json.loads(message)
                    if reply.get("audio"):
                        first = first or time.perf_counter() - t
                        pcm += base64.b64decode(reply["audio"])
                    if reply.get("isFinal"):
                        break
            firsts.append(first)
            audio_s.append(len(pcm) / 2 / 24_000)
        return {"served_first_audio_s": [round(f, 3) for f in firsts],
                "served_first_audio_s_median": float(np.median(firsts[1:] or firsts)),
                "served_audio_s": audio_s}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q8_0")
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--served", type=int, default=0, metavar="ROUNDS",
                        help="also time the first audio over the stream-input WebSocket")
    args = parser.parse_args()
    source = checkpoint()
    codec = ensure_tiny_codec(cache_root() / "builtin" / "tiny-codec")[0].parent
    results = {}
    for file_type in args.types.split(","):
        out = ROOT / f"realtime-real-{file_type.lower()}"
        shutil.rmtree(out, ignore_errors=True)
        all_s, all_gb, _ = timed([sys.executable, "-m", "moss_gguf_cli", "all", "--model",
                                  str(source), "--output", str(out), "--file-type", file_type,
                                  "--audio-tokenizer", str(codec), "-q"])  # fmt: skip
        verify_s, _, ran = timed([sys.executable, "-m", "moss_gguf_cli", "verify", str(out),
                                  "--source", str(source), "--json"])  # fmt: skip
        report = json.loads(ran.stdout)
        row = {"all_s": all_s, "all_peak_rss_gb": all_gb, "verify_s": verify_s,
               "verify_ok": report["ok"], "verify_rows": len(report["rows"]),
               "bytes": frame_bytes(out, file_type), **frames(out, args.frames, args.threads)}
        # the memory floor: a frame's bytes at the read bandwidth a NumPy sum reaches, now
        bandwidth = read_bandwidth()
        row["bandwidth_gb_s"] = bandwidth / 1e9
        row["floor_ms"] = 1000 * row["bytes"]["frame"] / bandwidth
        row["floor_over_actual"] = row["floor_ms"] / row["frame_ms_median"]
        if args.served:
            row.update(served(out, args.served))
            row["served_first_audio_in_frames"] = (row["served_first_audio_s_median"] * 1000
                                                   / row["frame_ms_median"])
        results[file_type] = row
        print(json.dumps({file_type: row}, indent=2), flush=True)
        if not args.keep:
            shutil.rmtree(out)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
