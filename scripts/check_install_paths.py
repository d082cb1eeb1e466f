"""One extra's documented paths, run end to end in the active environment (installs check).

scripts/check-installs.sh runs this in each fresh virtual environment it makes, with
`python scripts/check_install_paths.py EXTRA WORKDIR [--only STEP,...]`; EXTRA is "none",
"serve" or "gguf-tokenizer" (docs/install.md). Only the standard library is used here; the
commands run are the installed `moss-gguf` (the console script beside this interpreter), on
the built-in tiny models, offline. Each step prints one line with its time; the first failure
prints what the command said and exits 1.

Every extra: `import torch` fails; `moss-gguf --help` and every command's `--help`;
`all --model builtin:tiny` (no --audio-tokenizer), `verify`, `synth`, builtin:tiny-nano made
and spoken (`all`, `synth`: 48 kHz stereo); `verify --deep` is one
line naming the torch extra, and, without the serve extra, `serve` one line naming it.
serve: `serve` started, one request to /v1/audio/speech answered with a WAV, stopped.
gguf-tokenizer: the first-class files of builtin:tiny (F16 and Q8_0, the fork's bytes: the
golden sha256 of tests/test_delay_gguf.py), each alone in a folder, laid out and verified by
`all` (the text tokenizer rebuilt from the file's keys) and spoken by `synth`.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("none", "serve", "gguf-tokenizer")
BIN = Path(sys.executable).parent
TIMEOUT = 300


class Failed(Exception):
    """A step that did not do what its documentation says."""


def moss(*args: str, ok: bool = True, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """The installed console script; ok: it must exit 0 (else: it must not)."""
    done = subprocess.run([str(BIN / "moss-gguf"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    if (done.returncode == 0) != ok:
        said = (done.stderr.strip() or done.stdout.strip())[-3000:]
        raise Failed(f"moss-gguf {' '.join(args)}: exit {done.returncode}\n{said}")
    return done


def step(extra: str, name: str, fn, *args) -> None:
    start = time.monotonic()
    fn(*args)
    print(f"  ok  {extra}: {name} ({time.monotonic() - start:.1f} s)", flush=True)


def no_torch() -> None:
    done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
    if done.returncode == 0:
        raise Failed("import torch works in this environment: something installed torch")


def every_help() -> None:
    """`moss-gguf --help` and each registered command's, as processes of their own (two at
    a time: each is mostly the package's import)."""
    listed = subprocess.run(
        [sys.executable, "-c", "import moss_gguf_cli.cli.app as a, moss_gguf_cli.cli._command as c;"
         "print(*[n for n, _, _ in c.COMMANDS])"],
        capture_output=True, text=True,
    )  # fmt: skip
    if listed.returncode != 0 or len(listed.stdout.split()) < 9:
        raise Failed(f"the commands are not all registered:\n{listed.stderr[-3000:]}")
    asked = [["--help"]] + [[name, "--help"] for name in listed.stdout.split()]
    with ThreadPoolExecutor(2) as pool:
        shown = list(pool.map(lambda args: moss(*args), asked))
    for done in shown:
        if "Usage" not in done.stdout:
            raise Failed(f"moss-gguf {' '.join(done.args[1:])} shows no usage")


def one_line(words: str, *args: str) -> None:
    """ARGS fail with one line on stderr holding WORDS, no traceback."""
    done = moss(*args, ok=False, timeout=60)
    lines = done.stderr.strip().splitlines()
    if len(lines) != 1 or words not in lines[0] or "unexpected" in lines[0]:
        raise Failed(f"moss-gguf {' '.join(args)}: not one line naming {words!r}:\n{done.stderr}")


def speaks(config: Path, wav: Path, text: str = "Hello, 你好") -> None:
    moss("synth", "--config", str(config), "--text", text, "--output", str(wav), "-q")
    with wave.open(str(wav)) as w:
        if w.getnframes() == 0 or w.getframerate() != 24000:
            raise Failed(f"{wav}: {w.getnframes()} frames at {w.getframerate()} Hz")


def serve_once(weights: Path, work: Path) -> None:
    """`serve --port 0`, one request, SIGTERM; the announced URL read from its output."""
    log = work / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "moss-gguf"), "serve", "--config",
                                 str(weights / "moss-tts.yaml"), "--port", "0"],
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise Failed(f"serve never announced its address:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        body = {"model": "moss-tts", "input": "Hello, world!", "voice": "default",
                "response_format": "wav"}  # fmt: skip
        headers = {"Content-Type": "application/json"}
        url = f"{found.group(0)}/audio/speech"
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            data = answer.read()
        if answer.status != 200 or data[:4] != b"RIFF" or len(data) <= 44:
            raise Failed(f"/v1/audio/speech answered {answer.status}, {len(data)} bytes")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    if code != 0:
        raise Failed(f"serve exited {code} on SIGTERM:\n{log.read_text()[-3000:]}")


