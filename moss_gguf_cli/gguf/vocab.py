"""The tokenizer as llama.cpp's converter writes it: tokens, token types, pre-tokenizer, merges.

``convert_hf_to_gguf.py`` reads the tokenizer through transformers; we read the same files with
``tokenizers`` and gguf-py's SpecialVocab and refuse any tokenizer but the Qwen2/Qwen3
byte-level BPE one (the only kind the native engine writes).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import gguf

from ..errors import InputError, ToolError, UnsupportedModelError

ENGINE_HINT = "use --engine llama.cpp for this model"

# The pre-tokenizer llama.cpp calls "qwen2": this split regex, then byte-level mapping.
# llama.cpp recognises it by hashing a tokenization; we recognise the configuration itself.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# transformers' Qwen3Config defaults: llama.cpp reads the config through AutoConfig, so a key


@dataclass
class Vocab:
    tokens: list[str]
    toktypes: list[int]
    pre: str
    special: gguf.SpecialVocab

    def add_to(self, writer: gguf.GGUFWriter) -> None:
        """The tokenizer keys, in the order llama.cpp's converter writes them."""
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.toktypes)
        self.special.add_to_gguf(writer, quiet=True)
        # (the pinned gguf-py also writes normalizer lowercase/strip-accent flags; an NFC
        # normalizer, the only one accepted here, sets neither)


# gguf-py has no public way to take the token ids from another config than <dir>/config.json,
# so _BackboneSpecialVocab overrides a private method; these are the private names and
# parameters it relies on, checked before each use so that a gguf release that renames or
# reshapes them is refused instead of silently reading the MOSS config's ids.
_PRIVATE_HOOKS = {
    "_try_load_from_config_json": ("self", "path"),
    "_set_special_token": ("self", "typ", "tid"),
}


def check_special_vocab_hooks() -> None:
    """Refuse a gguf package whose SpecialVocab lacks the private methods overridden here."""
    for name, params in _PRIVATE_HOOKS.items():
        method = getattr(gguf.SpecialVocab, name, None)
        if callable(method) and tuple(inspect.signature(method).parameters) == params:
            continue
        try:
            installed = version("gguf")
        except PackageNotFoundError:
            installed = "?"
        raise ToolError(
            f"the installed gguf {installed} has no SpecialVocab.{name}({', '.join(params)}), "
            "which the native engine uses to read the backbone's special token ids",
            hint=f"install gguf 0.19.0, or {ENGINE_HINT}",
        )


class _BackboneSpecialVocab(gguf.SpecialVocab):
    """gguf's SpecialVocab, reading token ids from the backbone's config.

    A MOSS source folder holds the MOSS config in config.json; the ids llama.cpp sees come
    from the extracted backbone's config, i.e. the language config.
    """

    def __init__(self, tokenizer_dir: Path, config: dict[str, Any]):
        check_special_vocab_hooks()
        self._backbone_config = config
        super().__init__(tokenizer_dir, load_merges=True)

    def _try_load_from_config_json(self, path: Path) -> bool:
        for typ in self.special_token_types:
            self._set_special_token(typ, self._backbone_config.get(f"{typ}_token_id"))
        return True


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{what} is missing", path=path) from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{what} is not valid JSON ({exc})", path=path) from exc


