"""Tiny MOSS-TTS-Nano checkpoints written as the release writes them.

Two shapes. `write_release` writes the short config most tests edit (the release's keys that
the converter reads) and upstream's state dict saved by torch.save (tied heads over their
tables' storage). `write_as_release` writes a checkpoint in the release's exact shape (docs/nano.md,
"the release as it is"; `OpenMOSS-Team/MOSS-TTS-Nano-100M` at rev 44502f80): its
config.json key for key (RELEASE_CONFIG: a top-level `"dtype": "float32"` over bf16 weights,
nulls, gpt2_config as transformers 4.57.1's GPT2Config dumps it with all 80 keys), bf16 tensors
under the release's 194 names (no `local_transformer.wte`), a tokenizer.model with the release's
control pieces at ids 4-14 and its byte pieces from id 15, and tokenizer_config.json and
special_tokens_map.json beside it; only the sizes are tiny.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import torch

from moss_gguf_cli.nano.checkpoint import expected_shapes
from moss_gguf_cli.nano.config import NanoConfig
from moss_gguf_cli.nano.tiny import CONFIG as TINY_NANO

# the release's keys (docs/nano.md) as builtin:tiny-nano has them, at tinier sizes
CONFIG = {
    **copy.deepcopy(TINY_NANO),
    "n_vq": 3,
    "audio_vocab_size": 16,
    "audio_pad_token_id": 16,
    "gpt2_config": {**TINY_NANO["gpt2_config"], "n_embd": 32, "n_inner": 48, "vocab_size": 40,
                    "n_positions": 64},  # fmt: skip
}

# ---------------------------------------------------------------- the release's config.json

# PretrainedConfig's own keys as transformers 4.57.1 writes them: both levels carry all of them
_PRETRAINED = {
    "add_cross_attention": False, "architectures": None, "bad_words_ids": None,
    "begin_suppress_tokens": None, "bos_token_id": None, "chunk_size_feed_forward": 0,
    "cross_attention_hidden_size": None, "decoder_start_token_id": None,
    "diversity_penalty": 0.0, "do_sample": False, "dtype": None, "early_stopping": False,
    "encoder_no_repeat_ngram_size": 0, "eos_token_id": None,
    "exponential_decay_length_penalty": None, "finetuning_task": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "is_decoder": False,
    "is_encoder_decoder": False, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "length_penalty": 1.0, "max_length": 20, "min_length": 0, "no_repeat_ngram_size": 0,
    "num_beam_groups": 1, "num_beams": 1, "num_return_sequences": 1,
    "output_attentions": False, "output_hidden_states": False, "output_scores": False,
    "pad_token_id": 3, "prefix": None, "problem_type": None, "pruned_heads": {},
    "remove_invalid_values": False, "repetition_penalty": 1.0, "return_dict": True,
    "return_dict_in_generate": False, "sep_token_id": None, "suppress_tokens": None,
    "task_specific_params": None, "temperature": 1.0, "tf_legacy_loss": False,
    "tie_encoder_decoder": False, "tie_word_embeddings": True, "tokenizer_class": None,
    "top_k": 50, "top_p": 1.0, "torchscript": False, "transformers_version": "4.57.1",
    "typical_p": 1.0, "use_bfloat16": False,
}  # fmt: skip
# GPT2Config's own keys, and the two upstream adds (position_embedding_type, rope_base)
_GPT2 = {
    "_name_or_path": "", "activation_function": "gelu_new", "attn_pdrop": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 2, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 32768, "n_embd": 768,
    "n_head": 12, "n_inner": 3072, "n_layer": 12, "n_positions": 32768,
    "position_embedding_type": "rope", "reorder_and_upcast_attn": False, "resid_pdrop": 0.0,
    "rope_base": 10000.0, "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "use_cache": True, "vocab_size": 16384,
}  # fmt: skip
_NANO = {
    "architectures": ["MossTTSNanoForCausalLM"], "attn_implementation": "flash_attention_2",
    "audio_assistant_slot_token_id": 9, "audio_codebook_sizes": [1024] * 16,
    "audio_end_token_id": 7, "audio_pad_token_id": 1024, "audio_start_token_id": 6,
    "audio_tokenizer_pretrained_name_or_path": "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano",
    "audio_tokenizer_sample_rate": 48000, "audio_tokenizer_type": "moss-audio-tokenizer-nano",
    "audio_user_slot_token_id": 8, "audio_vocab_size": 1024, "dtype": "float32",
    "hidden_size": 768, "im_end_token_id": 5, "im_start_token_id": 4,
    "initializer_range": 0.02, "local_transformer_attn_implementation": "flash_attention_2",
    "local_transformer_layers": 1, "max_position_embeddings": 32768,
    "model_architecture": "global_local_transformer", "model_type": "moss_tts_nano",
    "n_vq": 16, "tokenizer_class": "MossTTSNanoSentencePieceTokenizer",
    "tokenizer_use_fast": False, "vocab_size": 16384,
}  # fmt: skip
_AUTO_MAP = {
    "AutoConfig": "configuration_moss_tts_nano.MossTTSNanoConfig",
    "AutoModel": "modeling_moss_tts_nano.MossTTSNanoForCausalLM",
    "AutoModelForCausalLM": "modeling_moss_tts_nano.MossTTSNanoForCausalLM",
}
# The release's config.json in its order (transformers' sorted keys, auto_map last):
# `json.dumps(RELEASE_CONFIG, indent=2) + "\n"` is its 5,210 bytes.
RELEASE_CONFIG: dict[str, Any] = {
    **dict(sorted({**_PRETRAINED, **_NANO,
                   "gpt2_config": dict(sorted({**_PRETRAINED, **_GPT2}.items()))}.items())),
    "auto_map": _AUTO_MAP,
}  # fmt: skip
RELEASE_CONFIG_BYTES = 5210
# tokenizer_config.json as the release has it (1,140 bytes as written below)
RELEASE_TOKENIZER_CONFIG: dict[str, Any] = {
    "added_tokens_decoder": {
        str(i): {"content": piece, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, piece in enumerate(("<unk>", "<s>", "</s>", "<pad>"))
    },
    "additional_special_tokens": [],
    "auto_map": {"AutoTokenizer": ["tokenization_moss_tts_nano.MossTTSNanoSentencePieceTokenizer",
                                   None]},
    "backend": "custom", "bos_token": "<s>", "clean_up_tokenization_spaces": False,
    "eos_token": "</s>", "extra_special_tokens": {}, "model_max_length": 16384,
    "pad_token": "<pad>", "tokenizer_class": "MossTTSNanoSentencePieceTokenizer",
    "unk_token": "<unk>",
}  # fmt: skip
SPECIAL_TOKENS_MAP = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                      "unk_token": "<unk>"}  # fmt: skip
# the release tokenizer's pieces 4-14, user-defined symbols (8: the user slot, 9: the assistant's)
RELEASE_CONTROL = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                   "<|vision_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                   "<|audio_pad|>", "<user_inst>", "</user_inst>")  # fmt: skip
FIRST_BYTE_PIECE = 4 + len(RELEASE_CONTROL)  # <0x00> is id 15, <0xFF> id 270


def nano_config(**gpt2: int) -> dict:
    """CONFIG with other gpt2_config sizes."""
    config = copy.deepcopy(CONFIG)
    config["gpt2_config"].update(gpt2)
    return config


def release_config(config: dict) -> dict:
    """RELEASE_CONFIG with CONFIG's sizes and ids (CONFIG: the short form, as CONFIG above or
    builtin:tiny-nano's): every other key, null and quirk as the release has it."""
    gpt2 = config["gpt2_config"]
    out = copy.deepcopy(RELEASE_CONFIG)
    for key in ("n_vq", "audio_vocab_size", "audio_pad_token_id", "local_transformer_layers",
                *_token_keys(config)):  # fmt: skip
        out[key] = config[key]
    out["audio_codebook_sizes"] = [config["audio_vocab_size"]] * config["n_vq"]
    out["hidden_size"], out["vocab_size"] = gpt2["n_embd"], gpt2["vocab_size"]
    for key in ("n_embd", "n_head", "n_inner", "n_layer", "vocab_size", "n_positions",
                "layer_norm_epsilon", "rope_base"):  # fmt: skip
        if key in gpt2:
            out["gpt2_config"][key] = gpt2[key]
    out["gpt2_config"]["n_ctx"] = out["max_position_embeddings"] = out["gpt2_config"]["n_positions"]
    return out