def golden() -> dict[str, str]:
    """The fork's sha256 of builtin:tiny's first-class files, as tests/test_delay_gguf.py
    holds them (read, not imported: this environment has no pytest)."""
    tree = ast.parse((REPO / "tests" / "test_delay_gguf.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "GOLDEN":
            return ast.literal_eval(node.value)["tiny"]
    raise Failed("tests/test_delay_gguf.py has no GOLDEN")


def bare_first_class(work: Path, codec: Path) -> None:
    """Each first-class file alone in a folder → a backend folder synth speaks with."""
    fc = work / "first-class"
    moss("all", "--model", "builtin:tiny", "--format", "moss-tts-delay", "--quant", "F16",
         "--quant", "Q8_0", "--output", str(fc), "-q")  # fmt: skip
    sums = golden()
    for file_type in ("F16", "Q8_0"):
        name = f"moss-tts-delay_{file_type.lower()}.gguf"
        bare = work / f"bare-{file_type}"
        bare.mkdir()
        shutil.copy(fc / name, bare / name)
        digest = hashlib.sha256((bare / name).read_bytes()).hexdigest()
        if digest != sums[file_type]:
            raise Failed(f"{name} is not the fork's file (sha256 {digest})")
        out = work / f"from-bare-{file_type}"
        moss("all", "--model", str(bare / name), "--quant", file_type, "--output", str(out),
             "--audio-tokenizer", str(codec), "-q")  # fmt: skip
        meta = json.loads((out / "extraction_meta.json").read_text())
        if not meta["first_class"]["tokenizer"].startswith("rebuilt from the GGUF"):
            raise Failed(f"{out}: the tokenizer was not rebuilt from the file's keys")
        speaks(out / "moss-tts.yaml", work / f"from-bare-{file_type}.wav")


def nano_speaks(work: Path) -> None:
    """builtin:tiny-nano made and spoken: 2.0 s of 48 kHz stereo (the stop masked)."""
    folder = work / "weights-nano"
    moss("all", "--model", "builtin:tiny-nano", "--output", str(folder), "-q")
    wav = work / "nano.wav"
    moss("synth", "--config", str(folder / "moss-tts-nano.yaml"), "--text", "Hello, 你好",
         "--min-new-tokens", "25", "--max-new-tokens", "25", "--output", str(wav), "-q")
    with wave.open(str(wav)) as w:
        got = (w.getnframes(), w.getframerate(), w.getnchannels())
    if got != (96_000, 48_000, 2):
        raise Failed(f"{wav}: {got[0]} frames at {got[1]} Hz, {got[2]} channel(s)")


def steps(extra: str, work: Path) -> list[tuple[str, str, object, tuple]]:
    """(key, what it checks, function, arguments) for EXTRA, in order."""
    weights = work / "weights-demo"
    config = weights / "moss-tts.yaml"
    todo = [
        ("torch", "import torch fails", no_torch, ()),
        ("help", "every command's --help", every_help, ()),
        ("all", "all --model builtin:tiny", moss,
         ("all", "--model", "builtin:tiny", "--output", str(weights), "-q")),
        ("verify", "verify", moss, ("verify", str(weights))),
        ("synth", "synth", speaks, (config, work / "demo.wav")),
        ("deep", "verify --deep: one line naming the torch extra", one_line,
         ("moss-gguf[torch]", "verify", str(weights), "--deep", "--source", "builtin:tiny")),
        ("nano", "MOSS-TTS-Nano: all --model builtin:tiny-nano, synth", nano_speaks, (work,)),
    ]  # fmt: skip
    if extra == "serve":
        todo.append(("serve", "serve and one request", serve_once, (weights, work)))
    else:
        refused = ("moss-gguf[serve]", "serve", "--config", str(config), "--port", "0")
        todo.append(("serve", "serve: one line naming the serve extra", one_line, refused))
    if extra == "gguf-tokenizer":
        todo.append(("first-class", "a bare first-class GGUF (F16, Q8_0) laid out and spoken",
                     bare_first_class, (work, weights / "audio_tokenizer")))  # fmt: skip
    return todo


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extra", choices=EXTRAS)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--only", help="comma-separated step keys (default: every step)")
    args = parser.parse_args(argv)
    todo = steps(args.extra, args.workdir)
    if args.only:
        keys = args.only.split(",")
        if unknown := set(keys) - {key for key, *_ in todo}:
            parser.error(f"no step {sorted(unknown)} for {args.extra}")
        todo = [s for s in todo if s[0] in keys]
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        for _, what, fn, fn_args in todo:
            step(args.extra, what, fn, *fn_args)
    except (Failed, subprocess.SubprocessError, OSError, ValueError) as exc:
        print(f"  FAILED ({args.extra}): {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