def _looks_special(text: str) -> bool:
    """Added tokens llama.cpp treats as control tokens even when not flagged special."""
    if text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]"):
        return True
    pairs = (("<|", "|>"), ("<\uff5c", "\uff5c>"), ("<unused", ">"))
    return any(text.startswith(a) and text.endswith(b) for a, b in pairs)


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization (applied by decode when the config asks for it)."""
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


def _state(component: Any) -> dict[str, Any]:
    """The JSON form of a tokenizers component (normalizer, pre-tokenizer, ...), {} if none."""
    if component is None:
        return {}
    return json.loads(component.__getstate__())


def pre_tokenizer_name(tok: Any, path: Path) -> str:
    """'qwen2' for a Qwen2/Qwen3 byte-level BPE tokenizer; anything else is refused."""
    pre = _state(tok.pre_tokenizer)
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    split = parts[0] if parts else {}
    byte_level = parts[1] if len(parts) > 1 else {}
    if (
        type(tok.model).__name__ == "BPE"
        and not tok.model.byte_fallback
        and len(parts) == 2
        and split.get("type") == "Split"
        and (split.get("pattern") or {}).get("Regex") == QWEN2_SPLIT_REGEX
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("use_regex") is False
        and not byte_level.get("add_prefix_space")
        and _state(tok.normalizer).get("type") == "NFC"
    ):
        return "qwen2"
    raise UnsupportedModelError(
        "the tokenizer is not a Qwen2/Qwen3 byte-level BPE tokenizer (the only kind the "
        "native engine writes)",
        path=path,
        hint=ENGINE_HINT,
    )


def _add_token_flags(
    post: dict[str, Any],
    tokenizer_config: dict[str, Any],
    types: Iterable[str],
    path: Path,
    byte_level_adds: bool = True,
) -> dict[str, bool]:
    """add_bos/add_eos/... as the pinned gguf-py decides them.

    A byte-level post-processor adds nothing (bos/eos False) and wins over tokenizer_config;
    tokenizer_config fills in the rest.
    """
    flags: dict[str, bool] = {}
    if post:
        for proc in post.get("processors", [post]):
            if proc.get("type") != "ByteLevel":
                raise UnsupportedModelError(
                    f"tokenizer post-processor {proc.get('type')!r} is not handled by the "
                    "native engine",
                    path=path,
                    hint=ENGINE_HINT,
                )
            if byte_level_adds:
                flags.setdefault("bos", False)
                flags.setdefault("eos", False)
    for typ in types:
        value = tokenizer_config.get(f"add_{typ}_token")
        if isinstance(value, bool) and typ not in flags:
            flags[typ] = value
    return flags


def _load_tokenizer(tokenizer_dir: Path) -> tuple[Any, dict[str, Any], Path]:
    """(the tokenizers Tokenizer, tokenizer_config.json, tokenizer.json's path), or refuse."""
    from tokenizers import Tokenizer

    tj_path = tokenizer_dir / "tokenizer.json"
    tc_path = tokenizer_dir / "tokenizer_config.json"
    if (tokenizer_dir / "tokenizer.model").is_file():
        raise UnsupportedModelError(
            "a sentencepiece tokenizer.model is present; llama.cpp would write a "
            "sentencepiece vocabulary, which the native engine does not",
            path=tokenizer_dir / "tokenizer.model",
            hint=ENGINE_HINT,
        )
    tokenizer_config = _read_json(tc_path, "tokenizer_config.json")
    if not isinstance(tokenizer_config, dict):
        raise InputError("tokenizer_config.json is not a JSON object", path=tc_path)
    if not tj_path.is_file():
        raise InputError("tokenizer.json is missing", path=tj_path)
    try:
        tok = Tokenizer.from_file(str(tj_path))
    except Exception as exc:  # noqa: BLE001 - the library's own parse error, one line
        msg = " ".join(str(exc).split())
        raise InputError(f"tokenizers cannot load it ({msg})", path=tj_path) from exc
    return tok, tokenizer_config, tj_path


def _special_contents(added: dict[int, Any], tokenizer_config: dict[str, Any]) -> set[str]:
    """The added tokens' texts transformers counts special: flagged so in tokenizer.json or
    tokenizer_config's added_tokens_decoder, or named in a special-token slot."""
    special = {t.content for t in added.values() if t.special}
    for entry in (tokenizer_config.get("added_tokens_decoder") or {}).values():
        if isinstance(entry, dict) and entry.get("special"):
            special.add(str(entry.get("content")))
    for key, value in tokenizer_config.items():
        if key.endswith("_token") and isinstance(value, str):
            special.add(value)
        elif key.endswith("_token") and isinstance(value, dict) and "content" in value:
            special.add(str(value["content"]))
    for key in ("additional_special_tokens", "extra_special_tokens"):
        for value in tokenizer_config.get(key) or []:
            special.add(value if isinstance(value, str) else str(value.get("content")))
    return special


def _added_entry(
    tok: Any, text: str, token: Any, special_content: set[str], clean_up: bool
) -> tuple[str, int]:
    """An added token's text and type as llama.cpp's converter writes them."""
    is_special = text in special_content or (token is not None and token.special)
    if token is not None and not token.normalized:
        # llama.cpp assumes added tokens are pre-normalized: round-trip them
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        text = _clean_up_spaces(decoded) if clean_up else decoded
    if is_special or _looks_special(text):
        return text, gguf.TokenType.CONTROL
    # user-defined spaces, pre-normalized
    return text.replace("\u2581", " "), gguf.TokenType.USER_DEFINED


def _tokens_and_types(
    tok: Any, tokenizer_config: dict[str, Any], vocab_size: int, path: Path
) -> tuple[list[str], list[int]]:
    """Every id's text and token type, the ids the tokenizer lacks as [PADn] (unused)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    if vocab and max(vocab.values()) >= vocab_size:
        raise InputError(
            f"tokenizer has token id {max(vocab.values())} but the config's vocab_size is "
            f"{vocab_size}",
            path=path,
            hint="the tokenizer belongs to another model",
        )
    added = tok.get_added_tokens_decoder()  # id → AddedToken
    added_content = {t.content for t in added.values()}
    special_content = _special_contents(added, tokenizer_config)
    clean_up = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))

    reverse = {i: s for s, i in vocab.items()}
    tokens: list[str] = []
    toktypes: list[int] = []
    for i in range(vocab_size):
        text = reverse.get(i)
        if text is None:
            text, toktype = f"[PAD{i}]", gguf.TokenType.UNUSED
        elif text in added_content:
            text, toktype = _added_entry(tok, text, added.get(i), special_content, clean_up)
        else:
            toktype = gguf.TokenType.NORMAL
        tokens.append(text)
        toktypes.append(toktype)
    return tokens, toktypes


def read_vocab(
    tokenizer_dir: Path, config: dict[str, Any], vocab_size: int, byte_level_adds: bool = True
) -> Vocab:
    """Tokens, token types, pre-tokenizer and special vocab, as llama.cpp writes them.

    ``config`` is the backbone's config: the special token ids come from it, not from
    tokenizer_dir/config.json (a MOSS source folder's config.json is the MOSS config).
    ``byte_level_adds`` False: the add_* flags as gguf-py 0.18 (OpenMOSS's llama.cpp fork)
    decides them, from tokenizer_config alone; it does not read a byte-level post-processor.
    """
    tokenizer_dir = Path(tokenizer_dir)
    tok, tokenizer_config, tj_path = _load_tokenizer(tokenizer_dir)
    pre = pre_tokenizer_name(tok, tj_path)
    tokens, toktypes = _tokens_and_types(tok, tokenizer_config, vocab_size, tj_path)
    special = _BackboneSpecialVocab(tokenizer_dir, config)
    special.add_special_token = _add_token_flags(
        _state(tok.post_processor), tokenizer_config, special.special_token_types, tj_path,
        byte_level_adds,
    )  # fmt: skip
    if not special.merges:
        raise InputError("tokenizer has no BPE merges", path=tj_path)
    return Vocab(tokens, toktypes, pre, special)
