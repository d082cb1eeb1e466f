"""MOSS-TTS-Realtime's prompt rows, as upstream's inferencer builds them (moss_tts_realtime/
inferencer.py at 58b20a0: `MossTTSRealtimeProcessor.make_ensemble`, `_build_prefill_batch`).

A row is [text id, code 1, …, code rvq]. The prompt is the system turn, then (cloning a voice)
a context turn whose `<|audio_pad|>` rows carry the reference's codes, then
`<|im_start|>assistant\\n`; every audio cell there is the pad code. After it come the first
TEXT_LEAD tokens of the text (all of it when shorter), the last of them carrying the audio BOS
in codebook 1: the model reads the text that far ahead of the audio. Each generated frame's
row is then the next text token (`<|text_pad|>` once the text is used up) and the frame's codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..disk.confine import boundary, confined
from ..errors import InputError

SYSTEM = ("<|im_start|>system\nYou are a highly expressive text-to-speech (TTS) engine developed "
          "by Mosi Intelligence. \nYou possess natural language understanding, emotional "
          "modeling, and multi-style speech generation capabilities, allowing you to generate "
          "the corresponding speech based on the text given in the assistant.<|im_end|>\n")
VOICE = ("<|im_start|>context\nThe assistant section should be synthesized using the following "
         "voice timbre:{pads}<|im_end|>\n")
ASSISTANT = "<|im_start|>assistant\n"
AUDIO_PAD_TOKEN = "<|audio_pad|>"


class EmptyText(InputError):
    """The text came to nothing once tokenized (a stream-input ended before any word)."""


@dataclass(frozen=True)
class PromptIds:
    """The ids the prompt needs from the config."""

    rvq: int
    audio_pad: int  # the code of an empty cell (1024)
    audio_bos: int  # 1025
    reference_audio_pad: int  # the text id of a reference row (<|audio_pad|>)
    text_pad: int  # the text id once the text is used up (<|text_pad|>)


def text_encoder(folder: Path):
    """The folder's tokenizer.json as a text → ids function (special tokens in the text read
    as theirs, none added: upstream's `tokenizer(text)` on Qwen3's tokenizer)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError("tokenizer.json is missing", path=folder,
                         hint="make the folder again with moss-gguf all")  # fmt: skip
    tok = Tokenizer.from_file(str(confined(path, boundary(folder))))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def prompt_head(encode, ids: PromptIds, reference: np.ndarray | None = None) -> np.ndarray:
    """The prompt's rows before the text: the system turn, the voice turn (REFERENCE: (frames,
    ≥ rvq) codes) and the assistant's opening; the same for every text in that voice, so an
    engine fills it once and keeps it. ENCODE: text → ids, special tokens read as theirs."""
    head = SYSTEM
    if reference is not None:
        head += VOICE.format(pads=AUDIO_PAD_TOKEN * reference.shape[0])
    turn = list(encode(head)) + list(encode(ASSISTANT))
    rows = np.full((len(turn), ids.rvq + 1), ids.audio_pad, np.int64)
    rows[:, 0] = turn
    if reference is not None:
        at = np.flatnonzero(rows[:, 0] == ids.reference_audio_pad)
        if at.size != reference.shape[0]:
            raise InputError(f"the tokenizer made {at.size} {AUDIO_PAD_TOKEN} rows for a "
                             f"{reference.shape[0]}-frame reference",
                             hint="the tokenizer is not the model's")  # fmt: skip
        rows[at[0] : at[-1] + 1, 1:] = reference[:, : ids.rvq]
    return rows


def lead_rows(ids: PromptIds, text_ids: list[int], lead: int) -> np.ndarray:
    """The prompt's last rows: the first LEAD text ids (all, if fewer), the last carrying the
    audio BOS in codebook 1."""
    if not text_ids:
        raise EmptyText("the text is empty after tokenizing", hint="give some text to speak")
    rows = np.full((min(lead, len(text_ids)), ids.rvq + 1), ids.audio_pad, np.int64)
    rows[:, 0] = text_ids[:lead]
    rows[-1, 1] = ids.audio_bos
    return rows


def prompt_rows(encode, ids: PromptIds, text_ids: list[int], lead: int,
                reference: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The whole (rows, 1 + rvq) int64 prompt: `prompt_head`, then `lead_rows`."""
    return np.concatenate([prompt_head(encode, ids, reference), lead_rows(ids, text_ids, lead)])


def text_at(text_ids: list[int], frame: int, lead: int, text_pad: int) -> int:
    """The text id of generated frame FRAME's row (frame 1 is the first row after the
    prompt): the lead's next token, then text_pad."""
    at = min(lead, len(text_ids)) + frame - 1
    return text_ids[at] if at < len(text_ids) else text_pad
