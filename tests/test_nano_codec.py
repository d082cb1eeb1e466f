"""The Nano codec's ONNX release layout (nano/codec_folder.py) and the tiny one built in its
shape (nano/tiny_codec.py), run through onnxruntime: what MOSS-TTS-Nano speaks through.
A streamed decode that passes its state on equals the whole decode to the bit; one that does
not is different, so the state is real."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from moss_gguf_cli.errors import InputError
from moss_gguf_cli.nano.codec_folder import META, initial_state, next_state, open_nano_codec
from moss_gguf_cli.nano.tiny_codec import FRAME, ensure_tiny_nano_codec

SECONDS = 2.0


@pytest.fixture(scope="module")
def codec_dir(tmp_path_factory) -> Path:
    return ensure_tiny_nano_codec(tmp_path_factory.mktemp("nano") / "codec")


@pytest.fixture(scope="module")
def codec(codec_dir: Path):
    return open_nano_codec(codec_dir)


@pytest.fixture(scope="module")
def sessions(codec) -> dict[str, ort.InferenceSession]:
    return {role: ort.InferenceSession(str(path)) for role, path in codec.graphs.items()}


def run(session: ort.InferenceSession, feeds: dict) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def codes(sessions) -> np.ndarray:
    t = np.arange(int(48_000 * SECONDS)) / 48_000
    wave = np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)]) * 0.4
    out = run(sessions["encode"], {"waveform": wave[None].astype(np.float32),
                                   "input_lengths": np.array([t.size], np.int32)})  # fmt: skip
    return out["audio_codes"][:, : int(out["audio_code_lengths"][0])]


def test_the_release_layout_opens_with_its_facts(codec, codec_dir):
    assert (codec.sample_rate, codec.channels, codec.n_vq, codec.codebook_size) == \
        (48_000, 2, 16, 1024)  # fmt: skip
    names = [p.as_posix() for p in codec.files]
    assert names == sorted({META, "moss_audio_tokenizer_encode.onnx",
                            "moss_audio_tokenizer_encode.data",
                            "moss_audio_tokenizer_decode_full.onnx",
                            "moss_audio_tokenizer_decode_step.onnx",
                            "moss_audio_tokenizer_decode_shared.data"})  # fmt: skip
    # the two decoders share their weights' file, as the release's do
    meta = json.loads((codec_dir / META).read_text())
    assert meta["external_data_files"]["moss_audio_tokenizer_decode_step.onnx"] == \
        ["moss_audio_tokenizer_decode_shared.data"]  # fmt: skip
    assert {s.dtype for s in codec.state} == {"int32", "float32"} and len(codec.state) == 5


def test_encode_and_decode_have_the_release_shapes(sessions, codes):
    frames = int(np.ceil(48_000 * SECONDS / FRAME))
    assert codes.shape == (1, frames, 16) and codes.dtype == np.int32
    assert 0 <= codes.min() and codes.max() < 1024 and len(np.unique(codes)) > 16
    out = run(sessions["decode_full"], {"audio_codes": codes,
                                        "audio_code_lengths": np.array([frames], np.int32)})
    assert out["audio"].shape == (1, 2, frames * FRAME) and out["audio"].dtype == np.float32
    assert int(out["audio_lengths"][0]) == frames * FRAME
    assert 0.05 < float(np.abs(out["audio"]).max()) <= 0.5


def stream(codec, session, codes: np.ndarray, cuts: list[int], carry: bool) -> np.ndarray:
    state, pieces = initial_state(codec), []
    for a, b in zip([0, *cuts], [*cuts, codes.shape[1]], strict=True):
        out = run(session, {"audio_codes": codes[:, a:b],
                            "audio_code_lengths": np.array([b - a], np.int32), **state})
        pieces.append(out["audio"])
        state = next_state(codec, out) if carry else initial_state(codec)
    return np.concatenate(pieces, axis=2)


def test_a_stream_that_carries_its_state_is_the_whole_decode(codec, sessions, codes):
    frames = codes.shape[1]
    whole = run(sessions["decode_full"], {"audio_codes": codes,
                                          "audio_code_lengths": np.array([frames], np.int32)})
    for cuts in ([1, 2, 3], [7, 8, 20], list(range(1, frames))):
        streamed = stream(codec, sessions["decode_step"], codes, cuts, carry=True)
        assert np.array_equal(streamed, whole["audio"]), cuts
    # the state matters: started afresh, every chunk's first frame sounds otherwise
    fresh = stream(codec, sessions["decode_step"], codes, [7, 8, 20], carry=False)
    differs = [not np.array_equal(fresh[..., f * FRAME:(f + 1) * FRAME],
                                  whole["audio"][..., f * FRAME:(f + 1) * FRAME])
               for f in range(frames)]  # fmt: skip
    assert [f for f, d in enumerate(differs) if d] == [7, 8, 20]


def test_the_codec_is_built_the_same_every_time(codec_dir, tmp_path):
    again = ensure_tiny_nano_codec(tmp_path / "again")

    def digests(folder: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}

    assert digests(again) == digests(codec_dir)


def broken(codec_dir: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "codec"
    shutil.copytree(codec_dir, folder)
    meta = json.loads((folder / META).read_text())
    edit(folder, meta)
    (folder / META).write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("edit, words", [
    (lambda f, m: m["files"].update(encode="../../etc/passwd"), "points outside"),
    (lambda f, m: m["files"].pop("decode_step"), "names no decode_step graph"),
    (lambda f, m: (f / "moss_audio_tokenizer_decode_shared.data").unlink(), "needs moss_audio"),
    (lambda f, m: m["streaming_decode"]["transformer_offsets"][0].update(output_name="nope"),
     "lacks nope"),
    (lambda f, m: m["codec_config"].pop("channels"), "lacks 'channels'"),
    (lambda f, m: m["streaming_decode"]["attention_caches"][0].pop("cache_shape"), "malformed"),
])  # fmt: skip
def test_a_broken_release_is_refused_in_one_line(codec_dir, tmp_path, edit, words):
    folder = broken(codec_dir, tmp_path, edit)
    with pytest.raises(InputError) as err:
        open_nano_codec(folder)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_folder_without_the_meta_is_named(tmp_path):
    with pytest.raises(InputError, match="not the Nano codec's ONNX release"):
        open_nano_codec(tmp_path)
