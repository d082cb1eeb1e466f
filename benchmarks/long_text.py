"""Long text spoken whole (#38): a request's chunks side by side vs one after another vs the
single pass of an older checkout, on the 2-layer real-dims checkpoint that keeps speaking.

    python benchmarks/long_text.py [--chars 4000] [--chars-zh N] [--rounds 1] [--max-new-tokens 48]
        [--main /work/main] [--single-pass] [--workdir /tmp/moss-gguf-bench]

Servers (`moss-gguf serve`, as users start it) on the speaking copy of the checkpoint
(serve.py's `speaking_checkpoint`: its text head never leaves audio, so every chunk runs to its
budget; retries are off for it, `--runaway-retries 0`): a `--max-batch 4` one and a
`--max-batch 1` one. Per language (a --chars English and a Chinese text), alternated round
after round, one greedy non-streamed pcm request of the whole text on each: wall time, the
4-wide's against the 1-wide's (the chunks side by side vs one after another; target ≤ 0.7).
`--max-new-tokens` caps every chunk (a loaded machine: a full budget is 2x upstream's estimate
of 0.867 frames per English and 3.098 per Chinese character; without it every chunk runs its
full budget). Audio produced is set against that estimate (the plan from `synth --dry-run
--json`).

With --main DIR (a checkout of the code before the split, e.g. main 627a995), a server of that
code on the same folder: time to first audio byte of the streamed whole text on it and on the
4-wide server (the client leaves after the first byte; target: new ≤ 1.1x old), and with
--single-pass its whole response (today's single pass: one prompt, one budget,
max_new_tokens 3072 or what n_ctx leaves). Medians over the rounds; JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _common import DEFAULT_DIR
from serve import build_folder

RATE = 24000
FRAME_S = 1920 / RATE
MOSS = [sys.executable, "-m", "moss_gguf_cli"]

EN_SENTENCES = [
    "The lighthouse keeper climbed the stairs at dusk, as he had done for forty years.",
    "He checked the lamp, wiped the glass and wrote the time in his log.",
    "Ships passed far out, their lights small and steady; none of them knew his name.",
    "In the morning he walked down to the harbour and talked with the fishermen.",
    "They spoke about the weather, the nets and the price of diesel, which had gone up again.",
    "Then he climbed back, slept for a few hours, and waited for the dark to come.",
]
ZH_SENTENCES = [
    "灯塔看守人在黄昏时爬上楼梯，四十年来一直如此。",
    "他检查灯，擦拭玻璃，在日志里写下时间。",
    "远处有船经过，灯光微小而稳定；没有人知道他的名字。",
    "早上他走到港口，和渔民们聊天。",
    "他们聊天气、渔网和柴油的价格，价格又涨了。",
    "然后他爬回去，睡了几个小时，等待黑夜降临。",
]


def text_of(sentences: list[str], chars: int, joiner: str) -> str:
    """Sentences repeated (numbered days, so no two chunks are the same) up to CHARS."""
    out, day = [], 1
    while len(joiner.join(out)) < chars:
        for s in sentences:
            out.append(s)
        out.append(f"Day {day} ended." if joiner else f"第{day}天结束了。")
        day += 1
    return joiner.join(out)[:chars].rstrip()


def start(folder: Path, log: Path, *args: str, pythonpath: str | None = None):
    env = {**os.environ}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = [*MOSS, "serve", "--config", str(folder / "moss-tts.yaml"), "--port", "0", *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{found.group(1)}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(60)


def body(text: str, cap: int | None, stream: bool = False) -> dict:
    out = {"model": "moss-tts", "input": text, "voice": "default", "response_format": "pcm",
           "seed": 1, "text_temperature": 0, "audio_temperature": 0}  # fmt: skip
    if cap is not None:
        out["max_new_tokens"] = cap
    return {**out, "stream_format": "audio"} if stream else out


def whole(url: str, text: str, cap: int | None) -> tuple[float, float]:
    """(wall seconds, audio seconds) of one non-streamed request."""
    t0 = time.perf_counter()
    reply = httpx.post(f"{url}/v1/audio/speech", json=body(text, cap), timeout=7200)
    reply.raise_for_status()
    return time.perf_counter() - t0, len(reply.content) / 2 / RATE


def first_byte(url: str, text: str, cap: int | None) -> float:
    """Seconds to the first audio byte of a streamed request (which is then dropped)."""
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body(text, cap, True),
                      timeout=7200) as reply:  # fmt: skip
        reply.raise_for_status()
        for piece in reply.iter_bytes():
            if piece:
                return time.perf_counter() - t0
    return float("nan")


def dry_plan(folder: Path, text: str, cap: int | None) -> dict:
    args = [*MOSS, "synth", "--config", str(folder / "moss-tts.yaml"), "--text", text,
            "--dry-run", "--json"]  # fmt: skip
    if cap is not None:
        args += ["--max-new-tokens", str(cap)]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--chars", type=int, default=4000)
    parser.add_argument("--chars-zh", type=int, help="the Chinese text's length (default --chars)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="cap on every chunk")
    parser.add_argument("--main", type=Path, help="a checkout of the code before the split")
    parser.add_argument("--single-pass", action="store_true",
                        help="with --main: its whole response too (slow: up to 3072 steps)")
    args = parser.parse_args()
    folder = build_folder(args.workdir, speaking=True)
    texts = {"en": text_of(EN_SENTENCES, args.chars, " "),
             "zh": text_of(ZH_SENTENCES, args.chars_zh or args.chars, "")}  # fmt: skip
    cap = args.max_new_tokens
    out: dict = {"chars": args.chars, "rounds": args.rounds, "max_new_tokens": cap}
    logs = args.workdir / "long-text-logs"
    logs.mkdir(exist_ok=True)
    wide, wide_url = start(folder, logs / "wide.log", "--max-batch", "4", "--runaway-retries", "0")
    try:
        lone, lone_url = start(folder, logs / "lone.log", "--max-batch", "1",
                               "--runaway-retries", "0")  # fmt: skip
        try:
            for lang, text in texts.items():
                plan = dry_plan(folder, text, cap)
                estimate = sum(c["estimated_frames"] for c in plan["chunks"]) * FRAME_S
                runs: dict[str, list[tuple[float, float]]] = {"4-wide": [], "1-wide": []}
                for _ in range(args.rounds):
                    runs["4-wide"].append(whole(wide_url, text, cap))
                    runs["1-wide"].append(whole(lone_url, text, cap))
                med = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
                out[lang] = {
                    "chars": len(text), "chunks": len(plan["chunks"]),
                    "estimated_audio_s": round(estimate, 1),
                    "audio_s": round(runs["4-wide"][-1][1], 1),
                    "audio_s_1wide": round(runs["1-wide"][-1][1], 1),
                    "wall_s_4wide": round(med["4-wide"], 1),
                    "wall_s_1wide": round(med["1-wide"], 1),
                    "side_by_side_vs_one_after_another": round(med["4-wide"] / med["1-wide"], 3),
                }  # fmt: skip
                print(json.dumps({lang: out[lang]}, ensure_ascii=False), file=sys.stderr,
                      flush=True)  # a long run's figures so far
        finally:
            stop(lone)
        if args.main is not None:
            _against_main(args, folder, texts, cap, wide_url, logs, out)
    finally:
        stop(wide)
    print(json.dumps(out, indent=2, ensure_ascii=False))


def _against_main(args, folder: Path, texts: dict, cap: int | None, wide_url: str, logs: Path,
                  out: dict) -> None:  # fmt: skip
    old, old_url = start(folder, logs / "main.log", "--max-batch", "4",
                         pythonpath=str(args.main))  # fmt: skip
    try:
        for lang, text in texts.items():
            firsts: dict[str, list[float]] = {"new": [], "main": []}
            for _ in range(args.rounds):
                firsts["new"].append(first_byte(wide_url, text, cap))
                try:
                    firsts["main"].append(first_byte(old_url, text, None))
                except httpx.HTTPStatusError as exc:  # e.g. a prompt beyond n_ctx: refused
                    firsts["main"].append(float("nan"))
                    out[lang]["main_refused"] = exc.response.text[:200]
            new, was = (statistics.median(v) for v in firsts.values())
            row = out[lang]
            row["ttfa_s"], row["ttfa_s_main"] = round(new, 3), round(was, 3)
            row["ttfa_vs_main"] = round(new / was, 3)
            if args.single_pass:
                wall, audio = whole(old_url, text, None)
                row["single_pass_main_wall_s"], row["single_pass_main_audio_s"] = (
                    round(wall, 1), round(audio, 1))  # fmt: skip
    finally:
        stop(old)


if __name__ == "__main__":
    main()
