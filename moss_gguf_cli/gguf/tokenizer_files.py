"""Tokenizer files rebuilt from a GGUF's ``tokenizer.ggml.*`` keys, for a file that came alone.

A first-class GGUF downloaded on its own (or as the fork's converter leaves it) has no
tokenizer/ beside it, yet it carries its tokenizer: the token list, token types, BPE merges,
pre-tokenizer name and special ids. transformers' GGUF support reads those keys
(``get_gguf_tokenizer``) and knows how a llama.cpp vocabulary maps back to a Hugging Face one
(``get_merges``, ``add_gguf_special_tokens``: control tokens become special added tokens).
The tokenizer itself is transformers' ``Qwen2Tokenizer``, which the ``qwen2`` pre-tokenizer
name stands for and every MOSS-TTS model uses: its NFC normalizer, split regex and byte-level
decoder are the checkpoint's (transformers' generic byte-level builder has no normalizer, so
decomposed accents would tokenize differently). tests/test_first_class_read.py checks the ids
against the checkpoint's own tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from ..errors import InputError

PRE = "qwen2"  # the pre-tokenizer name of the Qwen2/Qwen3 vocabulary MOSS-TTS uses
HOW = "rebuilt from the GGUF's tokenizer.ggml.* keys (transformers' Qwen2Tokenizer)"


def write_tokenizer_files(gguf_path: Path, folder: Path) -> list[Path]:
    """tokenizer.json and tokenizer_config.json in FOLDER, from GGUF_PATH's tokenizer keys."""
    try:
        from transformers.integrations.gguf import get_gguf_tokenizer
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            add_gguf_special_tokens,
            get_merges,
        )
        from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
    except ImportError as exc:
        raise InputError(
            f"no tokenizer/ beside it, and rebuilding one from its keys needs transformers "
            f"5.25 or later ({exc})",
            path=gguf_path,
            hint="pip install 'moss-gguf[gguf-tokenizer]', or put the checkpoint's tokenizer "
            "files in tokenizer/ beside it",
        ) from exc

    _, keys, config = get_gguf_tokenizer(str(gguf_path))
    kind, pre = keys.get("tokenizer_type"), keys.get("pre_tokenizer_type")
    if kind != "gpt2" or pre != PRE or not keys.get("merges"):
        raise InputError(
            f"its tokenizer is {kind!r} / {pre!r}, not the byte-level BPE {PRE!r} vocabulary "
            "a tokenizer can be rebuilt from here",
            path=gguf_path,
            hint="put the checkpoint's tokenizer files in tokenizer/ beside it",
        )
    # llama.cpp pads the list to the model's rows with UNUSED "[PADn]" entries the checkpoint's
    # tokenizer does not have (the backbone's header pads it again the same way)
    types = keys.get("token_type") or [0] * len(keys["tokens"])
    unused = int(gguf.TokenType.UNUSED)
    vocab = {
        t: i for i, (t, k) in enumerate(zip(keys["tokens"], types, strict=True)) if k != unused
    }
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=get_merges(keys),
        bos_token=config.get("bos_token"),
        eos_token=config.get("eos_token"),
        pad_token=config.get("pad_token"),
        unk_token=config.get("unk_token"),
        add_bos_token=bool(config.get("add_bos_token", False)),
        add_eos_token=bool(config.get("add_eos_token", False)),
    )
    tokenizer = add_gguf_special_tokens(tokenizer, keys)
    if not (config.get("add_bos_token") or config.get("add_eos_token")):
        # nothing to add around a text: the plain byte-level post-processor of Qwen2's own
        # tokenizer.json (the class's template one adds nothing either, but the native
        # engine reads add_bos/add_eos from the post-processor and takes only this kind)
        from tokenizers import processors

        tokenizer.backend_tokenizer.post_processor = processors.ByteLevel(
            add_prefix_space=False, trim_offsets=False, use_regex=False
        )
    if config.get("chat_template"):
        tokenizer.chat_template = config["chat_template"]
    folder.mkdir(parents=True, exist_ok=True)
    written = tokenizer.save_pretrained(str(folder))
    return sorted(Path(p) for p in written if Path(p).is_file())
