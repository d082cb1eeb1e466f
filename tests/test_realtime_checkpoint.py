"""MOSS-TTS-Realtime's room, step 1 of #63: a checkpoint read and checked (realtime/config.py,
realtime/checkpoint.py) and builtin:tiny-realtime (realtime/tiny.py). Each refusal is one line
naming the file and the key or tensor."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moss_gguf_cli.errors import InputError, UnsupportedModelError
from moss_gguf_cli.realtime.checkpoint import expected_shapes, open_realtime
from moss_gguf_cli.realtime.config import RealtimeConfig, is_realtime
from moss_gguf_cli.realtime.tiny import (
    CONFIG,
    ensure_tiny_realtime,
    tiny_realtime_state,
    write_safetensors,
)
from moss_gguf_cli.source.checkpoint import detect_lookalike
from tests.in_process import moss_gguf

# The release's dims (docs/realtime.md; config as third-party loaders dump it from the Hub):
# Qwen3-1.7B and four layers of the same shape, 16 codebooks of 1024 codes + pad, BOS, EOS.
REAL = copy.deepcopy(CONFIG)
REAL["language_config"].update(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128, intermediate_size=6144,
                               max_window_layers=28)  # fmt: skip
REAL["local_config"].update(hidden_size=2048, num_hidden_layers=4, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128,
                            intermediate_size=6144)  # fmt: skip


def _one_line(exc: pytest.ExceptionInfo, *parts: str) -> str:
    line = exc.value.one_line()
    assert "\n" not in line and all(p in line for p in parts), line
    return line


@pytest.fixture(scope="module")
def state() -> dict[str, np.ndarray]:
    return tiny_realtime_state()


def _folder(tmp_path: Path, state: dict[str, np.ndarray], config: dict[str, Any] = CONFIG,
            shards: int = 1) -> Path:  # fmt: skip
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder, state, shards)
    return folder


def test_the_builtin_opens_and_checks() -> None:
    ckpt = open_realtime(ensure_tiny_realtime())
    rt = ckpt.realtime
    assert is_realtime(ckpt.config)
    assert (rt.rvq, rt.audio_vocab, rt.audio_pad, rt.audio_bos, rt.audio_eos, rt.codes) == (
        16, 1027, 1024, 1025, 1026, 1024)
    assert (rt.reference_audio_pad, rt.text_pad, rt.vocab) == (151654, 151655, 151936)
    assert (rt.backbone.layers, rt.depth.layers, rt.hidden, rt.depth.head_dim) == (2, 4, 64, 16)
    assert set(ckpt.tensors) == set(expected_shapes(rt)) and len(ckpt.tensors) == 117
    assert ckpt.dtype == "BF16" and ckpt.weights.name == "model.safetensors.index.json"
    assert len(ckpt.shards) == 2
    names = {p.name for p in ckpt.tokenizer_files}
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    added = {t["id"]: t["content"] for t in
             json.loads((ckpt.root / "tokenizer.json").read_text())["added_tokens"]}  # fmt: skip
    assert added[151654] == "<|audio_pad|>" and added[151655] == "<|text_pad|>"
    table = ckpt.tensors["embed_tokens.5.weight"].array()  # bf16 bits: the pad row is zero
    assert not table[1024].any() and table[1023].any()
    text = ckpt.tensors["embed_tokens.0.weight"].array()
    assert np.array_equal(text, ckpt.tensors["language_model.embed_tokens.weight"].array())


def test_one_file_opens_as_the_index_does(tmp_path: Path, state) -> None:
    ckpt = open_realtime(_folder(tmp_path, state))
    assert ckpt.weights.name == "model.safetensors" and len(ckpt.tensors) == 117


def test_the_real_name_plan_counts_403_tensors() -> None:
    rt = RealtimeConfig.from_dict(REAL, Path("config.json"))
    shapes = expected_shapes(rt)
    assert len(shapes) == 403
    count = lambda prefix: sum(n.startswith(prefix) for n in shapes)  # noqa: E731
    assert count("language_model.") == 28 * 11 + 2  # layers, Qwen3Model's table, norm
    assert count("embed_tokens.") == 17
    assert count("local_transformer.model.layers.") == 4 * 11
    assert count("local_transformer.model.embed_tokens.") == 15
    assert count("local_transformer.local_lm_heads.") == 16
    assert shapes["embed_tokens.0.weight"] == (151936, 2048)
    assert shapes["embed_tokens.16.weight"] == (1027, 2048)
    assert shapes["language_model.layers.27.self_attn.k_proj.weight"] == (1024, 2048)
    assert shapes["language_model.layers.0.mlp.down_proj.weight"] == (2048, 6144)
    assert shapes["local_transformer.model.layers.3.self_attn.q_norm.weight"] == (128,)
    assert shapes["local_transformer.model.embed_tokens.14.weight"] == (1027, 2048)
    assert shapes["local_transformer.local_lm_heads.15.weight"] == (1027, 2048)
    assert shapes["local_transformer.model.norm.weight"] == (2048,)
    assert not any("lm_head." in n for n in shapes)  # the backbone's head is never stored
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert 2.3e9 < params < 2.4e9  # 1.7B backbone + its duplicate table + tables, depth, heads


def _set(key: str, value: Any):
    """An edit of a config: KEY (dotted into its sections) set to VALUE, or removed (None)."""
    def edit(config: dict[str, Any]) -> None:
        *path, last = key.split(".")
        section = config
        for part in path:
            section = section[part]
        if value is None:
            section.pop(last)
        else:
            section[last] = value
    return edit


def _drop(state, name):
    return {k: v for k, v in state.items() if k != name}


def _reshape(state, name, shape):
    return {**state, name: np.zeros(shape, dtype=state[name].dtype)}


WEIGHTS = {
    "missing": (lambda s: _drop(s, "local_transformer.model.norm.weight"),
                "tensor 'local_transformer.model.norm.weight' is missing"),
    "shape": (lambda s: _reshape(s, "embed_tokens.3.weight", (1026, 64)),
              "'embed_tokens.3.weight' has shape [1026, 64] but config.json implies [1027, 64]"),
    "unknown": (lambda s: {**s, "lm_head.weight": s["embed_tokens.0.weight"]},
                "tensor 'lm_head.weight' is not one MOSS-TTS-Realtime has (1 such)"),
    "not a float": (lambda s: {**s, "local_transformer.local_lm_heads.7.weight":
                               np.zeros((1027, 64), dtype=np.int32)},
                    "'local_transformer.local_lm_heads.7.weight' is stored as I32"),
    "a layer short": (lambda s: {k: v for k, v in s.items()
                                 if not k.startswith("local_transformer.model.layers.3.")},
                      "config.json's local_config.num_hidden_layers is 4 but the weights hold 3 "
                      "depth layers"),
    "count disagrees": (_set("language_config.num_hidden_layers", 3),
                        "config.json's language_config.num_hidden_layers is 3 but the weights "
                        "hold 2 backbone layers"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WEIGHTS))
def test_weights_that_are_not_the_config_s_are_refused(case: str, tmp_path: Path, state) -> None:
    edit, said = WEIGHTS[case]
    config = copy.deepcopy(CONFIG)
    if case == "count disagrees":  # the weights as they are, the config says another count
        edit(config)
        edit = dict
    folder = _folder(tmp_path, edit(state), config)
    with pytest.raises(InputError) as exc:
        open_realtime(folder)
    _one_line(exc, said, str(folder))


CONFIGS = {
    "eps zero": (_set("local_config.rms_norm_eps", 0), "local_config.rms_norm_eps is 0, not a"),
    "rope base 1": (_set("language_config.rope_theta", 1), "language_config.rope_theta is 1"),
    "heads": (_set("language_config.num_attention_heads", 0),
              "language_config.num_attention_heads is 0, not a positive integer"),
    "rvq huge": (_set("rvq", 10**9), "rvq is 1000000000, more than any MOSS-TTS-Realtime"),
    "vocab a string": (_set("language_config.vocab_size", "151936"),
                       "language_config.vocab_size is '151936'"),
    "text pad outside": (_set("text_pad", 151936), "text_pad 151936 is outside the table"),
    "no reference pad": (_set("reference_audio_pad", None),
                         "config.json has no reference_audio_pad"),
    "no local config": (_set("local_config", None), "config.json has no local_config"),
    "special rows": (_set("audio_vocab_size", 1030),
                     "audio_vocab_size 1030 is not audio_pad_token"),
    "two rvqs": (_set("local_config.rvq", 8), "local_config.rvq is 8 but its top-level rvq is 16"),
    "depth width": (_set("local_config.hidden_size", 128),
                    "local_config.hidden_size 128 is not language_config.hidden_size 64"),
    "grouping": (_set("local_config.num_key_value_heads", 3), "is not a multiple of"),
    "few positions": (_set("local_config.max_position_embeddings", 8),
                      "local_config.max_position_embeddings 8 is less than rvq 16"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CONFIGS))
def test_config_values_out_of_range_are_refused(case: str, tmp_path: Path) -> None:
    edit, said = CONFIGS[case]
    config = copy.deepcopy(CONFIG)
    edit(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InputError) as exc:
        RealtimeConfig.from_file(path)
    _one_line(exc, said, "config.json")


def test_scaled_rope_and_other_models_are_not_realtime(tmp_path: Path) -> None:
    config = copy.deepcopy(CONFIG)
    config["local_config"]["rope_parameters"]["factor"] = 2.0
    with pytest.raises(UnsupportedModelError) as exc:
        RealtimeConfig.from_dict(config, tmp_path / "config.json")
    _one_line(exc, "local_config.rope scales positions")
    with pytest.raises(UnsupportedModelError) as exc:
        RealtimeConfig.from_dict({"model_type": "moss_tts_delay"}, tmp_path / "config.json")
    _one_line(exc, "'moss_tts_delay' is not 'moss_tts_realtime'")
    assert is_realtime({"architectures": ["MossTTSRealtime"]})  # a file without its type


def test_the_delay_commands_refuse_it_pointing_at_all(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError) as exc:
        detect_lookalike(CONFIG, tmp_path / "config.json")
    _one_line(exc, "MOSS-TTS-Realtime", "`all` converts it into a Realtime folder")
    # extract is the delay family's own: each form of the input is refused in one line, the Hub
    # id by its name before any download (offline here: a download would fail differently)
    for model in ("builtin:tiny-realtime", str(ensure_tiny_realtime()),
                  "OpenMOSS-Team/MOSS-TTS-Realtime"):
        ran = moss_gguf("extract", "--model", model, "--output", str(tmp_path / "out"))
        lines = ran.stderr.strip().splitlines()
        assert ran.returncode == 2 and len(lines) == 1, ran.stderr
        assert "MOSS-TTS-Realtime" in lines[0] and "`all` converts it" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
