"""The MOSS delay family converts, each with its own sizes; look-alikes are refused cleanly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from gguf_reading import gguf_reader

from moss_gguf_cli.errors import UnsupportedModelError
from moss_gguf_cli.source.checkpoint import MossConfig, open_checkpoint
from moss_gguf_cli.source.tiny import ensure_tiny


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )


def gguf_tensor_names(path: Path) -> set[str]:
    return {t.name for t in gguf_reader(path).tensors}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """`all` once per supported builtin variant."""
    root = tmp_path_factory.mktemp("family")
    runs = {}
    for variant in ("tiny-ttsd", "tiny-voicegen", "tiny-soundeffect"):
        out = root / variant
        runs[variant] = (out, cli("all", "--model", f"builtin:{variant}", "--output", str(out)))
    return runs


def test_ttsd_has_16_codebooks_everywhere(built) -> None:
    out, proc = built["tiny-ttsd"]
    assert proc.returncode == 0, proc.stderr
    assert len(list((out / "embeddings").glob("emb_ext_*.npy"))) == 16
    assert len(list((out / "lm_heads").glob("lm_head_audio_*.npy"))) == 16
    meta = json.loads((out / "extraction_meta.json").read_text())
    assert meta["n_vq"] == 16
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["n_vq"] == 16


def test_voicegen_keeps_its_own_text_head_and_falls_back_to_bf16(built) -> None:
    out, proc = built["tiny-voicegen"]
    assert proc.returncode == 0, proc.stderr
    # its language_config says tied, but lm_heads.0 is a separate tensor: keep `output`
    assert "output.weight" in gguf_tensor_names(out / "backbone_q4_k_m.gguf")
    assert "f16 would overflow" in proc.stderr and "bf16" in proc.stderr
    assert "language_model.layers.1.mlp.down_proj.weight" in proc.stderr
    head = np.load(out / "lm_heads/lm_head_text.npy", mmap_mode="r")
    src = open_checkpoint(ensure_tiny("tiny-voicegen")).tensors["lm_heads.0.weight"]
    assert np.array_equal(head[:4], src.read_f32(0, 4).astype(np.float16))


def test_voicegen_backbone_config_is_untied(tmp_path: Path) -> None:
    proc = cli("extract", "--model", "builtin:tiny-voicegen", "--output", str(tmp_path / "x"), "-q")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "x/qwen3_backbone/config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert (tmp_path / "x/qwen3_backbone/model.safetensors").is_file()  # one shard, as the source


def test_soundeffect_converts(built) -> None:
    out, proc = built["tiny-soundeffect"]
    assert proc.returncode == 0, proc.stderr
    assert (out / "backbone_q4_k_m.gguf").is_file()


def test_key_variants_of_ports_are_accepted() -> None:
    base = json.loads((ensure_tiny("tiny") / "config.json").read_text())
    for key in ("n_vq", "audio_vocab_size", "audio_pad_code"):
        base.pop(key)
    base.update(n_codebooks=16, codebook_size=2048, codebook_pad_token_id=2048)
    moss = MossConfig.from_dict(base)
    assert (moss.n_vq, moss.audio_vocab_size, moss.audio_pad_code, moss.audio_rows) == (
        16,
        2048,
        2048,
        2049,
    )


def _lookalike(tmp_path: Path, edit) -> Path:
    model = tmp_path / "model"
    shutil.copytree(ensure_tiny("tiny"), model)
    config = json.loads((model / "config.json").read_text())
    edit(model, config)
    (model / "config.json").write_text(json.dumps(config))
    return model


def _diffusion(model: Path, config: dict) -> None:
    (model / "model_index.json").write_text('{"_class_name": "MossSoundEffectPipeline"}')


LOOKALIKES = {
    "local transformer": (
        lambda m, c: c.update(local_num_layers=4, local_hidden_size=1536),
        "MOSS-TTS-Local-Transformer",
    ),
    "local v1.5": (lambda m, c: c.update(model_type="moss_tts_local"), "MOSS-TTS-Local"),
    "realtime": (lambda m, c: c.update(model_type="moss_tts_realtime"), "MOSS-TTS-Realtime"),
    "ttsd v0.5": (
        lambda m, c: (
            c.pop("language_config"),
            c.update(model_type="asteroid", architectures=["AsteroidTTSInstruct"]),
        ),
        "MOSS-TTSD v0.5/v0.7",
    ),
    "ttsd v0.7": (lambda m, c: c.update(model_type="moss_ttsd"), "MOSS-TTSD v0.5/v0.7"),
    # `all` hands it to the Nano family (tests/test_nano_checkpoint.py), `extract` refuses it
    "nano": (lambda m, c: c.update(model_type="moss_tts_nano"), "MOSS-TTS-Nano"),
    "soundeffect v2 diffusion": (_diffusion, "diffusion pipeline"),
}


@pytest.mark.parametrize("case", list(LOOKALIKES))
@pytest.mark.parametrize("command", ["all", "extract"])
def test_lookalikes_are_refused(case: str, command: str, tmp_path: Path) -> None:
    edit, reason = LOOKALIKES[case]
    model = _lookalike(tmp_path, edit)
    out = tmp_path / "out"
    proc = cli(command, "--model", str(model), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing written


def test_builtin_local_lookalike_is_refused_by_every_converter(tmp_path: Path) -> None:
    for args in (
        ["all", "--model", "builtin:tiny-local", "--output", str(tmp_path / "a")],
        ["convert", str(ensure_tiny("tiny-local")), "--outfile", str(tmp_path / "b.gguf")],
    ):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert "Local" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UnsupportedModelError):
        open_checkpoint(ensure_tiny("tiny-local"))


def test_a_lookalikes_hub_id_is_refused_by_its_name_before_any_download(tmp_path: Path) -> None:
    """With an empty cache and no network a listing or download would fail otherwise; the
    name alone says what it is, so nobody fetches gigabytes to be told."""
    # Realtime is a family `all` converts (tests/test_realtime_all.py); extract refuses it
    for command, repo, said in (
        ("all", "OpenMOSS-Team/MOSS-TTS-Local-Transformer", "MOSS-TTS-Local-Transformer"),
        ("extract", "OpenMOSS-Team/MOSS-TTS-Realtime", "MOSS-TTS-Realtime"),
    ):
        proc = cli(command, "--model", repo, "--output", str(tmp_path / "a"), "--cache-dir",
                   str(tmp_path / "cache"))  # fmt: skip
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_synth_config_points_at_real_files(built) -> None:
    for variant, (out, proc) in built.items():
        assert proc.returncode == 0, (variant, proc.stderr)
        config = yaml.safe_load((out / "moss-tts.yaml").read_text())
        for key in ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir"):
            assert (out / config[key]).exists(), (variant, key)


@pytest.mark.parametrize("variant", ["tiny-voicegen", "tiny-soundeffect"])
def test_synth_speaks_with_single_speaker_variants(variant: str, built, tmp_path: Path) -> None:
    import soundfile as sf

    out, _ = built[variant]
    wav = tmp_path / "x.wav"
    proc = cli(
        "synth",
        "--config",
        str(out / "moss-tts.yaml"),
        "--text",
        "Hello there",
        "--output",
        str(wav),
        "--max-new-tokens",
        "60",
        "--threads",
        "1",
        "--seed",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(wav)
    assert rate == 24000 and len(audio) % 1920 == 0


def _clip(path: Path, hz: float, seconds: float) -> Path:
    import soundfile as sf

    t = np.arange(int(24000 * seconds)) / 24000
    sf.write(path, 0.3 * np.sin(2 * np.pi * hz * t), 24000)
    return path


def test_ttsd_speaks_a_dialogue_with_a_voice_per_speaker(built, tmp_path: Path) -> None:
    import soundfile as sf

    out, _ = built["tiny-ttsd"]
    alice, bob = _clip(tmp_path / "a.wav", 220, 1.0), _clip(tmp_path / "b.wav", 330, 0.5)
    wav = tmp_path / "talk.wav"
    proc = cli(
        "synth", "--config", str(out / "moss-tts.yaml"), "--output", str(wav),
        "--text", "[S1] Did you hear? [S2] I did. [S1] And?",
        "--reference", str(alice), "--reference-text", "Hi, I'm Alice.",
        "--reference", str(bob), "--reference-text", "And I'm Bob.",
        "--max-new-tokens", "40", "--threads", "1", "--seed", "1", "--language", "en",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(wav)
    assert rate == 24000 and len(audio) > 0 and len(audio) % 1920 == 0


def test_ttsd_prompt_carries_both_clips_and_their_join(built, tmp_path: Path) -> None:
    from moss_gguf_cli.delay import Speaker, SynthConfig, Synthesizer

    out, _ = built["tiny-ttsd"]
    alice, bob = _clip(tmp_path / "a.wav", 220, 1.0), _clip(tmp_path / "b.wav", 330, 0.5)
    with Synthesizer(SynthConfig.from_yaml(out / "moss-tts.yaml")) as tts:
        info = tts.info
        clips = [tts.encode_reference(alice), tts.encode_reference(bob)]
        run = tts.prepare(
            "[S1] Did you hear? [S2] I did.",
            speakers=[Speaker("Hi, I'm Alice.", alice), Speaker("And I'm Bob.", bob)],
        )
    rows, ids = run.prompt.rows, run.prompt.rows[:, 0]
    assert info.n_vq == 16 and rows.shape[1] == 17
    assert "[S1]:\n" in run.prompt.text and "\n[S2]:\n" in run.prompt.text
    assert "[S1]Hi, I'm Alice.[S2]And I'm Bob.[S1]Did you hear?[S2]I did." in run.prompt.text
    starts = np.flatnonzero(ids == info.audio_start_token_id)
    assert len(starts) == 3  # two references, then the assistant's joined clips
    for start, codes in zip(starts[:2], clips, strict=True):
        first = rows[start + 1 : start + 1 + codes.shape[0], 1]  # codebook 0, undelayed
        np.testing.assert_array_equal(first, codes[:, 0])
    # continuation: the prompt ends on the gen slot of the joined clips' last frame
    joined = run.prompt.continuation_frames
    assert ids[-1] == info.audio_assistant_gen_slot_token_id
    assert joined == len(ids) - 1 - starts[2]
    assert abs(joined - sum(c.shape[0] for c in clips)) <= 1  # one encode of both waveforms


def test_a_long_dialogue_is_split_at_speaker_turns_each_chunk_with_both_clips(
    built, tmp_path: Path
) -> None:
    """A dialogue longer than a chunk: split before speaker tags, every chunk's prompt holds
    both speakers' clips and transcripts (no chunk-1 voice carried: the clips are the voices),
    the chunks join back into the dialogue, all side by side, and the later chunks share
    their beginning; the plan counts the clips in every chunk's prompt."""
    from moss_gguf_cli.delay import Speaker, SynthConfig, Synthesizer

    out, _ = built["tiny-ttsd"]
    alice, bob = _clip(tmp_path / "a.wav", 220, 1.0), _clip(tmp_path / "b.wav", 330, 0.5)
    turns = [f"[S{1 + i % 2}] Turn {i}: the harbour was quiet again, and the nets were dry."
             for i in range(24)]  # fmt: skip
    speakers = [Speaker("Hi, I'm Alice.", alice), Speaker("And I'm Bob.", bob)]
    with Synthesizer(SynthConfig.from_yaml(out / "moss-tts.yaml"), max_batch=2) as tts:
        encodes = []
        encode = tts.codec.encode
        tts.codec.encode = lambda wav: encodes.append(1) or encode(wav)  # counts the real one
        result = tts.synthesize(" ".join(turns), speakers=speakers, max_new_tokens=24, seed=3)
        info = tts.info
    assert len(encodes) == 3  # each clip and their join, once for the request, not per chunk
    chunks = result.plan.chunks
    assert len(chunks) >= 3 and result.plan.voice == "reference"  # the callers' clips
    assert "".join(c.text + c.gap for c in chunks) == result.plan.text
    for report, chunk in zip(result.chunks, chunks, strict=True):
        assert chunk.text.startswith(("[S1]", "[S2]"))  # a turn is never cut
        prompt = report.prompt
        assert "[S1]Hi, I'm Alice.[S2]And I'm Bob." in prompt.text
        starts = np.flatnonzero(prompt.rows[:, 0] == info.audio_start_token_id)
        assert len(starts) == 3  # both clips, then their join that the answer continues
        # the plan's rows bound the prompt's (the transcripts counted a character a token)
        assert 0 <= chunk.prompt_rows - prompt.rows.shape[0] <= len("Hi, I'm Alice.And I'm Bob.")
    assert result.profile.prefix_rows > 0  # chunks 3.. restored chunk 2's beginning
    assert result.waveform.size > 0


