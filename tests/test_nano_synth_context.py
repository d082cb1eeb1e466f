"""A MOSS-TTS-Nano request whose whole length cannot fit the context (n_ctx) is refused before
its first frame, not at the frame that passes n_ctx with the audio before it lost: a chunk takes
its prompt's rows, then a row fed back after every frame but the last. The engine's check is
exact (a chunk that just fits is spoken whole, one frame more is refused), covers every chunk
of a long text and a reference voice's rows, and `synth` says it in one line, exit 2, with
no file written. (The server's 400s: test_nano_serve.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import nano_yaml

from moss_gguf_cli.nano.engine import ContextTooShort, NanoEngine, NanoFolderConfig
from moss_gguf_cli.nano.settings import NanoSettings

TEXT = "Hello there, this is Nano."
LONG = ("One. Two words here, and a third clause that runs on, with more words in it than the "
        "first sentence had, so that this chunk is the longest of the text by far; then a few "
        "more words to make it longer still, and longer, and longer again. Short end.")


@pytest.fixture(scope="module")
def config(tiny_nano_folder: Path) -> NanoFolderConfig:
    return NanoFolderConfig.from_yaml(tiny_nano_folder / "moss-tts-nano.yaml")


@pytest.fixture(scope="module")
def engine(config: NanoFolderConfig):
    eng = NanoEngine(config)
    yield eng
    eng.close()


def frames(n: int, **more) -> NanoSettings:
    """Exactly N frames a chunk: the stop masked (random weights stop at once)."""
    return NanoSettings(min_new_tokens=n, max_new_tokens=n, seed=1, **more)


def rows_of(engine: NanoEngine, text: str, reference=None) -> list[int]:
    """The prompt rows of each chunk of TEXT, as the engine builds them to speak."""
    request = engine.prepare(text, reference, frames(1))
    return [engine.prompt(chunk, reference).shape[0] for chunk in request.chunks]


@pytest.mark.parametrize("voice", [False, True])
def test_a_chunk_that_just_fits_is_spoken_whole_and_one_frame_more_is_refused(
        config, engine, reference_wav, voice):  # fmt: skip
    reference = engine.reference_codes(reference_wav) if voice else None
    (rows,) = rows_of(engine, TEXT, reference)
    n = 6
    small = NanoEngine(config, n_ctx=rows + n - 1)  # the prompt, then n - 1 rows fed back
    try:
        speech = small.speak(TEXT, reference, frames(n))
        with small.lock:
            pieces = list(speech)
        assert pieces and speech.frames == n and speech.chunks[0].ended == "max"
        with pytest.raises(ContextTooShort) as refused:
            small.speak(TEXT, reference, frames(n + 1))  # before any frame: nothing to iterate
    finally:
        small.close()
    exc = refused.value
    assert (exc.needed, exc.room, exc.prompt) == (rows + n, n, rows)
    assert f"the text needs {rows + n} positions (prompt {rows} + max_new_tokens {n + 1} - 1) " \
        f"but n_ctx is {rows + n - 1}" in exc.message  # fmt: skip
    assert "lower max_new_tokens and min_new_tokens to 6 or less" in exc.hint


def test_every_chunk_is_checked_before_the_first_is_spoken(config, engine):
    """The longest chunk of a long text is not the first: it is refused before chunk 1
    makes a frame (the engine never runs: a frame would pass n_ctx only in that chunk)."""
    rows = rows_of(engine, LONG)
    longest = max(range(len(rows)), key=rows.__getitem__)
    assert len(rows) > 2 and longest > 0 and rows[0] < rows[longest]
    n = 4
    small = NanoEngine(config, n_ctx=rows[longest] + n - 2)  # every chunk fits but that one
    try:
        with pytest.raises(ContextTooShort) as refused:
            small.speak(LONG, None, frames(n))
        assert small.global_transformer.n_past == 0  # nothing was fed
    finally:
        small.close()
    assert f"the text's chunk {longest + 1} of {len(rows)} needs" in refused.value.message


def synth(config: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "moss_gguf_cli", "synth", "--config", str(config), *args]
    return subprocess.run(cmd, capture_output=True, timeout=300)


def test_synth_refuses_what_cannot_fit_in_one_line_and_writes_nothing(engine, tiny_nano_folder,
                                                                      tmp_path):  # fmt: skip
    """n_ctx 256 and 500 frames masked: refused at once (exit 2, one line naming the option
    and the YAML to change), where it ran ~80 frames before and lost them."""
    config = nano_yaml(tiny_nano_folder, "ctx-256.yaml", tmp_path, n_ctx=256)
    (rows,) = rows_of(engine, TEXT)
    out = tmp_path / "long.wav"
    done = synth(config, "--text", TEXT, "--min-new-tokens", "500", "--max-new-tokens", "500",
                 "-o", str(out))  # fmt: skip
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"needs {rows + 499} positions (prompt {rows} + max_new_tokens 500 - 1) but n_ctx " \
        "is 256" in err, err  # fmt: skip
    room = 256 - rows + 1
    assert f"lower --max-new-tokens and --min-new-tokens to {room} or less" in err, err
    assert f"raise n_ctx in {config}" in err, err
    assert not out.exists() and not list(tmp_path.glob(".long.wav*"))
    # what the line says fits is spoken
    done = synth(config, "--text", TEXT, "--min-new-tokens", str(room), "--max-new-tokens",
                 str(room), "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert out.is_file()
