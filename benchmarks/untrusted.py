"""A checkpoint is untrusted input: each hostile probe run through the real command inside
`ulimit -v 3000000`, its peak RSS, wall time and first line of stderr side by side.

    python benchmarks/untrusted.py [--dir /tmp/moss-gguf-untrusted] [--keep]

Every probe is a small folder built here with the formats' own writers (torch.save, zipfile,
pickle, os.mkfifo) from a tiny MOSS-TTS-Nano or builtin:tiny; each must end in one line naming
the file, under 1 GB peak RSS, within a minute, and leave no output. The last rows are requests
that cannot fit n_ctx, refused before generation. Needs the test extra (torch writes the
probes; the command under test never imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from tiny_nano import CONFIG, release_state, write_release  # noqa: E402

from moss_gguf_cli.nano.tiny import ensure_tiny_nano  # noqa: E402
from moss_gguf_cli.source.checkpoint import resolve_model  # noqa: E402

LIMIT_AS = 3_000_000 * 1024  # ulimit -v 3000000 (KiB)
TIMEOUT_S = 120


def _nano(folder: Path, config: dict | None = None, state: dict | None = None) -> Path:
    # the weights of the valid config, under the hostile one
    write_release(folder, config or CONFIG, release_state(CONFIG) if state is None else state)
    shutil.copyfile(ensure_tiny_nano() / "tokenizer.model", folder / "tokenizer.model")
    return folder


def _config(**edits) -> dict:
    config = json.loads(json.dumps(CONFIG))
    for key, value in edits.items():
        section = config["gpt2_config"] if key in config["gpt2_config"] else config
        section[key] = value
    return config


def _with_pickle(folder: Path, data: bytes) -> Path:
    """The release's .bin with data.pkl replaced (zipfile's writer, entries stored)."""
    path = _nano(folder) / "pytorch_model.bin"
    with zipfile.ZipFile(path) as old:
        entries = [(i.filename, old.read(i)) for i in old.infolist()]
    with zipfile.ZipFile(path, "w") as new:
        for name, payload in entries:
            new.writestr(name, data if name.endswith("/data.pkl") else payload)
    return folder


def _bzip2_bomb(folder: Path) -> Path:
    """data.pkl as a bzip2 entry of 2 GiB of zeros: a few KB on disk."""
    path = _nano(folder) / "pytorch_model.bin"
    with zipfile.ZipFile(path) as old:
        entries = [(i.filename, old.read(i)) for i in old.infolist()]
    with zipfile.ZipFile(path, "w") as new:
        for name, payload in entries:
            if name.endswith("/data.pkl"):
                info = zipfile.ZipInfo(name)
                info.compress_type = zipfile.ZIP_BZIP2
                with new.open(info, "w", force_zip64=True) as f:
                    zeros = bytes(64 << 20)
                    for _ in range(32):
                        f.write(zeros)
            else:
                new.writestr(name, payload)
    return folder


def _shared_lists() -> bytes:
    """A 60-level chain of lists each holding the previous twice: str() of it is 2^60 long."""
    value: list = []
    for _ in range(60):
        value = [value, value]
    return pickle.dumps({"x": value}, protocol=2)


def _hashed_tuples() -> bytes:
    """A dict keyed by a 60-level shared tuple: hashing it during unpickling is 2^60 steps."""
    value: tuple = ()
    for _ in range(60):
        value = (value, value)
    # the dict cannot be built here to be dumped (that hash is the bomb): its opcodes around
    # the key's as Python's pickler writes them
    key = pickle.dumps(value, protocol=2)[2:-1]
    return (pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + key + pickle.BININT1 + b"\x01"
            + pickle.SETITEM + pickle.STOP)  # fmt: skip


def _deep() -> bytes:
    """100,000 nested lists: a recursive hash, repr or free would exhaust the C stack."""
    return b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."


SIZE = (16 << 20) - 64  # data.pkl's most


def _batches() -> bytes:
    """Empty lists appended into one a thousand at a time, as Python's pickler batches: a value
    made a byte."""
    return pickle.PROTO + b"\x02]" + (b"(" + b"]" * 1000 + b"e") * (SIZE // 1003) + pickle.STOP


def _memoized() -> bytes:
    """Empty lists each kept in the memo: what stays alive while unpickling, 7 bytes each."""
    put = b"".join(b"]r" + i.to_bytes(4, "little") + b"0" for i in range(SIZE // 7))
    return pickle.PROTO + b"\x02" + put + pickle.NONE + pickle.STOP


def _zero_strides(folder: Path) -> Path:
    state = release_state(CONFIG)
    small = torch.zeros(1, dtype=torch.bfloat16)
    state["transformer.wte.weight"] = small.as_strided((1 << 14, 1 << 14), (0, 0))
    return _nano(folder, state=state)


def _fifo(folder: Path) -> Path:
    _nano(folder)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    return folder


def _delay(folder: Path, **language) -> Path:
    shutil.copytree(resolve_model("builtin:tiny"), folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["language_config"].update(language)
    path.write_text(json.dumps(config))
    return folder


PROBES: dict[str, Callable[[Path], Path]] = {
    "nano: layer_norm_epsilon -1": lambda d: _nano(d, _config(layer_norm_epsilon=-1)),
    "nano: rope_base 0": lambda d: _nano(d, _config(rope_base=0)),
    "nano: audio_pad_token_id 1e30": lambda d: _nano(d, _config(audio_pad_token_id=1e30)),
    "nano: n_layer 3e6": lambda d: _nano(d, _config(n_layer=3e6)),
    "nano: n_vq 3e8": lambda d: _nano(d, _config(n_vq=3e8)),
    "nano: bzip2 data.pkl of 2 GiB": _bzip2_bomb,
    "nano: 60 shared nested lists": lambda d: _with_pickle(d, _shared_lists()),
    "nano: a shared tuple as a dict key": lambda d: _with_pickle(d, _hashed_tuples()),
    "nano: 100k nested lists": lambda d: _with_pickle(d, _deep()),
    "nano: zero-stride 16k x 16k view": _zero_strides,
    "nano: 16 MiB pickle, lists in batches": lambda d: _with_pickle(d, _batches()),
    "nano: 16 MiB pickle, memoized lists": lambda d: _with_pickle(d, _memoized()),
    "nano: NaN weight": lambda d: _nano(d, state=_edited(lambda s: s["transformer.ln_f.bias"]
                                                         .fill_(float("nan")))),
    "nano: untied head": lambda d: _nano(d, state=_edited(_untie)),
    "nano: int64 weight": lambda d: _nano(d, state=_edited(_int64)),
    "nano: garbage tokenizer.model": lambda d: _garbage_tokenizer(_nano(d)),
    "nano: config.json a FIFO": _fifo,
    "delay: rms_norm_eps -1": lambda d: _delay(d, rms_norm_eps=-1),
    "delay: num_hidden_layers 3e6": lambda d: _delay(d, num_hidden_layers=3e6),
    "delay: vocab_size 1e30": lambda d: _delay(d, vocab_size=1e30),
}


def _edited(edit: Callable[[dict], object]) -> dict:
    state = release_state(CONFIG)
    state = {k: v.clone() for k, v in state.items()}
    for q in range(CONFIG["n_vq"]):  # keep the release's ties over the clones
        state[f"audio_lm_heads.{q}.weight"] = state[f"audio_embeddings.{q}.weight"]
    state["text_lm_head.weight"] = state["transformer.wte.weight"]
    edit(state)
    return state


def _untie(state: dict) -> None:
    state["audio_lm_heads.1.weight"] = state["audio_embeddings.1.weight"] * 2


def _int64(state: dict) -> None:
    state["transformer.h.0.attn.c_proj.weight"] = state["transformer.h.0.attn.c_proj.weight"].long()


def _garbage_tokenizer(folder: Path) -> Path:
    (folder / "tokenizer.model").write_bytes(bytes(range(256)) * 8)
    return folder


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


def run(args: list[str]) -> tuple[int, float, float, str]:
    """(exit code, seconds, peak RSS in MB, stderr's first line) of one limited child."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "moss_gguf_cli", *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_limited)  # fmt: skip
    timer = threading.Timer(TIMEOUT_S, child.kill)
    timer.start()
    err = child.stderr.read()
    # reaped here, not by Popen: wait4 gives this child's own rusage (ru_maxrss in KiB)
    _, status, usage = os.wait4(child.pid, 0)
    timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    lines = err.strip().splitlines()
    first = (lines[0] if lines else "") + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")
    return child.returncode, seconds, usage.ru_maxrss / 1024, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/moss-gguf-untrusted"))
    parser.add_argument("--keep", action="store_true", help="keep the probes' folders")
    opts = parser.parse_args()
    shutil.rmtree(opts.dir, ignore_errors=True)
    opts.dir.mkdir(parents=True)
    print("| probe | exit | s | peak RSS MB | stderr (first line) |\n|---|---|---|---|---|")
    try:
        for i, (name, build) in enumerate(PROBES.items()):
            folder = build(opts.dir / f"p{i:02d}")
            out = opts.dir / f"out{i:02d}"
            rc, s, peak, line = run(["all", "--model", str(folder), "--output", str(out), "-q",
                                     "--audio-tokenizer", "none"])  # fmt: skip
            left = " LEFT OUTPUT" if out.exists() else ""
            print(f"| {name} | {rc} | {s:.1f} | {peak:.0f} | {line[-150:]}{left} |", flush=True)
        _requests(opts.dir)
    finally:
        if not opts.keep:
            shutil.rmtree(opts.dir, ignore_errors=True)


def _requests(root: Path) -> None:
    """A request that cannot fit n_ctx (the stop masked, as the red team had it)."""
    folder = root / "nano-folder"
    rc, s, peak, line = run(["all", "--model", "builtin:tiny-nano", "--output", str(folder), "-q"])
    assert rc == 0, line
    for name, extra in (("synth: 5,000 frames into n_ctx 2,048",
                         ["--min-new-tokens", "5000", "--max-new-tokens", "5000"]),):  # fmt: skip
        out = root / "x.wav"
        rc, s, peak, line = run(["synth", "--config", str(folder / "moss-tts-nano.yaml"),
                                 "--text", "Hello there.", "-o", str(out), *extra])  # fmt: skip
        left = " LEFT OUTPUT" if out.exists() else ""
        print(f"| {name} | {rc} | {s:.1f} | {peak:.0f} | {line[-150:]}{left} |", flush=True)


if __name__ == "__main__":
    main()
