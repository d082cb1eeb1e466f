"""`all --model` on a first-class moss-tts-delay GGUF: the backend layout synth speaks with.

Round trip on builtin:tiny: the checkpoint → the first-class f16 GGUF (`all --format
moss-tts-delay`) → the backend layout gives the very tables `extract` writes, the backbone
`convert` writes (the same tensors, bytes and keys, less one id the first-class file does not
carry) and the same greedy audio as the layout `all` makes from the checkpoint. A quantized
file's tables are its dequantized values (gguf-py's own dequantize), and the meta and `verify`
say so. A broken file is one line naming it, and nothing is left. A Hub repo holding one is
listed, downloaded and checked by the hub code (a cache built with huggingface_hub's writers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import assert_speak_alike
from gguf_reading import gguf_reader
from test_delay_gguf import _damage, cli
from test_hub_weights import add_repo, files_of, run

from moss_gguf_cli.source.audio_tokenizer import DEFAULT_REPO
from moss_gguf_cli.source.tiny_codec import write_tiny_codec

# the one header difference from `convert`: the fork's converter takes the special token ids
# from the MOSS config.json, which has no bos_token_id (add_bos_token is false: never used)
NOT_CARRIED = {"tokenizer.ggml.bos_token_id", "GGUF.kv_count"}


@pytest.fixture(scope="module")
def first_class(tiny_first_class: Path) -> Path:
    """builtin:tiny as a first-class folder: f16 and Q8_0 GGUFs, tokenizer, codec."""
    return tiny_first_class


@pytest.fixture(scope="module")
def round_trip(first_class: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rt") / "w"
    done = cli("all", "--model", str(first_class), "--quant", "F16", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert "tables exact" in done.stdout
    return out


def fields(path: Path) -> dict:
    return {f.name: f.contents() for f in gguf_reader(path).fields.values()}


def tables(folder: Path) -> dict[str, np.ndarray]:
    return {f"{d}/{p.name}": np.load(p) for d in ("embeddings", "lm_heads")
            for p in sorted((folder / d).glob("*.npy"))}  # fmt: skip


def test_round_trip_gives_extracts_tables_and_converts_backbone(
    round_trip: Path, tiny_extracted: Path, tiny_f16_gguf: Path
) -> None:
    ours, theirs = tables(round_trip), tables(tiny_extracted)
    assert sorted(ours) == sorted(theirs) and len(ours) == 66
    for name, table in theirs.items():
        assert ours[name].dtype == table.dtype == np.float16, name
        assert ours[name].tobytes() == table.tobytes(), name  # every bit
    made = gguf_reader(round_trip / "backbone_f16.gguf")
    converted = gguf_reader(tiny_f16_gguf)
    assert [(t.name, t.tensor_type, t.shape.tolist()) for t in made.tensors] == [
        (t.name, t.tensor_type, t.shape.tolist()) for t in converted.tensors
    ]
    for a, b in zip(made.tensors, converted.tensors, strict=True):
        assert bytes(a.data) == bytes(b.data), a.name
    ours_kv, convert_kv = fields(round_trip / "backbone_f16.gguf"), fields(tiny_f16_gguf)
    assert ours_kv["general.architecture"] == "qwen3"
    differ = {k for k in ours_kv.keys() | convert_kv.keys() if ours_kv.get(k) != convert_kv.get(k)}
    assert differ == NOT_CARRIED
    meta = json.loads((round_trip / "extraction_meta.json").read_text())
    assert meta["first_class"]["tables"] == "exact"
    assert meta["first_class"]["table_types"] == {"F16": 66}
    assert meta["moss_config"]["n_vq"] == 32
    shown = cli("verify", str(round_trip))
    assert shown.returncode == 0, shown.stdout
    assert "tables from a first-class GGUF" in shown.stdout and "exact" in shown.stdout


def test_round_trip_speaks_the_same_greedy_audio(
    round_trip: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    direct = tmp_path_factory.mktemp("direct") / "w"
    done = cli("all", "--model", "builtin:tiny", "--quant", "F16", "--output", str(direct), "-q")
    assert done.returncode == 0, done.stderr
    assert_speak_alike((direct, round_trip), "Round trip, please.")


def test_a_quantized_file_gives_its_dequantized_tables(first_class: Path, tmp_path: Path) -> None:
    source = first_class / "moss-tts-delay_q8_0.gguf"
    out = tmp_path / "w"
    done = cli("all", "--model", str(source), "--output", str(out))  # the file itself
    assert done.returncode == 0, done.stderr
    reader = gguf_reader(source)
    by_name = {t.name: t for t in reader.tensors}
    head = by_name["output_audio.5.weight"]
    assert head.tensor_type == gguf.GGMLQuantizationType.Q8_0
    want = gguf.quants.dequantize(head.data, head.tensor_type).astype(np.float16)
    assert np.load(out / "lm_heads" / "lm_head_audio_05.npy").tobytes() == want.tobytes()
    backbone = gguf_reader(out / "backbone_q8_0.gguf")
    audio = ("token_embd_audio", "output_audio")
    assert not any(t.name.startswith(audio) for t in backbone.tensors)
    for t in backbone.tensors:  # the backbone's bytes as they are
        assert t.tensor_type == by_name[t.name].tensor_type
        assert bytes(t.data) == bytes(by_name[t.name].data), t.name
    assert fields(out / "backbone_q8_0.gguf")["general.file_type"] == fields(source)[
        "general.file_type"
    ]
    meta = json.loads((out / "extraction_meta.json").read_text())["first_class"]
    assert meta["tables"] == "dequantized" and len(meta["dequantized"]) == 66
    shown = cli("verify", str(out))
    assert shown.returncode == 0, shown.stdout
    assert "66 dequantized from moss-tts-delay_q8_0.gguf (66 Q8_0)" in shown.stdout


@pytest.mark.parametrize(
    "how, words",
    [("n_vq", "n_vq = 31 but the file has 32"), ("head", "31 audio heads"),
     ("truncated", "truncated")],  # fmt: skip
)
def test_a_broken_first_class_file_is_one_line_and_leaves_nothing(
    first_class: Path, how: str, words: str, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    bad = _damage(first_class / "moss-tts-delay_f16.gguf", how, tmp_path)
    shutil.move(bad, folder / "moss-tts-delay_f16.gguf")
    shutil.copytree(first_class / "tokenizer", folder / "tokenizer")
    for model in (folder, folder / "moss-tts-delay_f16.gguf"):
        done = cli("all", "--model", str(model), "--output", str(tmp_path / "w"))
        line = done.stderr.strip()
        assert done.returncode != 0 and len(line.splitlines()) == 1, line
        assert words in line and "moss-tts-delay_f16.gguf" in line, line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing left


def test_a_hub_repo_holding_one_is_checked_and_laid_out(first_class: Path, tmp_path: Path) -> None:
    repo = "someone/MOSS-TTS-first-class"
    files = {"moss-tts-delay_f16.gguf": first_class / "moss-tts-delay_f16.gguf",
             **files_of(first_class / "tokenizer", "tokenizer/")}  # fmt: skip
    codec = tmp_path / "codec"
    codec.mkdir()
    write_tiny_codec(codec, external_data=True)
    cache = tmp_path / "hub"
    snapshot = add_repo(cache, repo, files)
    add_repo(cache, DEFAULT_REPO, files_of(codec))
    done = run("all", "--model", repo, "--output", str(tmp_path / "w"), cache=cache)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "w" / "extraction_meta.json").read_text())
    assert meta["source_model"] == repo and meta["first_class"]["tables"] == "exact"
    made_from = json.loads((tmp_path / "w" / "manifest.json").read_text())["made_from"]
    assert made_from["source"] == {"repo": repo, "commit": snapshot.name}
    # one changed byte in the cached GGUF: the hub check names it, nothing is laid out
    blob = (snapshot / "moss-tts-delay_f16.gguf").resolve()
    data = bytearray(blob.read_bytes())
    data[-100] ^= 1
    blob.write_bytes(bytes(data))
    done = run("all", "--model", repo, "--output", str(tmp_path / "w2"), cache=cache)
    line = done.stderr.strip()
    assert done.returncode != 0 and len(line.splitlines()) == 1, line
    assert "moss-tts-delay_f16.gguf is damaged" in line
    assert not (tmp_path / "w2").exists()
