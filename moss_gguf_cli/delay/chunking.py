"""Long text split into chunks a speaker would breathe between, each with its step budget.

    pieces = split_text(normalized, ChunkSettings())      # [Piece(text, gap, frames)]
    budget = step_budget(piece.frames, settings, n_vq)    # steps this chunk may take

The text is the normalised one (delay/normalize.py), split where a reader pauses: before a
speaker tag (``[S1]``), after a sentence end (``。！？!?`` and ``.`` before a space), then after
a clause mark (``，、；：,;:``), then at a space, then between two CJK characters, and only as
the last resort anywhere else; never inside a URL, an e-mail address, a number (``3.14``,
``1,000``, ``12:30``), a dotted word (``v2.3.1``), a ``[pause 1.5s]`` or a speaker tag. Each
piece's text joined with its gap (the spaces dropped at the break) gives the text back:
``"".join(p.text + p.gap for p in pieces) == normalized``.

Length is measured in audio frames, the unit that costs time, by upstream's own estimate
(clis/moss_tts_app.py: 3.098 frames per Chinese character, 0.867 per English one, at
12.5 frames/s): a CJK character counts the Chinese rate, any other character the English
one. A chunk aims at `target_frames` (docs/long-text.md says how it was chosen); the first
is shorter (`first_frames`), since every other chunk waits for its voice and the first
audio of a stream waits for it. A break is taken as late as fits, at the strongest kind of
mark that still leaves the chunk at least `min_share` of the target.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ZH_FRAMES_PER_CHAR = 3.098411951313033  # upstream clis/moss_tts_app.py
EN_FRAMES_PER_CHAR = 0.8673376262755219
FRAMES_PER_SECOND = 12.5

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_CHAR = re.compile(f"[{_CJK}]")
_CLOSERS = r"\"'”’)）」』》】〗\]"
# spans a break never falls inside
_WHOLE = re.compile(
    r"https?://\S+|www\.\S+"  # URLs
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # e-mail
    r"|\[pause\s*[\d.]+\s*s\]"  # [pause 1.5s]
    r"|\[S\d+\]:?"  # speaker tags
    r"|\d+(?:[.,:/]\d+)+"  # 3.14, 1,000, 12:30, 1/2
    r"|\w+(?:[._/+:-]\w+)+",  # v2.3.1, a.js, e-mail-like words
    re.IGNORECASE,
)
# (level, pattern): a break goes at the end of the match (level 0: at its start); lower is
# stronger. ASCII marks need a space (or the end) after them: "3.5" and "e.g.x" stay whole.
_TURN = re.compile(r"\[S\d+\]")
_MARKS = (
    (1, re.compile(f"[。！？!?；;…]+[{_CLOSERS}]*|\\.+[{_CLOSERS}]*(?=\\s|$|[{_CJK}])")),
    (2, re.compile(f"[，、：,:]+[{_CLOSERS}]*(?=\\s|$|[{_CJK}])|[，、：]")),
    (3, re.compile(r"\s+")),
    (4, re.compile(f"(?<=[{_CJK}])(?=[{_CJK}])")),
)
LAST_RESORT = 5


@dataclass(frozen=True)
class ChunkSettings:
    """How long chunks are and how many steps each may take (docs/long-text.md)."""

    target_frames: float = 250.0  # 20 s of speech: ~288 English or ~80 Chinese characters
    first_frames: float = 125.0  # the first chunk: 10 s
    min_share: float = 0.4  # a break at a weaker mark rather than a chunk under 40 % of target
    margin: float = 2.0  # budget: twice the estimate ...
    min_extra_frames: int = 40  # ... and at least 3.2 s more than it


@dataclass(frozen=True)
class Piece:
    """A chunk of the text: `text` as the model gets it, `gap` the spaces after it."""

    text: str
    gap: str
    frames: float  # estimated audio frames


def estimate_frames(text: str) -> float:
    """Upstream's estimate of the audio frames TEXT takes to speak."""
    cjk = len(_CJK_CHAR.findall(text))
    return cjk * ZH_FRAMES_PER_CHAR + (len(text) - cjk) * EN_FRAMES_PER_CHAR


