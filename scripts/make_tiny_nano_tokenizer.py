"""Make moss_gguf_cli/nano/data/tiny_nano_tokenizer.model: the builtin tiny Nano's tokenizer.

A SentencePiece BPE model laid out as MOSS-TTS-Nano's release has its tokenizer.model
(docs/nano.md): `nmt_nfkc`, byte fallback, ids 0-3 `<unk> <s> </s> <pad>`, the six control tokens
at ids 4-9 as user-defined symbols (named here after the config keys whose ids they are),
trained on a few sentences of English and Chinese. It is shipped as package data, made once
with this script, so that users need neither sentencepiece nor a training run, and the
builtin's bytes are the same on every machine; tests/test_nano_builtin.py remakes it and
compares the bytes.

    python scripts/make_tiny_nano_tokenizer.py [OUT]   (needs the sentencepiece package)
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

CONTROL = ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
           "<|audio_user_slot|>", "<|audio_assistant_slot|>")  # fmt: skip
VOCAB = 384
CORPUS = """\
The quick brown fox jumps over the lazy dog.
MOSS-TTS-Nano speaks on a CPU faster than it listens.
A tiny model for tests: random weights, real layout.
Hello world, this is a text to speech model.
今天天气很好，我们去公园散步吧。
语音合成模型把文字变成声音。
Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation: , . ! ? ; :
"""
OUT = Path(__file__).resolve().parents[1] / "moss_gguf_cli/nano/data/tiny_nano_tokenizer.model"


def make() -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 20),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB,
        hard_vocab_limit=False,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",
        unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        user_defined_symbols=list(CONTROL),
        num_threads=1,
        minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.write_bytes(make())
    print(out)
