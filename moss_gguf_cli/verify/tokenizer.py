"""The tokenizer: it loads, its special ids are the config's (and the GGUF's), text round-trips."""

from __future__ import annotations

from ..report import FAIL
from ..source.token_ids import TOKEN_DEFAULTS
from .context import Context
from .target import shown_path

ROUND_TRIP_TEXT = "Hello, world! Verify 123 — 你好，世界。"


# The strings MOSS-TTS's tokenizer has for its special ids, and the Qwen3 names the same ids
# carry in a plain Qwen3 tokenizer (builtin:tiny uses one); anything else is a warning.
EXPECTED_SPECIAL: dict[str, tuple[str, ...]] = {
    "pad_token_id": ("<|endoftext|>",),
    "im_start_token_id": ("<|im_start|>",),
    "im_end_token_id": ("<|im_end|>",),
    "audio_start_token_id": ("<|audio_start|>", "<|vision_start|>"),
    "audio_end_token_id": ("<|audio_end|>", "<|vision_end|>"),
    "audio_user_slot_token_id": ("<|audio_user_slot|>", "<|vision_pad|>"),
    "audio_assistant_gen_slot_token_id": ("<|audio_assistant_gen_slot|>", "<|video_pad|>"),
    "audio_assistant_delay_slot_token_id": ("<|audio_assistant_delay_slot|>", "<|fim_pad|>"),
}


def tokenizer_checks(ctx: Context) -> None:
    tok_dir = ctx.t.tokenizer_dir
    if tok_dir is None and ctx.ck is not None:
        tok_dir = ctx.ck.root  # a lone GGUF checked against its source
    r = ctx.rows
    r.group = "tokenizer"
    if tok_dir is None:
        return
    path = tok_dir / "tokenizer.json"
    if not path.is_file():
        r.add("tokenizer loads", FAIL, f"{shown_path(path, ctx.t.root)} is missing")
        return
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises plain Exceptions
        r.add("tokenizer loads", FAIL, f"tokenizers cannot load it: {exc}")
        return
    ctx.tokenizer = tok
    n = tok.get_vocab_size(with_added_tokens=True)
    vocab = ctx.facts.vocab if ctx.facts else None
    # BPE ids are 0..base-1, then the added tokens (get_vocab would build a 150k dict)
    added = tok.get_added_tokens_decoder()
    top = max([tok.get_vocab_size(with_added_tokens=False) - 1, *added])
    r.check(
        "tokenizer loads",
        [f"token id {top} is beyond the config vocab_size {vocab}"]
        if vocab is not None and top >= vocab
        else [],
        f"{n} tokens",
    )
    _special_tokens_row(ctx, tok)
    enc = tok.encode(ROUND_TRIP_TEXT, add_special_tokens=False)
    back = tok.decode(enc.ids, skip_special_tokens=False)
    r.check(
        "tokenizer round trip",
        [] if back == ROUND_TRIP_TEXT else [f"{ROUND_TRIP_TEXT!r} decodes as {back!r}"],
        f"{len(enc.ids)} tokens, exact",
    )


def _special_tokens_row(ctx: Context, tok) -> None:
    ids = ctx.facts.token_ids() if ctx.facts else dict(TOKEN_DEFAULTS)
    added = tok.get_added_tokens_decoder()
    problems, warns, shown = [], [], []
    for key, token_id in ids.items():
        text = tok.id_to_token(token_id)
        role = key.removesuffix("_token_id")
        if text is None:
            problems.append(f"{role} id {token_id} is not in the tokenizer")
            continue
        expected = EXPECTED_SPECIAL.get(key, ())
        if token_id not in added:
            problems.append(f"{role} id {token_id} ({text}) is not an added special token")
        elif tok.encode(text, add_special_tokens=False).ids != [token_id]:
            problems.append(f"{text} does not encode to the single id {token_id}")
        elif expected and text not in expected:
            warns.append(f"{role} id {token_id} is {text}, expected {' or '.join(expected)}")
        gguf_text = ctx.gguf_special.get(token_id) if ctx.gguf_special else None
        if gguf_text is not None and gguf_text != text:
            problems.append(
                f"the GGUF's token {token_id} is {gguf_text!r}, the tokenizer's {text!r}"
            )
        shown.append(f"{token_id} {text}")
    ctx.rows.check(
        "special tokens",
        problems,
        f"{len(ids)} ids: " + ", ".join(shown[:3]) + ", …",
        warn=warns,
    )