def test_a_streamed_dialogue_sounds_as_the_whole_one(built, tmp_path: Path) -> None:
    """The answer continues the speakers' joined clips: streamed, each window is decoded
    after them (and they are cut off) as the whole decode does, so the two agree (the tiny
    codec is frame-local: test_tts_streaming.py checks the context with a causal one)."""
    from moss_gguf_cli.delay import Speaker, SynthConfig, Synthesizer

    out, _ = built["tiny-ttsd"]
    alice, bob = _clip(tmp_path / "a.wav", 220, 1.0), _clip(tmp_path / "b.wav", 330, 0.5)
    speakers = [Speaker("Hi, I'm Alice.", alice), Speaker("And I'm Bob.", bob)]
    text = "[S1] Did you hear? [S2] I did. [S1] And?"
    with Synthesizer(SynthConfig.from_yaml(out / "moss-tts.yaml")) as tts:
        whole = tts.synthesize(text, speakers=speakers, max_new_tokens=60, seed=1)
        streamed = np.concatenate(list(tts.stream(text, speakers=speakers, max_new_tokens=60,
                                                  seed=1)))  # fmt: skip
    assert whole.chunks[0].prompt.continuation_frames > 0
    assert streamed.size == whole.waveform.size > 0
    scale = np.dot(streamed, whole.waveform) / np.dot(whole.waveform, whole.waveform)
    assert np.allclose(streamed, scale * whole.waveform, atol=2e-3)