def step_budget(frames: float, settings: ChunkSettings, n_vq: int) -> int:
    """Steps a chunk of FRAMES estimated frames may take: the estimate times the margin (at
    least min_extra_frames more), the n_vq − 1 rows the delay pattern trails by, the end."""
    allowed = max(frames * settings.margin, frames + settings.min_extra_frames)
    return math.ceil(allowed) + n_vq + 1


def split_text(text: str, settings: ChunkSettings | None = None) -> list[Piece]:
    """TEXT in chunks of about settings.target_frames (the first: first_frames)."""
    settings = settings or ChunkSettings()
    cost = _prefix_costs(text)
    breaks = _breaks(text)
    pieces: list[Piece] = []
    start = _skip_space(text, 0)
    lead = text[:start]
    while start < len(text):
        limit = settings.first_frames if not pieces else settings.target_frames
        end = _choose_end(text, start, cost, breaks, limit, settings.min_share)
        stop = end
        while stop > start and text[stop - 1].isspace():
            stop -= 1
        nxt = _skip_space(text, end)
        pieces.append(Piece(text[start:stop], text[stop:nxt], cost[stop] - cost[start]))
        start = nxt
    if lead and pieces:  # leading spaces (normalised text has none) stay before the first
        first = pieces[0]
        pieces[0] = Piece(lead + first.text, first.gap, first.frames)
    return pieces


def split_further(piece: Piece, pieces: int) -> list[Piece]:
    """PIECE in about PIECES equal parts at the strongest marks (a prompt too long for
    n_ctx): the parts with their gaps join back into piece.text + piece.gap."""
    target = max(piece.frames / max(pieces, 2), EN_FRAMES_PER_CHAR)
    settings = ChunkSettings(target_frames=target, first_frames=target)
    parts = split_text(piece.text, settings)
    if len(parts) < 2:
        return [piece]
    last = parts[-1]
    parts[-1] = Piece(last.text, last.gap + piece.gap, last.frames)
    return parts


# -- inside


def _prefix_costs(text: str) -> list[float]:
    out = [0.0]
    for ch in text:
        rate = ZH_FRAMES_PER_CHAR if _CJK_CHAR.match(ch) else EN_FRAMES_PER_CHAR
        out.append(out[-1] + rate)
    return out


def _breaks(text: str) -> dict[int, int]:
    """Position → the strongest kind of break there (positions inside a whole span left out)."""
    inside = bytearray(len(text) + 1)
    for m in _WHOLE.finditer(text):
        inside[m.start() + 1 : m.end()] = b"\x01" * (m.end() - m.start() - 1)
    found: dict[int, int] = {}

    def mark(pos: int, level: int) -> None:
        if 0 < pos < len(text) and not inside[pos] and level < found.get(pos, LAST_RESORT):
            found[pos] = level

    for m in _TURN.finditer(text):
        mark(m.start(), 0)
    for level, pattern in _MARKS:
        for m in pattern.finditer(text):
            mark(m.end(), level)
            if level == 3:  # a space: the break may also fall before it
                mark(m.start(), level)
    return found


def _choose_end(text: str, start: int, cost: list[float], breaks: dict[int, int],
                limit: float, min_share: float) -> int:  # fmt: skip
    """Where the chunk starting at START ends."""
    if cost[-1] - cost[start] <= limit:
        return len(text)
    far = start
    while far < len(text) and cost[far + 1] - cost[start] <= limit:
        far += 1
    near = start
    while near < far and cost[near] - cost[start] < limit * min_share:
        near += 1
    for lo in (near, start):  # a long enough chunk first, at the strongest mark there
        for level in range(LAST_RESORT):
            for p in range(far, lo, -1):
                if breaks.get(p, LAST_RESORT) <= level:
                    return p
    whole = [m.span() for m in _WHOLE.finditer(text, start) if m.start() <= far < m.end()]
    if whole and whole[0][0] > start:  # not inside a whole span: before it
        return whole[0][0]
    return max(far, start + 1)  # one span longer than the limit: cut it (n_ctx allows it)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
