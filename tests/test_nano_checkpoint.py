"""nano/: a MOSS-TTS-Nano folder as the release lays it out (config.json, a torch-saved
pytorch_model.bin with tied storage), opened from config.json alone and checked tensor by
tensor; safetensors used where the folder has them."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sentencepiece import sentencepiece_model_pb2
from tiny_nano import (
    CONFIG,
    FIRST_BYTE_PIECE,
    RELEASE_CONFIG,
    RELEASE_CONFIG_BYTES,
    RELEASE_CONTROL,
    release_config,
    release_state,
    release_tokenizer,
    write_release,
)

from moss_gguf_cli.errors import InputError, UnsupportedModelError
from moss_gguf_cli.nano.checkpoint import expected_shapes, is_nano_folder, open_nano
from moss_gguf_cli.nano.config import NanoConfig, declared_dtype
from moss_gguf_cli.nano.prompt import INST_END, REFERENCE_HEAD, NanoTokenizer, prompt_ids


def as_f32(tensor: torch.Tensor) -> np.ndarray:
    return tensor.float().numpy()


def test_a_release_folder_opens_from_its_config_with_ties_kept(tmp_path):
    state = write_release(tmp_path / "nano")
    opened = open_nano(tmp_path / "nano")
    assert opened.weights.name == "pytorch_model.bin"
    dims = opened.nano.dims
    assert (dims.hidden, dims.layers, dims.heads, dims.inner, dims.vocab) == (32, 2, 4, 48, 40)
    assert (dims.head_dim, dims.eps, dims.rope_base, dims.context) == (8, 1e-5, 10000.0, 64)
    assert opened.nano.codebook_sizes == (16, 16, 16) and opened.nano.audio_pad == 16
    assert opened.nano.tokens["audio_assistant_slot_token_id"] == 9
    assert opened.nano.local_layers == 1
    assert sorted(opened.tensors) == sorted(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(opened.tensors[name].astype(np.float32), as_f32(tensor))
    wte, head = opened.tensors["transformer.wte.weight"], opened.tensors["text_lm_head.weight"]
    assert np.shares_memory(wte, head)
    assert opened.unused == ["local_transformer.wte.weight"]
    assert opened.tokenizer is None and is_nano_folder(tmp_path / "nano")


def test_the_release_config_reads_as_the_release_is():
    """The release's values (docs/nano.md), where upstream's class defaults differ (n_vq 8,
    Qwen-sized ids, 4 local layers)."""
    release = copy.deepcopy(CONFIG)
    release.update(n_vq=16, audio_vocab_size=1024, audio_pad_token_id=1024)
    release["gpt2_config"].update(n_embd=768, n_layer=12, n_head=12, n_inner=3072,
                                  vocab_size=16384)  # fmt: skip
    del release["gpt2_config"]["n_positions"]
    nano = NanoConfig.from_dict(release, Path("config.json"))
    assert (nano.n_vq, nano.codebook_sizes, nano.audio_pad) == (16, (1024,) * 16, 1024)
    assert (nano.dims.head_dim, nano.dims.inner, nano.dims.context) == (64, 3072, None)
    assert nano.local_layers == 1 and nano.tokens["pad_token_id"] == 3
    shapes = expected_shapes(nano)
    assert shapes["transformer.h.11.attn.c_attn.weight"] == (2304, 768)
    assert shapes["transformer.h.0.mlp.fc_in.weight"] == (3072, 768)
    assert shapes["audio_lm_heads.15.weight"] == (1024, 768)
    assert "transformer.h.12.ln_1.weight" not in shapes
    assert "local_transformer.h.1.ln_1.bias" not in shapes


def test_the_release_config_as_published_reads_with_its_nulls_and_dtype():
    """The release's config.json key for key (tiny_nano.RELEASE_CONFIG, its 5,210 bytes): a
    full 80-key GPT2Config dump with nulls in it, null top-level bos/eos, "dtype": "float32"
    and no torch_dtype. Every fact reads from it, and its tensors are 194 names: the tied
    heads, and no local_transformer.wte."""
    assert len((json.dumps(RELEASE_CONFIG, indent=2) + "\n").encode()) == RELEASE_CONFIG_BYTES
    gpt2 = RELEASE_CONFIG["gpt2_config"]
    assert len(gpt2) == 80 and gpt2["n_inner"] == 3072 and gpt2["dtype"] is None
    assert RELEASE_CONFIG["bos_token_id"] is None and RELEASE_CONFIG["eos_token_id"] is None
    assert "torch_dtype" not in RELEASE_CONFIG and declared_dtype(RELEASE_CONFIG) == "float32"
    nano = NanoConfig.from_dict(RELEASE_CONFIG, Path("config.json"))
    dims = nano.dims
    assert (dims.hidden, dims.layers, dims.heads, dims.inner, dims.vocab, dims.context) == \
        (768, 12, 12, 3072, 16384, 32768)  # fmt: skip
    assert (dims.eps, dims.rope_base, dims.activation) == (1e-5, 10000.0, "gelu_new")
    assert (nano.n_vq, nano.codebook_sizes, nano.audio_pad, nano.local_layers) == \
        (16, (1024,) * 16, 1024, 1)  # fmt: skip
    ids = ("pad", "im_start", "im_end", "audio_start", "audio_end", "audio_user_slot",
           "audio_assistant_slot")  # fmt: skip
    assert nano.tokens == {f"{name}_token_id": 3 + i for i, name in enumerate(ids)}
    names = expected_shapes(nano)
    assert len(names) == 194 and "local_transformer.wte.weight" not in names
    tiny = release_config(CONFIG)  # the same keys at the tests' sizes
    assert list(tiny) == list(RELEASE_CONFIG) and list(tiny["gpt2_config"]) == list(gpt2)
    assert NanoConfig.from_dict(tiny, Path("config.json")) == \
        NanoConfig.from_dict(CONFIG, Path("config.json"))  # fmt: skip


@pytest.mark.parametrize(
    ("says", "stored", "note"),
    [
        ({"dtype": "float32"}, torch.bfloat16, ("float32", "bfloat16")),  # the release
        ({"torch_dtype": "float16"}, torch.bfloat16, ("float16", "bfloat16")),  # older name
        ({"dtype": "torch.bfloat16"}, torch.float32, ("bfloat16", "float32")),
        ({"dtype": "bfloat16"}, torch.bfloat16, None),
        ({"dtype": None, "torch_dtype": "float32"}, torch.float32, None),
        ({"dtype": "auto"}, torch.bfloat16, None),
        ({}, torch.bfloat16, None),  # builtin:tiny-nano says none
    ],
    ids=["release", "torch_dtype", "torch-prefix", "agrees", "null-then-torch_dtype", "auto",
         "none"],
)  # fmt: skip
def test_a_config_dtype_that_disagrees_is_read_from_the_tensors(tmp_path, says, stored, note):
    """What config.json says the dtype is never decides how the weights are read: they are
    read as stored, and where the two disagree the checkpoint has a note naming both."""
    config = {**release_config(CONFIG), "dtype": None, **says}
    state = write_release(tmp_path, config, release_state(CONFIG, stored, local_wte=False))
    opened = open_nano(tmp_path)
    stored_name = str(stored).removeprefix("torch.")
    assert opened.dtype == stored_name
    for name, tensor in state.items():
        assert opened.tensors[name].dtype.name == stored_name, name
        np.testing.assert_array_equal(opened.tensors[name].astype(np.float32), as_f32(tensor))
    if note is None:
        assert opened.dtype_note is None
    else:
        assert opened.config_dtype == note[0]
        assert opened.dtype_note == (f"config.json says dtype {note[0]} but pytorch_model.bin "
                                     f"stores {note[1]}; the weights are read as stored "
                                     f"({note[1]})")  # fmt: skip


def test_the_release_tokenizer_has_its_pieces_and_byte_offset_and_prompts_by_them(tmp_path):
    """The release's tokenizer.model layout (tiny_nano.release_tokenizer): ids 0-3 `<unk> <s>
    </s> <pad>`, its eleven control pieces at 4-14 (8 `<|vision_pad|>` = the user slot, 9
    `<|video_pad|>` = the assistant slot), byte pieces 15-270. The prompt's `<user_inst>` and
    `</user_inst>` become its pieces 13 and 14 through SentencePiece, as upstream encodes them;
    the control ids go in by the config's ids."""
    path = tmp_path / "tokenizer.model"
    path.write_bytes(release_tokenizer(384))
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    pieces = [p.piece for p in proto.pieces]
    assert pieces[:4] == ["<unk>", "<s>", "</s>", "<pad>"] and len(pieces) <= 384
    assert pieces[4:FIRST_BYTE_PIECE] == list(RELEASE_CONTROL) and FIRST_BYTE_PIECE == 15
    user = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    assert all(proto.pieces[i].type == user for i in range(4, 15))
    assert pieces[15:271] == [f"<0x{b:02X}>" for b in range(256)]
    assert proto.trainer_spec.byte_fallback and proto.normalizer_spec.name == "nmt_nfkc"
    assert proto.trainer_spec.model_type == proto.trainer_spec.BPE
    tokens = NanoConfig.from_dict(release_config(CONFIG), Path("config.json")).tokens
    assert pieces[tokens["audio_user_slot_token_id"]] == "<|vision_pad|>"
    assert pieces[tokens["audio_assistant_slot_token_id"]] == "<|video_pad|>"
    tok = NanoTokenizer(path)
    assert 13 in tok.encode(REFERENCE_HEAD) and tok.encode(INST_END)[-1] == 14
    assert tok.encode("🙂")[-4:] == [15 + b for b in "🙂".encode()]  # bytes fall back from 15
    ids = prompt_ids(tok, tokens, "Hello", reference=True)
    assert ids.before[0] == 4 and ids.before[-1] == 6 and ids.after[0] == 7
    assert ids.after[-1] == 6 and ids.after.count(5) == 1 and ids.after.count(14) == 1


def test_safetensors_is_used_when_present_and_heads_follow_their_tables(tmp_path):
    folder = tmp_path / "nano"
    write_release(folder)
    other = {n: t * 2 for n, t in release_state(CONFIG).items()
             if not n.startswith(("text_lm_head", "audio_lm_heads"))}  # fmt: skip
    save_file(other, str(folder / "model.safetensors"))  # as HF saves: tied copies left out
    opened = open_nano(folder)
    assert opened.weights.name == "model.safetensors"
    for name, tensor in other.items():
        np.testing.assert_array_equal(opened.tensors[name].astype(np.float32), as_f32(tensor))
    for q in range(3):
        head, table = f"audio_lm_heads.{q}.weight", f"audio_embeddings.{q}.weight"
        np.testing.assert_array_equal(opened.tensors[head], opened.tensors[table])


def without(path: str) -> dict:
    config = copy.deepcopy(CONFIG)
    section = config
    *parents, key = path.split(".")
    for p in parents:
        section = section[p]
    del section[key]
    return config


@pytest.mark.parametrize(
    "key",
    ["n_vq", "audio_pad_token_id", "im_start_token_id", "audio_assistant_slot_token_id",
     "local_transformer_layers", "gpt2_config", "gpt2_config.rope_base",
     "gpt2_config.position_embedding_type", "gpt2_config.n_head",
     "gpt2_config.layer_norm_epsilon"],
)  # fmt: skip
def test_every_fact_comes_from_the_file_never_a_class_default(tmp_path, key):
    (tmp_path / "config.json").write_text(json.dumps(without(key)))
    with pytest.raises(InputError) as caught:
        open_nano(tmp_path)
    assert f"config.json has no {key} " in caught.value.one_line()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("model_architecture", "delay"), "model_architecture 'delay' is not"),
        (("gpt2_config.position_embedding_type", "absolute"), "only 'rope' is converted"),
        (("gpt2_config.activation_function", "relu"), "only 'gelu_new' is converted"),
        (("gpt2_config.scale_attn_by_inverse_layer_idx", True), "scales attention otherwise"),
    ],
)
def test_what_nano_is_not_converted_as_is_refused(tmp_path, edit, says):
    config = copy.deepcopy(CONFIG)
    key, value = edit
    section = config["gpt2_config"] if key.startswith("gpt2_config.") else config
    section[key.split(".")[-1]] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=says):
        open_nano(tmp_path)


def test_weights_that_disagree_with_the_config_are_refused(tmp_path):
    bigger = copy.deepcopy(CONFIG)
    bigger["n_vq"] = 4
    write_release(tmp_path / "a", bigger, release_state(CONFIG))
    with pytest.raises(InputError, match=r"n_vq is 4 but the weights hold 3 audio tables"):
        open_nano(tmp_path / "a")
    state = release_state(CONFIG)
    state["transformer.h.1.mlp.fc_in.weight"] = torch.zeros(47, 32, dtype=torch.bfloat16)
    write_release(tmp_path / "b", CONFIG, state)
    with pytest.raises(InputError, match=r"fc_in.weight' has shape \[47, 32\] but config.json"):
        open_nano(tmp_path / "b")
    state = release_state(CONFIG)
    state["transformer.wpe.weight"] = torch.zeros(64, 32, dtype=torch.bfloat16)
    write_release(tmp_path / "c", CONFIG, state)
    with pytest.raises(InputError, match=r"'transformer.wpe.weight' is not one MOSS-TTS-Nano has"):
        open_nano(tmp_path / "c")


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_release_folder_with_a_payload_is_refused_before_any_code_runs(tmp_path):
    marker = tmp_path / "it-ran"
    state = release_state(CONFIG)
    state["extra"] = Payload(marker)
    write_release(tmp_path / "nano", CONFIG, state)
    with pytest.raises(InputError) as caught:
        open_nano(tmp_path / "nano")
    assert re.search(r"pytorch_model.bin: its pickle names \w+\.system,", caught.value.one_line())
    assert not marker.exists()


def refusal(command: str, tmp_path: Path) -> str:
    """COMMAND run on tmp_path/nano (a real process): its one line of refusal, after checking
    that it exits 2 and leaves nothing beside the model (no output, no work folder)."""
    proc = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", command, "--model", str(tmp_path / "nano"),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "it-ran") == ["nano"]
    return lines[0]


def test_all_reads_a_nano_folder_through_its_family_before_any_output(tmp_path):
    write_release(tmp_path / "nano")  # no tokenizer.model: read, checked, then refused
    assert "tokenizer.model is missing" in refusal("all", tmp_path)


def test_the_delay_commands_refuse_a_nano_folder_pointing_at_all(tmp_path):
    write_release(tmp_path / "nano")
    line = refusal("extract", tmp_path)
    assert "is not a MOSS delay model; `all` converts it into a Nano folder" in line


def test_all_refuses_a_nano_payload_before_any_output_exists(tmp_path):
    marker = tmp_path / "it-ran"
    state = release_state(CONFIG)
    state["extra"] = Payload(marker)
    write_release(tmp_path / "nano", CONFIG, state)
    assert re.search(r"its pickle names \w+\.system,", refusal("all", tmp_path))
    assert not marker.exists()


# ------------------------------------------ a checkpoint is untrusted input: its config's values


def _with(key: str, value) -> dict:
    config = copy.deepcopy(CONFIG)
    section = config["gpt2_config"] if key.startswith("gpt2_config.") else config
    section[key.split(".")[-1]] = value
    return config


HOSTILE = [
    # values a ggml assertion or a later int32 would meet (a folder that passed verify then
    # aborted the server)
    ("gpt2_config.layer_norm_epsilon", -1, "layer_norm_epsilon is -1, not a number between 0"),
    ("gpt2_config.layer_norm_epsilon", 0, "layer_norm_epsilon is 0, not a number between 0"),
    ("gpt2_config.rope_base", 0, "rope_base is 0, not a number between 1"),
    ("gpt2_config.rope_base", -10000.0, "rope_base is -10000.0, not a number between 1"),
    ("audio_pad_token_id", 1e30, "audio_pad_token_id is 1e+30, not a token id"),
    ("im_end_token_id", 2.5, "im_end_token_id is 2.5, not a token id"),
    # counts that became gigabytes of names before a tensor was read
    ("gpt2_config.n_layer", 3e6, "gpt2_config.n_layer is 3000000, more than any MOSS-TTS-Nano"),
    ("n_vq", 3e8, "n_vq is 300000000, more than any MOSS-TTS-Nano"),
    ("gpt2_config.n_embd", 10**400, "n_embd is a number of 401 digits, more than any"),
    # counts the weights do not bear out
    ("gpt2_config.n_layer", 3, "gpt2_config.n_layer is 3 but the weights hold 2 global layers"),
    ("local_transformer_layers", 2, "local_transformer_layers is 2 but the weights hold 1"),
]


@pytest.mark.parametrize(("key", "value", "says"), HOSTILE, ids=[f"{k}={v}" for k, v, _ in HOSTILE])
def test_a_config_value_the_runtime_cannot_take_is_refused_by_name(tmp_path, key, value, says):
    write_release(tmp_path, _with(key, value), release_state(CONFIG))
    with pytest.raises(InputError) as caught:
        open_nano(tmp_path)
    line = caught.value.one_line()
    assert says in line and "config.json" in line, line


def test_a_folder_whose_config_was_changed_after_all_is_refused_when_it_loads(tiny_nano_folder,
                                                                               tmp_path):
    """The same checks when a folder loads (synth, serve): one line, exit 2, no file."""
    from builds import Builds

    folder = tmp_path / "w"
    Builds.copy(tiny_nano_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["gpt2_config"]["layer_norm_epsilon"] = -1
    (folder / "config.json").unlink()  # a hard link: replaced, not written into
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "x.wav"
    done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "synth", "--config",
                           str(folder / "moss-tts-nano.yaml"), "--text", "Hi", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "layer_norm_epsilon is -1" in lines[0] and not out.exists()
