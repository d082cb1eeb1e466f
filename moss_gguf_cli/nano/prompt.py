"""What MOSS-TTS-Nano is given to speak: its text tokenizer, the prompt's rows, and a long text
split into chunks, each as upstream's runtime makes them (docs/nano.md "How it speaks").

The tokenizer is the release's SentencePiece model, run by the `sentencepiece` package
(upstream encodes every piece with it, no special tokens added). A prompt is a chat turn whose
fields other than the text are the literal `None`; the control tokens go in by id, never
through the tokenizer:

    with a reference clip ("voice clone"): <im_start> "user\\n" "<user_inst>\\n- Reference(s):\\n"
        <audio_start> [one row per reference frame: user slot + its 16 codes] <audio_end>
        "\\n- Instruction:\\nNone\\n…- Text:\\n" TEXT "\\n</user_inst>" <im_end> "\\n"
        <im_start> "assistant\\n" <audio_start>
    without one ("continuation", voice "default"): the same turn with the literal "None"
        where the reference block was, and no audio rows.

Each row is n_vq + 1 ids: the text id, then one code per codebook (the pad code outside a
reference block). A long text is split as upstream's Nano runtime splits it (sentences, then
clauses, then a token budget: at most 75 text tokens a chunk); a text that stays whole is
spoken as given, and the chunks are joined with upstream's pauses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

ROLE_USER = "user\n"
REFERENCE_HEAD = "<user_inst>\n- Reference(s):\n"
AFTER_REFERENCE = (
    "\n- Instruction:\nNone\n- Tokens:\nNone\n- Quality:\nNone\n- Sound Event:\nNone\n"
    "- Ambient Sound:\nNone\n- Language:\nNone\n- Text:\n"
)
INST_END = "\n</user_inst>"
TURN_END = "\n"
ROLE_ASSISTANT = "assistant\n"
NO_REFERENCE = "None"

MAX_CHUNK_TOKENS = 75  # upstream's runtime default (voice_clone_max_text_tokens)
PAUSE_SHORT_S, PAUSE_LONG_S = 0.40, 0.24  # after a chunk of at most 4 words / a longer one
SENTENCE_END = frozenset(".!?。！？；;")
CLAUSE_END = frozenset(",，、；;：:")
CLOSERS = frozenset("\"'”’)]}）】》」』")


class NanoTokenizer:
    """The release's tokenizer.model."""

    def __init__(self, path: Path):
        import sentencepiece as spm  # a core dependency; the CLI names a broken install

        path = Path(path)
        if not path.is_file():
            raise InputError("the Nano tokenizer is missing", path=path,
                             hint="rerun `moss-gguf all` on the model")  # fmt: skip
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except (OSError, RuntimeError) as exc:
            raise InputError(f"not a SentencePiece model ({exc})", path=path,
                             hint="rerun `moss-gguf all` on the model") from None  # fmt: skip
        self.path = path

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._sp.encode(text, out_type=int)]

    def count(self, text: str) -> int:
        return len(self._sp.encode(text, out_type=int))

    def pieces(self) -> int:
        """How many ids it can give (each must have a row in the text table)."""
        return int(self._sp.GetPieceSize())


@dataclass(frozen=True)
class PromptIds:
    """A prompt's text ids around where the reference rows go (none: continuation)."""

    before: list[int]  # up to and including <audio_start> (reference) / the whole turn
    after: list[int]  # from <audio_end> to the final <audio_start>; empty without a reference
    # how many of the text ids come before TEXT's own: with a reference, counted in `after`;
    # without, in `before`. Every prompt of one voice begins alike up to there.
    text_at: int = 0

    def rows(self, reference_frames: int) -> int:
        """How many rows `prompt_rows` makes of these ids with REFERENCE_FRAMES (0: none),
        counted without making them (a request's length check)."""
        return len(self.before) + (reference_frames + len(self.after) if self.after else 0)

    def shared_rows(self, reference_frames: int) -> int:
        """The rows every prompt of this voice shares: all up to the text's first."""
        if self.after:
            return len(self.before) + reference_frames + self.text_at
        return self.text_at


def prompt_ids(tok: NanoTokenizer, tokens: dict[str, int], text: str,
               reference: bool) -> PromptIds:  # fmt: skip
    """The text ids of TEXT's prompt; TOKENS: the config's control token ids by key."""
    im_start, im_end = tokens["im_start_token_id"], tokens["im_end_token_id"]
    start, end = tokens["audio_start_token_id"], tokens["audio_end_token_id"]
    head = [im_start, *tok.encode(ROLE_USER), *tok.encode(REFERENCE_HEAD)]
    tail = [*tok.encode(INST_END), im_end, *tok.encode(TURN_END), im_start,
            *tok.encode(ROLE_ASSISTANT), start]  # fmt: skip
    fields = tok.encode(AFTER_REFERENCE)
    body = [*fields, *tok.encode(text)]
    if reference:
        return PromptIds([*head, start], [end, *body, *tail], 1 + len(fields))
    lead = [*head, *tok.encode(NO_REFERENCE)]
    return PromptIds([*lead, *body, *tail], [], len(lead) + len(fields))