def _token_keys(config: dict) -> list[str]:
    return [k for k in config if k.endswith("_token_id") and k != "audio_pad_token_id"]


def release_state(
    config: dict, dtype: torch.dtype = torch.bfloat16, seed: int = 1, local_wte: bool = True
) -> dict[str, torch.Tensor]:
    """A state dict as upstream's model.state_dict() has it: heads the same tensors as tables;
    norms near 1, everything else random at a scale that keeps every layer's work visible.
    LOCAL_WTE: an unused `local_transformer.wte` too (older layouts; the release has none)."""
    nano = NanoConfig.from_dict(config, Path("config.json"))
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in expected_shapes(nano).items():
        values = torch.randn(shape, generator=gen)
        if ".ln_" in name and name.endswith(".weight"):
            values = 1 + 0.1 * values
        elif ".h." in name and len(shape) == 2:  # a block's matrix: [out, in]
            values = values / shape[1] ** 0.5
        else:  # tables, biases
            values = 0.1 * values
        state[name] = values.to(dtype)
    state["text_lm_head.weight"] = state["transformer.wte.weight"]
    for q in range(nano.n_vq):
        state[f"audio_lm_heads.{q}.weight"] = state[f"audio_embeddings.{q}.weight"]
    if local_wte:
        state["local_transformer.wte.weight"] = torch.randn(nano.dims.vocab, nano.hidden).to(dtype)
    return state


