"""Tokenizer files rebuilt from a GGUF's ``tokenizer.ggml.*`` keys, for a file that came alone.

A first-class GGUF downloaded on its own (or as the fork's converter leaves it) has no
tokenizer/ beside it, yet it carries its tokenizer: the token list, token types, BPE merges,
pre-tokenizer name, special ids and chat template. The ``qwen2`` pre-tokenizer name stands for
the Qwen2/Qwen3 byte-level BPE tokenizer every MOSS-TTS model uses; it is built here with the
``tokenizers`` library (no transformers, no torch) as the checkpoint's tokenizer.json has it:
an NFC normalizer (without it decomposed accents would tokenize differently), the qwen2 split
regex then the byte-level mapping, a byte-level decoder and post-processor. The token types
say the rest, as llama.cpp's converter wrote them from the checkpoint's added tokens: a control
token is a special added token, a user-defined one a plain added token, and the ``[PADn]``
rows llama.cpp pads the list with (unused) are left out. tests/test_first_class_bare.py checks
the ids against the checkpoint's own tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

from ..errors import InputError
from .read import GgufFormatError, read_gguf
from .vocab import QWEN2_SPLIT_REGEX

PRE = "qwen2"  # the pre-tokenizer name of the Qwen2/Qwen3 vocabulary MOSS-TTS uses
HOW = "rebuilt from the GGUF's tokenizer.ggml.* keys (the tokenizers library)"
HINT = "put the checkpoint's tokenizer files in tokenizer/ beside it"
# tokenizer_config.json's slot → the GGUF key holding its id
_SLOTS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
          "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}  # fmt: skip


@dataclass
class GgufVocab:
    """The tokenizer keys of a GGUF, decoded."""

    tokens: list[str]
    types: list[int]  # gguf.TokenType per token
    merges: list[str]  # "left right", in rank order
    kv: dict[str, Any] = field(repr=False)  # the header's scalar keys

    def key(self, name: str) -> Any:
        return self.kv.get(f"tokenizer.ggml.{name}")


def read_gguf_vocab(gguf_path: Path) -> GgufVocab:
    """The file's tokenizer keys; one line naming the file when they are not a byte-level BPE
    qwen2 vocabulary this module rebuilds."""
    try:
        g = read_gguf(gguf_path)
    except GgufFormatError as exc:
        raise InputError(f"cannot read its header ({exc})", path=gguf_path) from exc
    kind, pre = g.kv.get("tokenizer.ggml.model"), g.kv.get("tokenizer.ggml.pre")
    tokens, merges = g.array("tokenizer.ggml.tokens"), g.array("tokenizer.ggml.merges")
    if kind != "gpt2" or pre != PRE or not tokens or not merges:
        raise InputError(
            f"its tokenizer is {kind!r} / {pre!r}, not the byte-level BPE {PRE!r} vocabulary "
            "a tokenizer can be rebuilt from here",
            path=gguf_path,
            hint=HINT,
        )
    types = g.array("tokenizer.ggml.token_type") or [int(gguf.TokenType.NORMAL)] * len(tokens)
    if len(types) != len(tokens):
        raise InputError(f"{len(tokens)} tokens but {len(types)} token types", path=gguf_path)
    return GgufVocab(tokens, types, merges, g.kv)


def build_tokenizer(v: GgufVocab, gguf_path: Path) -> Tokenizer:
    """The checkpoint's Qwen2 tokenizer, from the file's vocabulary."""
    unused, control = int(gguf.TokenType.UNUSED), int(gguf.TokenType.CONTROL)
    added = (control, int(gguf.TokenType.USER_DEFINED))
    # every id in the model's vocabulary, so the added tokens keep their ids (tokenizers gives
    # a token it already knows that id, a new one the next free id)
    vocab = {t: i for i, (t, k) in enumerate(zip(v.tokens, v.types, strict=True)) if k != unused}
    merges = [tuple(m.split(" ", 1)) for m in v.merges]
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(**byte_level),
    ])  # fmt: skip
    tok.decoder = decoders.ByteLevel(**byte_level)
    tok.post_processor = processors.ByteLevel(**byte_level)  # adds nothing around a text
    tok.add_tokens([AddedToken(t, special=k == control, normalized=False)
                    for t, k in zip(v.tokens, v.types, strict=True) if k in added])  # fmt: skip
    wrong = [t for t, i in vocab.items() if tok.token_to_id(t) != i]
    if wrong or len(vocab) != len(set(vocab.values())):
        raise InputError(f"its token list does not make one id per token ({wrong[:3]})",
                         path=gguf_path, hint=HINT)  # fmt: skip
    return tok


def tokenizer_config(v: GgufVocab, tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json as the checkpoint's says what the keys say: the special token
    slots, the add flags, the added tokens, the chat template (llama.cpp's converter and
    transformers read them there)."""
    config: dict[str, Any] = {}
    for flag in ("add_bos_token", "add_eos_token"):
        if isinstance(v.key(flag), bool):
            config[flag] = v.key(flag)
    config["add_prefix_space"] = False
    config["added_tokens_decoder"] = {
        str(i): {"content": a.content, "lstrip": a.lstrip, "normalized": a.normalized,
                 "rstrip": a.rstrip, "single_word": a.single_word, "special": a.special}
        for i, a in sorted(tok.get_added_tokens_decoder().items())
    }  # fmt: skip
    for slot, key in _SLOTS.items():
        i = v.key(key)
        config[slot] = v.tokens[i] if isinstance(i, int) and 0 <= i < len(v.tokens) else None
    template = v.kv.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    config.update(clean_up_tokenization_spaces=False, errors="replace",
                  split_special_tokens=False, tokenizer_class="Qwen2Tokenizer")  # fmt: skip
    return dict(sorted(config.items()))


def write_tokenizer_files(gguf_path: Path, folder: Path) -> list[Path]:
    """tokenizer.json and tokenizer_config.json in FOLDER, from GGUF_PATH's tokenizer keys."""
    v = read_gguf_vocab(gguf_path)
    if v.key("add_bos_token") is True or v.key("add_eos_token") is True:
        raise InputError("its tokenizer adds tokens around a text; the Qwen2 tokenizer MOSS-TTS "
                         "uses adds none", path=gguf_path, hint=HINT)  # fmt: skip
    tok = build_tokenizer(v, gguf_path)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = json.dumps(tokenizer_config(v, tok), indent=2, ensure_ascii=False)
    (folder / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")
    return [folder / "tokenizer.json", folder / "tokenizer_config.json"]
