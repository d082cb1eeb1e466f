"""The generation prompt: its text and its rows S × (1 + n_vq) (docs/ARCHITECTURE.md §5).

The user turn is the `<user_inst>` block, wrapped as a chat turn, followed by the
assistant header and the audio-start token (generation starts inside audio). A
reference voice of T frames becomes ``[S1]:\\n`` + audio-start + (T + n_vq − 1)
user-slot tokens + audio-end, and its codes sit in those slot rows in the delay
pattern. Special tokens are written with the strings the tokenizer itself has for
their ids, and the whole text is encoded at once, so BPE merges across the
template's newlines come out as the model saw them in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from .config import ModelInfo
from .delay import apply_delay

TEMPLATE = (
    "<user_inst>\n"
    "- Reference(s):\n{reference}\n"
    "- Instruction:\n{instruction}\n"
    "- Tokens:\n{tokens}\n"
    "- Quality:\n{quality}\n"
    "- Sound Event:\n{sound_event}\n"
    "- Ambient Sound:\n{ambient_sound}\n"
    "- Language:\n{language}\n"
    "- Text:\n{text}\n"
    "</user_inst>"
)
SPEAKER = "[S1]:\n"


@dataclass(frozen=True)
class PromptFields:
    """The fields of the user block; those left as None are written as ``None``."""

    text: str
    instruction: str | None = None
    tokens: int | None = None
    quality: str | None = None
    sound_event: str | None = None
    ambient_sound: str | None = None
    language: str | None = None


@dataclass(frozen=True)
class Prompt:
    text: str  # the prompt as text (reference slots included), without the final audio-start
    rows: np.ndarray  # (S, 1 + n_vq) int64
    reference_frames: int = 0


def load_tokenizer(tokenizer_dir: Path):
    """The text tokenizer from <tokenizer_dir>/tokenizer.json (the `tokenizers` library)."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises plain Exceptions for bad files
        raise InputError(
            f"cannot load the tokenizer: {exc}",
            path=path,
            hint="copy tokenizer.json of the checkpoint into tokenizer_dir",
        ) from exc


def special_strings(tokenizer, info: ModelInfo) -> dict[str, str]:
    """The tokenizer's own strings for the special ids the prompt uses."""
    ids = {
        "im_start": info.im_start_token_id,
        "im_end": info.im_end_token_id,
        "audio_start": info.audio_start_token_id,
        "audio_end": info.audio_end_token_id,
        "user_slot": info.audio_user_slot_token_id,
        "gen_slot": info.audio_assistant_gen_slot_token_id,
        "delay_slot": info.audio_assistant_delay_slot_token_id,
        "pad": info.pad_token_id,
    }
    out = {}
    for name, token_id in ids.items():
        token = tokenizer.id_to_token(token_id)
        if token is None:
            raise InputError(
                f"the tokenizer has no token with id {token_id} ({name})",
                hint="tokenizer_dir and the model config belong to different models",
            )
        out[name] = token
    return out


def user_block(fields: PromptFields, reference: str | None = None) -> str:
    def show(value: object) -> str:
        return "None" if value is None else str(value)

    return (
        TEMPLATE.replace("{reference}", show(reference))
        .replace("{instruction}", show(fields.instruction))
        .replace("{tokens}", show(fields.tokens))
        .replace("{quality}", show(fields.quality))
        .replace("{sound_event}", show(fields.sound_event))
        .replace("{ambient_sound}", show(fields.ambient_sound))
        .replace("{language}", show(fields.language))
        .replace("{text}", show(fields.text))
    )


def prompt_text(
    fields: PromptFields, special: dict[str, str], n_vq: int, reference_frames: int = 0
) -> str:
    reference = None
    if reference_frames > 0:
        slots = special["user_slot"] * (reference_frames + n_vq - 1)
        reference = SPEAKER + special["audio_start"] + slots + special["audio_end"]
    return (
        f"{special['im_start']}user\n"
        + user_block(fields, reference)
        + f"{special['im_end']}\n{special['im_start']}assistant\n"
    )


def check_fields(fields: PromptFields, special: dict[str, str]) -> None:
    if not isinstance(fields.text, str) or not fields.text.strip():
        raise InputError("the text to speak is empty", hint="pass --text or --text-file")
    for name in ("text", "instruction", "quality", "sound_event", "ambient_sound", "language"):
        value = getattr(fields, name)
        if value is None:
            continue
        for token in special.values():
            if token in str(value):
                raise InputError(
                    f"the {name} contains the special token {token}",
                    hint="remove control tokens from the input",
                )
    if fields.tokens is not None and (isinstance(fields.tokens, bool) or fields.tokens < 0):
        raise InputError(f"tokens must be a positive integer, got {fields.tokens!r}")


def build_prompt(
    tokenizer,
    info: ModelInfo,
    fields: PromptFields,
    reference_codes: np.ndarray | None = None,
) -> Prompt:
    """Prompt rows for FIELDS; REFERENCE_CODES (T, n_vq) add a voice to clone."""
    special = special_strings(tokenizer, info)
    check_fields(fields, special)
    n_vq = info.n_vq
    frames = 0
    if reference_codes is not None:
        reference_codes = np.asarray(reference_codes, dtype=np.int64)
        if reference_codes.ndim != 2 or reference_codes.shape[1] != n_vq:
            raise InputError(
                f"reference codes have shape {reference_codes.shape}, expected (T, {n_vq})"
            )
        frames = int(reference_codes.shape[0])
        if frames == 0:
            raise InputError("the reference audio encodes to no frames", hint="use longer audio")
        if reference_codes.min() < 0 or reference_codes.max() >= info.audio_vocab_size:
            raise InputError("reference codes fall outside the codebook")
    text = prompt_text(fields, special, n_vq, frames)
    ids = tokenizer.encode(text, add_special_tokens=False).ids + [info.audio_start_token_id]
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.full((ids.size, 1 + n_vq), info.audio_pad_code, dtype=np.int64)
    rows[:, 0] = ids
    if frames:
        start = int(np.flatnonzero(ids == info.audio_start_token_id)[0])
        span = frames + n_vq - 1
        block = ids[start + 1 : start + 1 + span]
        if (
            block.size != span
            or np.any(block != info.audio_user_slot_token_id)
            or ids[start + 1 + span] != info.audio_end_token_id
        ):
            raise InputError(
                "the tokenizer did not keep the reference slot tokens whole",
                hint="tokenizer_dir and the model config belong to different models",
            )
        rows[start + 1 : start + 1 + span, 1:] = apply_delay(reference_codes, info.audio_pad_code)
    return Prompt(text=text, rows=rows, reference_frames=frames)