def write_release(folder: Path, config: dict = CONFIG, state: dict | None = None) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    state = release_state(config) if state is None else state
    torch.save(state, folder / "pytorch_model.bin")
    return state


def release_tokenizer(vocab: int) -> bytes:
    """A tokenizer.model laid out as the release's (SentencePiece BPE, `nmt_nfkc`, byte
    fallback; `<unk> <s> </s> <pad>` at 0-3, RELEASE_CONTROL at 4-14 as user-defined symbols,
    the 256 byte pieces from 15), at most VOCAB pieces, trained on the builtin's corpus."""
    import importlib.util

    import sentencepiece as spm

    script = Path(__file__).resolve().parents[1] / "scripts/make_tiny_nano_tokenizer.py"
    spec = importlib.util.spec_from_file_location("make_tiny_nano_tokenizer", script)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(make.CORPUS.splitlines() * 20), model_writer=model,
        model_type="bpe", vocab_size=vocab, hard_vocab_limit=False, byte_fallback=True,
        character_coverage=1.0, normalization_rule_name="nmt_nfkc",
        unk_id=0, bos_id=1, eos_id=2, pad_id=3, user_defined_symbols=list(RELEASE_CONTROL),
        num_threads=1, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def write_as_release(folder: Path, config: dict = TINY_NANO, seed: int = 5) -> dict:
    """A checkpoint in the release's exact shape at CONFIG's sizes (the module's docstring):
    config.json as transformers writes it, bf16 weights under the release's names by
    torch.save, the release-shaped tokenizer and the tokenizer's two JSON files."""
    shaped = release_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shaped, indent=2) + "\n")
    state = release_state(config, torch.bfloat16, seed=seed, local_wte=False)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "tokenizer.model").write_bytes(release_tokenizer(shaped["vocab_size"]))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(RELEASE_TOKENIZER_CONFIG, indent=2) + "\n")  # fmt: skip
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS_MAP, indent=2)
                                                    + "\n")  # fmt: skip
    return state
