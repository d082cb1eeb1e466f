"""MOSS-TTS-Nano speaking through `moss-gguf synth` (the real command) and the engine under it,
on builtin:tiny-nano's folder and on a second tiny checkpoint written as the release writes it
(torch.save's pytorch_model.bin, tied storage, bf16): 48 kHz stereo of the length asked for,
runs that repeat, a stream that is the whole answer, the codec's state carried, a reference
voice through the codec's encoder, a long text in upstream's chunks with its pauses, and a
model that stops at once refused in one line with no file left."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
import yaml
from conftest import nano_yaml

from moss_gguf_cli.errors import NumericError
from moss_gguf_cli.nano.checkpoint import open_nano
from moss_gguf_cli.nano.codec import DecodePlan
from moss_gguf_cli.nano.codec_folder import initial_state, next_state, open_nano_codec
from moss_gguf_cli.nano.config import TransformerDims
from moss_gguf_cli.nano.engine import NanoEngine, NanoFolderConfig
from moss_gguf_cli.nano.ggml_local import GgmlLocal
from moss_gguf_cli.nano.global_gguf import global_array, plan_global_tensors, write_starcoder2_f32
from moss_gguf_cli.nano.layout import local_files
from moss_gguf_cli.nano.local import NumpyLocal, load_arrays
from moss_gguf_cli.nano.prompt import pause_after, prompt_ids, split_text
from moss_gguf_cli.nano.settings import NanoSettings
from moss_gguf_cli.nano.tiny import ensure_tiny_nano
from moss_gguf_cli.tts.sampling import Sampler, SamplingParams, pick_one

FIXED = ("--min-new-tokens", "25", "--max-new-tokens", "25")
TEXT = "Hello there, this is Nano."
LONG = ("The first sentence is here. The second one follows it closely! Then a third, "
        "with a clause; and a fourth. A fifth sentence ends the text.")  # fmt: skip


def synth(config: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "moss_gguf_cli", "synth", "--config", str(config), *args]
    return subprocess.run(cmd, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def engine(tiny_nano_folder: Path):
    eng = NanoEngine(NanoFolderConfig.from_yaml(tiny_nano_folder / "moss-tts-nano.yaml"))
    yield eng
    eng.close()


def speak(engine: NanoEngine, text: str = TEXT, reference=None, **settings):
    speech = engine.speak(text, reference, NanoSettings(**settings))
    with engine.lock:
        pieces = list(speech)
    return speech, pieces


@pytest.mark.parametrize("which", ["tiny_nano_folder", "release_nano_folder"])
def test_synth_writes_exactly_two_seconds_of_48k_stereo(which, request, tmp_path):
    folder = request.getfixturevalue(which)
    out = tmp_path / "a.wav"
    done = synth(folder / "moss-tts-nano.yaml", "--text", TEXT, *FIXED, "--seed", "3",
                 "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    info = sf.info(str(out))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == \
        (48_000, 2, 96_000, "PCM_16")  # fmt: skip
    assert "25 frames, 2.00 s of 48 kHz stereo audio" in done.stderr.decode()
    data, _ = sf.read(str(out))
    assert np.abs(data).max() > 0.01  # sound, not silence
    assert done.stdout.decode().strip() == str(out)


def test_sampling_settings_out_of_range_are_refused_in_one_line(tiny_nano_folder, tmp_path):
    """synth refuses what the server's fields refuse (inside those ranges the frame graph's
    float32 sampling cannot overflow): one line naming the setting, exit 2, no file."""
    out = tmp_path / "n.wav"
    for flag, value, name in (("--audio-repetition-penalty", "1e-45", "audio_repetition_penalty"),
                              ("--text-temperature", "11", "text_temperature"),
                              ("--audio-top-p", "0", "audio_top_p")):  # fmt: skip
        done = synth(tiny_nano_folder / "moss-tts-nano.yaml", "--text", TEXT, flag, value,
                     "-o", str(out))  # fmt: skip
        err = done.stderr.decode().strip()
        assert done.returncode == 2 and len(err.splitlines()) == 1 and name in err, err
        assert not out.exists()
    bad = nano_yaml(tiny_nano_folder, "bad-penalty.yaml", tmp_path, audio_repetition_penalty=50.0)
    done = synth(bad, "--text", TEXT, "-o", str(out))
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "bad-penalty.yaml" in err and "audio_repetition_penalty" in err and not out.exists()


def test_a_frame_with_no_finite_mass_is_refused_in_pick_ones_words(engine):
    """A head that gives NaN logits (a broken model): the frame graph's check finds no finite
    mass and pick_one, replayed on the graph's logits, says why, frame after frame."""
    nano = engine.nano
    arrays = load_arrays(engine.config.folder, list(local_files(nano)))
    arrays = {Path(k).name[: -len(".npy")]: v for k, v in arrays.items()}
    heads = [np.ascontiguousarray(engine.wte[[1, 2]]), *(t.copy() for t in engine.audio)]
    heads[3][:] = np.nan
    graph = GgmlLocal(arrays, nano.dims, nano.local_layers, heads, engine.wte[1], "F32", 2)
    hidden = np.random.default_rng(0).standard_normal(nano.hidden).astype(np.float32)
    try:
        for sampling in (SAMPLINGS[0], SAMPLINGS[1]):  # sampled, then greedy
            with pytest.raises(NumericError, match="NaN|no finite probability"):
                graph.frame(hidden, Sampler(*sampling, seed=1), allow_stop=False)
            assert graph.seen.sum() == 0  # a refused frame leaves no code seen
    finally:
        graph.close()