def prompt_rows(ids: PromptIds, reference: np.ndarray | None, tokens: dict[str, int],
                n_vq: int, pad: int) -> np.ndarray:  # fmt: skip
    """The (S, n_vq + 1) int64 rows: text rows (codes padded) and, with REFERENCE (F, n_vq)
    codes, one user-slot row per reference frame between `before` and `after`."""
    def text_rows(values: list[int]) -> np.ndarray:
        rows = np.full((len(values), n_vq + 1), pad, dtype=np.int64)
        rows[:, 0] = values
        return rows

    parts = [text_rows(ids.before)]
    if reference is not None:
        codes = np.asarray(reference, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[1] != n_vq:
            raise InputError(f"reference codes have shape {codes.shape}, need (frames, {n_vq})")
        audio = np.empty((codes.shape[0], n_vq + 1), dtype=np.int64)
        audio[:, 0] = tokens["audio_user_slot_token_id"]
        audio[:, 1:] = codes
        parts += [audio, text_rows(ids.after)]
    return np.concatenate(parts)


# ---------------------------------------------------------------- long text


def _has_cjk(text: str) -> bool:
    return any("\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf" or "\u3040" <= c <= "\u30ff"
               or "\uac00" <= c <= "\ud7af" for c in text)  # fmt: skip


def _prepared(text: str) -> str:
    """The text as upstream prepares it for splitting: one line, single spaces, an ending
    mark; a short Latin text is capitalised and led by eight spaces."""
    text = text.strip().replace("\n", " ").replace("\r", " ")
    while "  " in text:
        text = text.replace("  ", " ")
    if _has_cjk(text):
        return text if text[-1] in SENTENCE_END else text + "。"
    text = text[0].upper() + text[1:]
    if text[-1].isalnum():
        text += "."
    return " " * 8 + text if len(text.split()) < 5 else text


def _split_at(text: str, marks: frozenset[str]) -> list[str]:
    """TEXT cut after each mark (and the closing quotes or brackets that follow it)."""
    pieces, start, i = [], 0, 0
    while i < len(text):
        if text[i] in marks:
            j = i + 1
            while j < len(text) and text[j] in CLOSERS:
                j += 1
            if piece := text[start:j].strip():
                pieces.append(piece)
            while j < len(text) and text[j].isspace():
                j += 1
            start = i = j
            continue
        i += 1
    if tail := text[start:].strip():
        pieces.append(tail)
    return pieces


def _split_by_budget(tok: NanoTokenizer, text: str, budget: int) -> list[str]:
    """The longest prefix within BUDGET tokens (binary search), moved back to a space or mark
    within its last 24 characters, again and again."""
    pieces, rest = [], text.strip()
    boundaries = CLAUSE_END | SENTENCE_END | {" "}
    while rest:
        if tok.count(rest) <= budget:
            pieces.append(rest)
            break
        low, high, best = 1, len(rest), 1
        while low <= high:
            mid = (low + high) // 2
            candidate = rest[:mid].strip()
            if candidate and tok.count(candidate) > budget:
                high = mid - 1
            else:
                best, low = (mid if candidate else best), mid + 1
        cut = best
        for k in range(best - 1, max(-1, best - 25), -1):
            if rest[k] in boundaries:
                cut = k + 1
                break
        piece = rest[:cut].strip()
        if not piece:
            piece, cut = rest[:best].strip(), best
        pieces.append(piece)
        rest = rest[cut:].strip()
    return pieces


def _join(left: str, right: str) -> str:
    if not left or not right:
        return left or right
    return left + right if _has_cjk(left) or _has_cjk(right) else f"{left} {right}"


def split_text(tok: NanoTokenizer, text: str, budget: int = MAX_CHUNK_TOKENS) -> list[str]:
    """TEXT as upstream's Nano runtime speaks it: whole (stripped) when it fits one chunk,
    else sentences, clauses or budget-cut pieces packed greedily into chunks of at most
    BUDGET tokens."""
    text = str(text).strip()
    if not text:
        raise InputError("there is no text to speak", hint="give a non-empty text")
    if budget <= 0:
        return [text]
    prepared = _prepared(text)
    slices: list[tuple[int, str]] = []
    for sentence in _split_at(prepared, SENTENCE_END) or [prepared.strip()]:
        n = tok.count(sentence)
        if n <= budget:
            slices.append((n, sentence))
            continue
        clauses = _split_at(sentence, CLAUSE_END)
        for clause in clauses if len(clauses) > 1 else [sentence]:
            n = tok.count(clause)
            if n <= budget:
                slices.append((n, clause))
            else:
                slices += [(tok.count(p), p) for p in _split_by_budget(tok, clause, budget)]
    chunks, current, size = [], "", 0
    for n, piece in slices:
        if not current:
            current, size = piece, n
        elif size + n > budget:
            chunks.append(current.strip())
            current, size = piece, n
        else:
            current = _join(current, piece)
            size = tok.count(current)
    if current:
        chunks.append(current.strip())
    chunks = [c for c in chunks if c]
    return chunks if len(chunks) > 1 else [text]


def pause_after(chunk: str) -> float:
    """Seconds of silence after CHUNK when another follows (upstream's two lengths)."""
    return PAUSE_SHORT_S if len(chunk.strip().split()) <= 4 else PAUSE_LONG_S