def test_ttsd_refuses_what_it_cannot_speak_in_one_line(built, tmp_path: Path) -> None:
    out, _ = built["tiny-ttsd"]
    clip = _clip(tmp_path / "a.wav", 220, 0.5)
    config = str(out / "moss-tts.yaml")
    cases = {
        "speaker tags": ["--text", "Hello"],
        "--reference-text": ["--text", "[S1] Hi", "--reference", str(clip)],
        "pairs": ["--text", "[S1] Hi", "--reference", str(clip), "--reference-text", "a",
                  "--reference-text", "b"],
    }  # fmt: skip
    for expected, args in cases.items():
        proc = cli("synth", "--config", config, "--output", str(tmp_path / "x.wav"), *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (expected, proc.stderr)
        assert expected in lines[-1] and "Traceback" not in proc.stderr, (expected, proc.stderr)
    assert not (tmp_path / "x.wav").exists()


def test_ttsd_server_takes_a_stored_voice_per_speaker(built, tmp_path: Path) -> None:
    """`serve` on a MOSS-TTSD folder: `voices` names a stored voice (clip + transcript) per
    speaker; a voice without a transcript, a missing one or an untagged input is a 400/404
    naming the field."""
    import httpx
    from test_serve import start_serve

    out, _ = built["tiny-ttsd"]
    server = start_serve(out / "moss-tts.yaml", tmp_path / "serve.log",
                         "--voices", str(tmp_path / "voices"))  # fmt: skip
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for name, hz, text in (("alice", 220, "Hi, I'm Alice."), ("bob", 330, "I'm Bob."),
                                   ("mute", 440, None)):  # fmt: skip
                clip = _clip(tmp_path / f"{name}.wav", hz, 0.6)
                with open(clip, "rb") as fh:
                    data = {"name": name, **({"text": text} if text else {})}
                    reply = http.post("/v1/audio/voices", data=data, files={"file": fh})
                assert reply.status_code == 200, reply.text
            body = {"model": "moss-ttsd", "input": "[S1] Did you hear? [S2] I did.",
                    "response_format": "wav", "max_new_tokens": 30, "seed": 1}  # fmt: skip
            reply = http.post("/v1/audio/speech", json={**body, "voices": ["alice", "bob"]})
            assert reply.status_code == 200, reply.text
            assert reply.content[:4] == b"RIFF"
            for extra, status, param in (
                ({"voices": ["alice", "mute"]}, 400, "voices"),
                ({"voices": ["alice", "nobody"]}, 404, "voices"),
                ({"voices": ["alice"], "input": "no tags here"}, 400, "input"),
            ):
                reply = http.post("/v1/audio/speech", json={**body, **extra})
                assert reply.status_code == status, reply.text
                assert reply.json()["error"]["param"] == param
    finally:
        server.stop()
    assert "Traceback" not in server.text()


def test_sound_effect_speaks_its_ambient_sound_with_text_none(built, tmp_path: Path) -> None:
    from moss_gguf_cli.delay import SynthConfig, Synthesizer

    out, _ = built["tiny-soundeffect"]
    wav = tmp_path / "rain.wav"
    proc = cli(
        "synth", "--config", str(out / "moss-tts.yaml"), "--output", str(wav),
        "--ambient-sound", "雷声隆隆，雨声淅沥。", "--tokens", "25",
        "--max-new-tokens", "60", "--threads", "1", "--seed", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert wav.is_file() and wav.stat().st_size > 44
    with Synthesizer(SynthConfig.from_yaml(out / "moss-tts.yaml")) as tts:
        # the text of a SoundEffect request is the sound to make, as upstream's card builds it
        text = tts.prepare("Rain on a tin roof").prompt.text
    assert "- Ambient Sound:\nRain on a tin roof\n" in text and "- Text:\nNone\n" in text


@pytest.mark.parametrize("variant", ["tiny-ttsd", "tiny-voicegen", "tiny-soundeffect"])
def test_verify_against_the_source(variant: str, built) -> None:
    out, _ = built[variant]
    proc = cli("verify", str(out), "--source", f"builtin:{variant}", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    statuses = {row["status"] for row in report["rows"]}
    assert "fail" not in statuses
