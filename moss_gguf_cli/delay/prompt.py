"""The generation prompt: its text and its rows S × (1 + n_vq) (docs/ARCHITECTURE.md §5).

The rows equal upstream's `MossTTSDelayProcessor` (OpenMOSS/MOSS-TTS 58b20a0) id for id, for
MOSS-TTS, MOSS-TTSD, MOSS-VoiceGenerator and MOSS-SoundEffect (tests/data/upstream_prompts.json):

- the user turn is the `<user_inst>` block wrapped as a chat turn; fields not given are
  written ``None`` (MOSS-SoundEffect's Text is ``None`` beside its Ambient Sound);
- each speaker's reference voice of T frames is ``[Sn]:\\n`` + audio-start + (T + n_vq − 1)
  user-slot tokens + audio-end, one per line, speakers without a clip left out; its codes
  sit in those slot rows in the delay pattern;
- generation mode: the assistant header and the audio-start token (upstream's model adds
  the latter itself), so generation starts inside audio;
- continuation mode (audio already spoken: a MOSS-TTSD dialogue's joined clips): the
  assistant turn holds audio-start + T gen slots with the first T delayed rows of those
  codes, and generation goes on from the last of them.

Special tokens are written with the strings the tokenizer itself has for their ids, and
each turn is encoded at once, so BPE merges across the template's newlines come out as the
model saw them in training.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from .config import ModelInfo
from .normalize import merge_turns, normalize_dialogue
from .pattern import apply_delay

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
TEXT_MARK = "- Text:\n"  # the field the words go in: what comes before is shared
SPEAKER_TAG = re.compile(r"\[S(\d+)\]")


@dataclass(frozen=True)
class PromptFields:
    """The fields of the user block; those left as None are written as ``None``.

    Text may be None only where an ambient sound or sound event says what to make
    (MOSS-SoundEffect)."""

    text: str | None
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
    reference_frames: int = 0  # all speakers' reference frames together
    continuation_frames: int = 0  # frames of audio the prompt ends inside (continuation mode)
    continuation_codes: np.ndarray | None = None  # those frames (T, n_vq): the decoder's context
    shared_rows: int = 0  # rows before the Text field's words: the same whatever the text


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


def audio_block(special: dict[str, str], slot: str, frames: int, n_vq: int) -> str:
    """An audio span: audio-start, a slot per row of the delayed codes, audio-end."""
    return special["audio_start"] + slot * (frames + n_vq - 1) + special["audio_end"]


def prompt_text(
    fields: PromptFields,
    special: dict[str, str],
    n_vq: int,
    reference_frames: int | Sequence[int | None] = 0,
    continuation_frames: int = 0,
) -> str:
    """The prompt as text. REFERENCE_FRAMES: one voice's frames ([S1]), or one entry per
    speaker (None: that speaker has no clip); CONTINUATION_FRAMES: the assistant turn's audio."""
    if isinstance(reference_frames, int):
        reference_frames = [reference_frames] if reference_frames > 0 else []
    lines = [
        f"[S{i + 1}]:\n" + audio_block(special, special["user_slot"], frames, n_vq)
        for i, frames in enumerate(reference_frames)
        if frames is not None
    ]
    text = (
        f"{special['im_start']}user\n"
        + user_block(fields, "\n".join(lines) if lines else None)
        + f"{special['im_end']}\n{special['im_start']}assistant\n"
    )
    if continuation_frames:
        text += special["audio_start"] + special["gen_slot"] * continuation_frames
    return text


def check_fields(fields: PromptFields, special: dict[str, str]) -> None:
    described = any(
        isinstance(v, str) and v.strip() for v in (fields.ambient_sound, fields.sound_event)
    )
    if fields.text is None and not described:
        raise InputError(
            "the text to speak is empty", hint="pass --text or --text-file, or --ambient-sound"
        )
    if fields.text is not None and (not isinstance(fields.text, str) or not fields.text.strip()):
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


