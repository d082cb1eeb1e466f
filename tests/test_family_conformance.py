"""Every family in the registry does what a family does (docs/ARCHITECTURE.md §6, the family
interface, step 5): claims its builtin, `all` makes a folder of it that the registry
claims back, `verify` passes it and fails it once a file is tampered with, `synth` speaks
from the config `all` wrote (`--codes-out` writing the code grid it decoded), and `serve`
answers the official openai client, a stream the bytes of the whole answer. A new family is
one row in SPEAK, REFUSES and REQUEST and nothing else here."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
from builds import Builds
from in_process import moss_gguf
from test_serve import KEY, TIMEOUT, start_serve

from moss_gguf_cli.families import FAMILIES, Family, for_config, for_folder, for_input

# what makes each family's random builtin speak a short fixed length (Nano's stops at once
# unless its stop is masked; the delay models take no --min-new-tokens)
SPEAK = {
    "moss-tts-delay": ("--max-new-tokens", "48", "--seed", "1"),  # past the 32-code delay
    "moss-tts-nano": ("--min-new-tokens", "6", "--max-new-tokens", "6", "--seed", "1"),
    "moss-tts-realtime": ("--min-new-tokens", "6", "--max-new-tokens", "6", "--seed", "1"),
}


# an option of another family's `synth`, and the one line that refuses it
REFUSES = {
    "moss-tts-delay": (("--min-new-tokens", "3"),
                       "--min-new-tokens does not apply to a MOSS-TTS delay-model folder"),
    "moss-tts-nano": (("--instruction", "calm"),
                      "--instruction does not apply to a MOSS-TTS-Nano folder"),
    "moss-tts-realtime": (("--instruction", "calm"),
                          "--instruction does not apply to a MOSS-TTS-Realtime folder"),
}
# the same over HTTP: a request's fields
REQUEST = {
    "moss-tts-delay": {"max_new_tokens": 48, "seed": 1},
    "moss-tts-nano": {"min_new_tokens": 6, "max_new_tokens": 6, "seed": 1},
    "moss-tts-realtime": {"min_new_tokens": 6, "max_new_tokens": 6, "seed": 1},
}


def test_every_registered_family_has_a_row():
    assert sorted(SPEAK) == sorted(REQUEST) == sorted(REFUSES) == sorted(f.name for f in FAMILIES)


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def made(request, builds) -> tuple[Family, Path]:
    family: Family = request.param
    return family, builds.all("--model", family.builtin).path  # the run's shared build


def test_its_builtin_and_its_folder_are_its_own(made):
    family, folder = made
    assert for_input(family.builtin) is family
    assert for_folder(folder) is family
    assert for_config(folder / family.synth_config) is family


def _verify(folder: Path) -> dict:
    ran = moss_gguf("verify", str(folder), "--json")
    report = json.loads(ran.stdout)
    assert ran.returncode == (0 if report["ok"] else 1), ran.stderr
    return report


def test_verify_passes_it_and_fails_a_tampered_copy(made, tmp_path):
    family, folder = made
    assert _verify(folder)["ok"]
    copy = Builds.copy(folder, tmp_path / "copy")
    tables = sorted(copy.rglob("*.npy"))
    if tables:  # a table changed
        values = np.load(tables[0])
        tables[0].unlink()  # a hard link to the shared build: replaced, not written into
        np.save(tables[0], values + 1)
    else:  # a folder of GGUFs alone: one byte of its first GGUF's last tensor changed
        gguf = sorted(copy.glob("*.gguf"))[0]
        data = bytearray(gguf.read_bytes())
        data[-40] ^= 0x40
        gguf.unlink()
        gguf.write_bytes(bytes(data))
    report = _verify(copy)
    failed = [r["name"] for r in report["rows"] if r["status"] == "fail"]
    assert not report["ok"] and failed, report


def test_synth_speaks_from_the_config_all_wrote(made, tmp_path):
    family, folder = made
    out, codes = tmp_path / "a.wav", tmp_path / "a.npy"
    done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "synth", "--config",
                           str(folder / family.synth_config), "--text", "Hello there.",
                           *SPEAK[family.name], "-o", str(out), "--codes-out", str(codes), "-q"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    info = sf.info(str(out))
    assert info.frames > 0 and info.samplerate in (24_000, 48_000), info
    # --codes-out: the grid the codec decoded, a frame of codes per 80 ms of the WAV
    grid = np.load(codes, allow_pickle=False)
    assert grid.dtype == np.int64 and grid.ndim == 2 and grid.shape[1] in (16, 32), grid.shape
    assert grid.shape[0] * info.samplerate // 25 * 2 == info.frames, (grid.shape, info.frames)
    assert 0 <= grid.min() and grid.max() < 1024


def test_synth_refuses_another_familys_option_in_one_line(made, tmp_path):
    family, folder = made
    option, said = REFUSES[family.name]
    ran = moss_gguf("synth", "--config", str(folder / family.synth_config), "--text", "Hi",
                    *option, "-o", str(tmp_path / "a.wav"))  # fmt: skip
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1 and not (tmp_path / "a.wav").exists()


@pytest.fixture(scope="module")
def served(made, tmp_path_factory):
    """`moss-gguf serve` on the folder `all` made, and the official client talking to it."""
    family, folder = made
    srv = start_serve(folder / family.synth_config, tmp_path_factory.mktemp("log") / "s.log",
                      "--api-key", KEY, "--voices", str(tmp_path_factory.mktemp("voices")))
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0,
                           timeout=TIMEOUT)  # fmt: skip
    yield family, client
    srv.stop()


def test_serve_answers_the_openai_client_and_a_stream_is_the_whole(served):
    family, client = served
    [model] = [m.id for m in client.models.list().data]
    ask = dict(model=model, voice="alloy", input="Hello there.")
    wav = client.audio.speech.create(**ask, response_format="wav",
                                     extra_body=REQUEST[family.name]).content  # fmt: skip
    samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate in (24_000, 48_000) and len(samples) > 0 and np.abs(samples).max() > 0
    whole = client.audio.speech.create(**ask, response_format="pcm",
                                       extra_body=REQUEST[family.name]).content  # fmt: skip
    with client.audio.speech.with_streaming_response.create(
        **ask, response_format="pcm", extra_body={**REQUEST[family.name], "stream_format": "audio"}
    ) as reply:
        streamed = b"".join(reply.iter_bytes())
    assert len(whole) > 0 and streamed == whole