def test_greedy_runs_repeat_exactly_and_seeds_decide_sampling(tiny_nano_folder, engine, tmp_path):
    config = tiny_nano_folder / "moss-tts-nano.yaml"
    greedy = ("--text-temperature", "0", "--audio-temperature", "0", *FIXED)
    outs = [tmp_path / "g1.wav", tmp_path / "g2.wav"]
    for out in outs:
        done = synth(config, "--text", TEXT, *greedy, "-o", str(out))
        assert done.returncode == 0, done.stderr.decode()
    assert outs[0].read_bytes() == outs[1].read_bytes()
    runs = [speak(engine, seed=s, min_new_tokens=10, max_new_tokens=10)[1] for s in (1, 1, 2)]
    joined = [np.concatenate(r, axis=1) for r in runs]
    assert np.array_equal(joined[0], joined[1]) and not np.array_equal(joined[0], joined[2])


def test_a_streamed_file_and_stdout_are_the_whole_answer(tiny_nano_folder, tmp_path):
    config = tiny_nano_folder / "moss-tts-nano.yaml"
    args = ("--text", TEXT, *FIXED, "--seed", "4")
    whole, streamed = tmp_path / "w.wav", tmp_path / "s.wav"
    assert synth(config, *args, "-o", str(whole)).returncode == 0
    assert synth(config, *args, "--stream", "-o", str(streamed)).returncode == 0
    assert streamed.read_bytes() == whole.read_bytes()
    piped = synth(config, *args, "--stream", "-o", "-", "-q")
    assert piped.returncode == 0, piped.stderr.decode()
    assert piped.stdout == whole.read_bytes()[44:]  # 16-bit stereo PCM, the WAV's data


def test_the_stream_carries_the_codecs_state(engine, tiny_nano_folder):
    speech, pieces = speak(engine, seed=6, min_new_tokens=20, max_new_tokens=20)
    codes = np.stack(speech.chunks[0].codes)[None].astype(np.int32)
    codec = open_nano_codec(tiny_nano_folder / "audio_tokenizer")
    full = ort.InferenceSession(str(codec.graphs["decode_full"]))
    audio = full.run(["audio"], {"audio_codes": codes,
                                 "audio_code_lengths": np.array([20], np.int32)})[0][0]  # fmt: skip
    assert np.array_equal(np.concatenate(pieces, axis=1), audio)
    # the same groups decoded each from a fresh state sound otherwise: the state matters
    step = ort.InferenceSession(str(codec.graphs["decode_step"]))
    names = [o.name for o in step.get_outputs()]
    fresh, at, plan = [], 0, DecodePlan()
    for calls, piece in enumerate(pieces):
        n = piece.shape[1] // engine.frame_samples
        assert n == plan.ready(calls, 99) or calls == len(pieces) - 1
        out = dict(zip(names, step.run(None, {"audio_codes": codes[:, at : at + n],
                                              "audio_code_lengths": np.array([n], np.int32),
                                              **initial_state(codec)}), strict=True))  # fmt: skip
        assert next_state(codec, out)  # a real state comes back
        fresh.append(out["audio"][0])
        at += n
    assert len(pieces) > 2 and not np.array_equal(np.concatenate(fresh, axis=1), audio)