def checked_codes(codes: np.ndarray, info: ModelInfo, what: str) -> np.ndarray:
    """CODES as (T, n_vq) int64 inside the codebook, T > 0; InputError naming WHAT."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim != 2 or codes.shape[1] != info.n_vq:
        raise InputError(f"{what} codes have shape {codes.shape}, expected (T, {info.n_vq})")
    if codes.shape[0] == 0:
        raise InputError(f"the {what} audio encodes to no frames", hint="use longer audio")
    if codes.min() < 0 or codes.max() >= info.audio_vocab_size:
        raise InputError(f"{what} codes fall outside the codebook")
    return codes


def build_prompt(
    tokenizer,
    info: ModelInfo,
    fields: PromptFields,
    reference_codes: np.ndarray | None = None,
    *,
    speakers: Sequence[np.ndarray | None] | None = None,
    continuation: np.ndarray | None = None,
) -> Prompt:
    """Prompt rows for FIELDS. REFERENCE_CODES (T, n_vq): one voice to clone, as [S1];
    SPEAKERS: a voice per speaker [S1], [S2], … (None: no clip for that one) — give one or
    the other; CONTINUATION (T, n_vq): audio the answer goes on from (continuation mode)."""
    special = special_strings(tokenizer, info)
    check_fields(fields, special)
    if reference_codes is not None:
        if speakers is not None:
            raise InputError("give reference_codes or speakers, not both")
        speakers = [reference_codes]
    voices = [None if c is None else checked_codes(c, info, "reference") for c in (speakers or [])]
    prefix = None if continuation is None else checked_codes(continuation, info, "continuation")
    frames = [None if v is None else int(v.shape[0]) for v in voices]
    prefix_frames = 0 if prefix is None else int(prefix.shape[0])
    text = prompt_text(fields, special, info.n_vq, frames, prefix_frames)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    if prefix is None:
        ids.append(info.audio_start_token_id)
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.full((ids.size, 1 + info.n_vq), info.audio_pad_code, dtype=np.int64)
    rows[:, 0] = ids
    starts = np.flatnonzero(ids == info.audio_start_token_id)
    present = [v for v in voices if v is not None]
    for start, codes in zip(starts, present, strict=False):
        _place(rows, int(start), codes, info, info.audio_user_slot_token_id, closed=True)
    if prefix is not None:
        _place(rows, int(starts[-1]), prefix, info, info.audio_assistant_gen_slot_token_id,
               closed=False)  # fmt: skip
    return Prompt(
        text=text,
        rows=rows,
        reference_frames=int(sum(v.shape[0] for v in present)),
        continuation_frames=prefix_frames,
        continuation_codes=prefix,
        shared_rows=_rows_before_text(tokenizer, text, ids),
    )


def _rows_before_text(tokenizer, text: str, ids: np.ndarray) -> int:
    """How many of the prompt's rows come before the Text field's words (the ids of the
    text up to it, as far as they agree with the whole prompt's: a token may span the mark)."""
    mark = text.find(TEXT_MARK)
    if mark < 0:
        return 0
    head = np.asarray(tokenizer.encode(text[: mark + len(TEXT_MARK)],
                                       add_special_tokens=False).ids, dtype=np.int64)  # fmt: skip
    n = min(head.size, ids.size - 1)  # at least the last row is the text's own
    differ = np.flatnonzero(head[:n] != ids[:n])
    return int(differ[0]) if differ.size else n


def _place(
    rows: np.ndarray, start: int, codes: np.ndarray, info: ModelInfo, slot: int, closed: bool
) -> None:
    """Codes in the delay pattern on the slot rows after the audio-start at START; an open
    span (continuation) holds only the first T delayed rows, as upstream truncates it."""
    frames = codes.shape[0]
    span = frames + info.n_vq - 1 if closed else frames
    block = rows[start + 1 : start + 1 + span, 0]
    whole = block.size == span and np.all(block == slot)
    if closed:
        end = start + 1 + span
        whole = whole and end < rows.shape[0] and rows[end, 0] == info.audio_end_token_id
    if not whole:
        raise InputError(
            "the tokenizer did not keep the audio slot tokens whole",
            hint="tokenizer_dir and the model config belong to different models",
        )
    rows[start + 1 : start + 1 + span, 1:] = apply_delay(codes, info.audio_pad_code)[:span]


def dialogue_text(
    dialogue: str, transcripts: Sequence[str | None] = (), normalize: bool = True
) -> str:
    """The Text field of a MOSS-TTSD prompt, as upstream's TTSD app builds it: the dialogue
    cleaned (`normalize_dialogue`), each cloned speaker's transcript put before it under its
    tag (TRANSCRIPTS: one per speaker in order, None for a speaker without a clip), turns of
    one speaker merged, and the whole cleaned again. The processor's `normalize_text` is the
    caller's, after this."""
    text = dialogue.strip()
    if normalize:
        text = normalize_dialogue(text)
    _check_tags(text)
    prefix = ""
    for number, transcript in enumerate(transcripts, start=1):
        if transcript is None:
            continue
        said, tag = transcript.strip(), f"[S{number}]"
        if not said:
            raise InputError(
                f"the transcript of speaker S{number} is empty",
                hint="give what the reference clip says (--reference-text)",
            )
        prefix += said if said.startswith(tag) else f"{tag} {said}"
    if prefix:
        text = merge_turns(prefix + text)
        if normalize:
            text = normalize_dialogue(text)
        _check_tags(text)
    return text


def _check_tags(text: str) -> None:
    if not SPEAKER_TAG.search(text):
        raise InputError(
            "a MOSS-TTSD dialogue needs speaker tags",
            hint="write each turn after its speaker's tag: [S1] Hello. [S2] Hi!",
        )