def test_a_reference_clip_becomes_codes_in_the_prompt(engine, tiny_nano_folder, reference_wav,
                                                      tmp_path):  # fmt: skip
    codes = engine.reference_codes(reference_wav)
    frames = -(-round(0.9 * 48_000) // 3840)  # the clip at 48 kHz, in whole frames
    assert codes.shape == (frames, 16) and codes.min() >= 0 and codes.max() < 1024
    rows = engine.prompt(TEXT, codes)
    ids = prompt_ids(engine.tokenizer, engine.tokens, TEXT, reference=True)
    assert rows.shape == (len(ids.before) + frames + len(ids.after), 17)
    block = rows[len(ids.before) : len(ids.before) + frames]
    assert (block[:, 0] == engine.tokens["audio_user_slot_token_id"]).all()
    assert np.array_equal(block[:, 1:], codes)
    plain = engine.prompt(TEXT, None)
    assert (plain[:, 1:] == 1024).all() and plain.shape[0] < rows.shape[0]
    out = tmp_path / "clone.wav"
    done = synth(tiny_nano_folder / "moss-tts-nano.yaml", "--text", TEXT, "--reference",
                 str(reference_wav), *FIXED, "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert sf.info(str(out)).frames == 96_000


def test_a_long_text_is_spoken_in_upstreams_chunks_with_its_pauses(engine):
    chunks = split_text(engine.tokenizer, LONG)
    assert len(chunks) > 1 and all(engine.tokenizer.count(c) <= 75 for c in chunks)
    speech, pieces = speak(engine, LONG, seed=2, min_new_tokens=3, max_new_tokens=3)
    assert [c.text for c in speech.chunks] == chunks
    pauses = sum(round(48_000 * pause_after(c)) for c in chunks[:-1])
    samples = sum(p.shape[1] for p in pieces)
    assert samples == len(chunks) * 3 * 3840 + pauses
    assert all(c.frames == 3 and c.ended == "max" for c in speech.chunks)


def test_a_short_text_stays_whole_as_given(engine):
    assert split_text(engine.tokenizer, "  hi there  ") == ["hi there"]


def stop_at_once(folder: Path, dest: Path) -> Path:
    """FOLDER copied with a local transformer whose output is a constant b (ln_f's weight 0)
    and a text table that makes audio_end's logit 10·|b|² and the slot's −10·|b|²."""
    shutil.copytree(folder, dest)
    local, tables = dest / "local_transformer", dest / "tables"
    bias = np.load(local / "ln_f.bias.npy")
    bias = np.where(np.abs(bias) > 1e-3, bias, 0.5).astype(np.float32)
    np.save(local / "ln_f.weight.npy", np.zeros_like(bias))
    np.save(local / "ln_f.bias.npy", bias)
    wte = np.load(tables / "wte.npy")
    wte[7], wte[9] = 10 * bias, -10 * bias
    np.save(tables / "wte.npy", wte)
    return dest / "moss-tts-nano.yaml"


def test_a_model_that_stops_at_frame_zero_writes_nothing(tiny_nano_folder, tmp_path):
    config = stop_at_once(tiny_nano_folder, tmp_path / "stops")
    out = tmp_path / "none.wav"
    done = synth(config, "--text", TEXT, "--text-temperature", "0", "-o", str(out))
    err = done.stderr.decode().strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert "stopped before its first frame" in err and "--min-new-tokens" in err
    assert not out.exists() and not list(tmp_path.glob(".none.wav*"))
    # masked, the same model speaks
    done = synth(config, "--text", TEXT, "--text-temperature", "0", "--min-new-tokens", "2",
                 "--max-new-tokens", "2", "-o", str(out))  # fmt: skip
    assert done.returncode == 0 and sf.info(str(out)).frames == 2 * 3840


@pytest.mark.parametrize("args, words", [
    (("--instruction", "calm"), "--instruction does not apply to a MOSS-TTS-Nano folder"),
    (("--language", "en"), "--language does not apply"),
    (("--reference", "a.wav", "--reference", "b.wav"), "clones one voice"),
    (("--min-new-tokens", "9", "--max-new-tokens", "3"), "min_new_tokens 9 is above"),
])  # fmt: skip
def test_what_nano_does_not_take_is_refused_in_one_line(tiny_nano_folder, tmp_path, args, words):
    out = tmp_path / "x.wav"
    done = synth(tiny_nano_folder / "moss-tts-nano.yaml", "--text", TEXT, *args, "-o", str(out))
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not out.exists()


REAL_DIMS = TransformerDims(hidden=768, layers=1, heads=12, inner=3072, vocab=16384,
                            context=None, eps=1e-5, rope_base=10000.0, activation="gelu_new")


def _block_arrays(dims: TransformerDims, rng: np.random.Generator,
                  layers: int = 1) -> dict[str, np.ndarray]:  # fmt: skip
    """A local transformer's arrays (nano/layout.local_files' names) of random values."""
    h, inner = dims.hidden, dims.inner
    shapes = {"ln_1": (h,), "ln_2": (h,), "attn.c_attn": (3 * h, h), "attn.c_proj": (h, h),
              "mlp.fc_in": (inner, h), "mlp.fc_out": (h, inner)}  # fmt: skip
    out = {}
    for i in range(layers):
        for name, shape in shapes.items():
            scale = 1.0 if len(shape) == 1 else 1.0 / np.sqrt(shape[1])
            out[f"h.{i}.{name}.weight"] = (rng.standard_normal(shape) * scale).astype(np.float32)
            out[f"h.{i}.{name}.bias"] = (0.1 * rng.standard_normal(shape[0])).astype(np.float32)
    out["ln_f.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    out["ln_f.bias"] = (0.1 * rng.standard_normal(h)).astype(np.float32)
    return out


# (text, audio) sampling: upstream's defaults, greedy with a penalty, the whole vocabulary at a
# high temperature, tight top-k / top-p with a strong penalty
SAMPLINGS = [
    (SamplingParams(1.0, 1.0, 50), SamplingParams(0.8, 0.95, 25, 1.2)),
    (SamplingParams(0.0, 1.0, 0), SamplingParams(0.0, 1.0, 0, 1.2)),
    (SamplingParams(1.0, 1.0, 0), SamplingParams(1.3, 1.0, 0, 1.0)),
    (SamplingParams(0.7, 0.5, 1), SamplingParams(0.8, 0.5, 3, 1.5)),
]


@pytest.mark.parametrize("shape", ["tiny", "real", "deep"])
# the worst position of 48 frames (4 layers deep: Q8_0's rounding compounds to 3.4 %)
@pytest.mark.parametrize("file_type, bound", [("F32", 1e-3), ("F16", 3e-3), ("Q8_0", 4e-2)])
def test_the_local_frame_in_ggml_is_the_numpy_reference(engine, shape, file_type, bound):
    """A frame as one ggml graph (nano/ggml_local.py: the local transformer, heads and
    sampling) against the NumPy reference on the same arrays, on the tiny folder's arrays, at
    the release's dims (768 wide, 12 heads, 16 heads of 1024 codes) and 4 layers deep: each
    position's logits against LocalTransformer fed the codes the graph picked (F32 differs by
    ggml's GELU table only, F16 and Q8_0 by the weights' rounding), and each pick against
    tts/sampling.pick_one on the graph's logits with the same draw and the codes seen so far,
    under four samplings; the stop is masked until allowed; the same seed repeats the
    frames."""
    rng = np.random.default_rng(0)
    layers = 1
    if shape == "tiny":
        nano, dims = engine.nano, engine.nano.dims
        arrays = load_arrays(engine.config.folder, list(local_files(nano)))
        arrays = {Path(k).name[: -len(".npy")]: v for k, v in arrays.items()}
        heads = [np.ascontiguousarray(engine.wte[[1, 2]]), *engine.audio]
    else:  # the release's dims, or a narrow block of 4 layers (a graph's size grows with them)
        dims, layers = ((REAL_DIMS, 1) if shape == "real" else
                        (dataclasses.replace(REAL_DIMS, hidden=128, heads=4, inner=512), 4))
        arrays = _block_arrays(dims, rng, layers)
        heads = [rng.standard_normal((2 if p == 0 else 1024, dims.hidden), np.float32) * 0.5
                 for p in range(17)]  # fmt: skip
    start = rng.standard_normal(dims.hidden).astype(np.float32)
    reference = NumpyLocal(arrays, dims, layers, heads, start).transformer
    graph = GgmlLocal(arrays, dims, layers, heads, start, file_type, threads=2)
    hiddens = rng.standard_normal((6, dims.hidden)).astype(np.float32)
    worst, picks, stops, exact = 0.0, 0, 0, 0
    try:
        for sampling in SAMPLINGS:
            runs = []
            for _ in range(2):
                sampler, seen, frames = Sampler(*sampling, seed=3), np.zeros_like(graph.seen), []
                graph.forget()
                for f, hidden in enumerate(hiddens):
                    got = graph.frame(hidden, sampler, allow_stop=f >= 4).copy()
                    logits = [x.copy() for x in graph.logits]
                    draws = graph.last_draws.copy()
                    frames.append((got, logits))
                    decision = logits[0].copy()
                    decision[1] = decision[1] if f >= 4 else -np.inf
                    assert got[0] == pick_one(decision, sampling[0], float(draws[0]))
                    exact += 1
                    reference.reset()
                    reference.step(hidden)
                    x = start
                    for p in range(1, len(heads)):
                        want = heads[p] @ reference.step(x)
                        worst = max(worst, np.abs(logits[p] - want).max() / np.abs(want).max())
                        pick = _picks_near(logits[p], sampling[1], float(draws[p]),
                                           seen[p - 1, : heads[p].shape[0]] > 0)  # fmt: skip
                        assert got[p] in pick, (sampling, f, p)
                        exact += int(got[p] == pick[0])
                        x = heads[p][got[p]]
                    if got[0] == 0:
                        seen[np.arange(len(heads) - 1), got[1:]] = 1.0
                    stops += int(got[0])
                    picks += len(heads)
                    np.testing.assert_array_equal(graph.seen, seen)
                runs.append(frames)
            assert all(np.array_equal(a[0], b[0]) and all(np.array_equal(x, y) for x, y in
                                                          zip(a[1], b[1], strict=True))
                       for a, b in zip(*runs, strict=True))  # fmt: skip
    finally:
        graph.close()
    assert worst < bound, worst
    assert picks == 2 * len(SAMPLINGS) * len(hiddens) * len(heads) and stops < picks
    assert exact >= 0.98 * picks, (exact, picks)


def _picks_near(logits: np.ndarray, params: SamplingParams, draw: float,
                seen: np.ndarray) -> list[int]:  # fmt: skip
    """pick_one's token for DRAW, then those for draws 1e-4 either side: the graph sums its
    candidates' mass in float32, pick_one in float64, so a draw that close to a boundary may
    fall either side of it."""
    return [pick_one(logits.copy(), params, min(max(d, 0.0), 1 - 1e-9), seen)
            for d in (draw, draw - 1e-4, draw + 1e-4)]  # fmt: skip


def test_a_folder_can_speak_with_the_numpy_local_transformer(tiny_nano_folder, tmp_path):
    config = nano_yaml(tiny_nano_folder, "numpy-local.yaml", tmp_path, local_type="numpy")
    out = tmp_path / "n.wav"
    done = synth(config, "--text", TEXT, *FIXED, "-o", str(out))
    assert done.returncode == 0 and sf.info(str(out)).frames == 96_000, done.stderr.decode()
    bad = nano_yaml(tiny_nano_folder, "bad-local.yaml", tmp_path, local_type="Q2_K")
    done = synth(bad, "--text", TEXT, "-o", str(out))
    assert done.returncode == 2 and "local_type 'Q2_K' is not one of" in done.stderr.decode()
    bad = nano_yaml(tiny_nano_folder, "bad-ctx.yaml", tmp_path, n_ctx="lots")
    done = synth(bad, "--text", TEXT, "-o", str(out))
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "whole numbers" in err, err


def test_a_voices_shared_rows_are_kept_and_change_no_answer(engine, reference_wav):
    """Every prompt of one voice begins alike up to its text: those rows' KV state is kept
    and restored for the next prompt of the voice, and fed apart from the rest always, so an
    answer is the same bytes whether the state was kept or made."""
    codes = engine.reference_codes(reference_wav)
    for reference in (None, codes):
        a, shared = engine.prompt_parts(TEXT, reference)
        b, again = engine.prompt_parts("Another text entirely.", reference)
        assert shared == again and np.array_equal(a[:shared], b[:shared])
        text = engine.tokenizer.encode(TEXT)  # the text starts there
        assert a[shared : shared + len(text), 0].tolist() == text
        engine._shared.clear()
        first = np.concatenate(speak(engine, TEXT, reference, seed=8, min_new_tokens=6,
                                     max_new_tokens=6)[1], axis=1)  # fmt: skip
        assert len(engine._shared) == 1
        speak(engine, "Another text entirely.", reference, seed=9, min_new_tokens=2,
              max_new_tokens=2)  # fmt: skip
        kept = np.concatenate(speak(engine, TEXT, reference, seed=8, min_new_tokens=6,
                                    max_new_tokens=6)[1], axis=1)  # fmt: skip
        assert len(engine._shared) == 1 and np.array_equal(first, kept)


def test_the_process_holds_one_libggml():
    """ctypes opens the libggml that libllama links (by SONAME), not a second copy of it: the
    ggml graphs of the local transformer and llama.cpp's then share one CPU backend."""
    code = (
        "from moss_gguf_cli.native import libggml, libllama\n"
        "libllama.bindings(); libggml.load()\n"
        "paths = {l.split()[-1] for l in open('/proc/self/maps') if 'libggml' in l}\n"
        "print(sorted(p.rsplit('/', 1)[-1] for p in paths))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    names = eval(done.stdout)  # noqa: S307 - a list of file names printed just above
    assert sum(n.startswith("libggml-cpu") for n in names) == 1, names
    assert sum(n.startswith("libggml-base") for n in names) == 1, names


def test_a_global_gguf_the_engine_cannot_run_is_refused_in_one_line(tiny_nano_folder, tmp_path):
    """The global transformer is read from the folder's GGUF into ggml (nano/ggml_global): a
    prompt longer than n_ctx says so, and a GGUF that lost a tensor (written by our starcoder2
    writer without it) is named with the tensor; each in one line, exit 2, no file."""
    folder = tmp_path / "cut"
    shutil.copytree(tiny_nano_folder, folder)
    yaml_path, out = folder / "moss-tts-nano.yaml", tmp_path / "x.wav"
    settings = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    yaml_path.write_text(yaml.safe_dump({**settings, "n_ctx": 16}), encoding="utf-8")
    done = synth(yaml_path, "--text", TEXT, "-o", str(out))
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "n_ctx is 16" in err and "raise n_ctx" in err, err
    assert not out.exists()

    yaml_path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    checkpoint = open_nano(ensure_tiny_nano())
    dims = checkpoint.nano.dims
    kept = [t for t in plan_global_tensors(dims.layers) if t.name != "blk.0.ffn_up.weight"]
    gguf = folder / settings["global_gguf"]
    write_starcoder2_f32(gguf, dims, dims.layers, dims.context, dims.vocab,
                         ((t.name, global_array(checkpoint, t)) for t in kept))  # fmt: skip
    done = synth(yaml_path, "--text", TEXT, "-o", str(out))
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert str(gguf) in err and "blk.0.ffn_up.weight" in err, err
    assert not out.exists()
