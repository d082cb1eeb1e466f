"""MOSS-TTS-Realtime speaking: the backbone in llama.cpp, the depth transformer in ggml
(realtime/depth.py), the frame loop as upstream's inferencer runs it.

A frame: the row [text id, previous codes] embedded as the sum of the text table's row
(the backbone GGUF's `token_embd`) and each codebook's row (the depth GGUF's `audio_embd.q`),
all of them as stored, pad rows included (upstream sums every table); the backbone's hidden
state for it; the depth transformer's sixteen codes from that. The first frame comes from the
prompt's last row. Speech ends when codebook 1 picks the audio EOS (that frame is not kept),
or at max_new_tokens; before min_new_tokens the EOS is masked. The repetition penalty counts,
per codebook, the codes of the last `repetition_window` frames (none on the first frame).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..errors import InputError
from ..tts.backbone import Backbone, BackboneSettings
from ..tts.sampling import Sampler
from ..verify.tensors import dequantize_rows
from .depth import DepthTransformer
from .feed import TextFeed
from .prompt import PromptIds, lead_rows, prompt_head, text_at


class RowTable:
    """A GGUF table's rows, widened to float32 on demand (the file stays memory-mapped)."""

    def __init__(self, tensor: gguf.ReaderTensor):
        self.kind = tensor.tensor_type.name
        self.rows = int(tensor.shape[1])
        self.data = np.asarray(tensor.data).reshape(self.rows, -1).view(np.uint8)

    def take(self, ids: np.ndarray) -> np.ndarray:
        return dequantize_rows(np.ascontiguousarray(self.data[ids]), self.kind)


def _tensor(reader: gguf.GGUFReader, name: str, path: Path) -> gguf.ReaderTensor:
    found = next((t for t in reader.tensors if t.name == name), None)
    if found is None:
        raise InputError(f"tensor {name!r} is missing", path=path,
                         hint="convert the model again")  # fmt: skip
    return found


@dataclass(frozen=True)
class EngineSettings:
    n_ctx: int = 4096
    n_threads: int = 0
    kv_cache_type: str = "f16"
    flash_attn: str = "auto"  # llama.cpp's CPU flash attention rounds through f16: "disabled"
    # keeps an F32 folder's hidden states within 1e-6 of upstream's float32


class RealtimeEngine:
    """A Realtime folder's GGUFs opened: `frames(...)` yields a text's code frames."""

    def __init__(self, backbone: Path, depth: Path, ids: PromptIds, audio_eos: int,
                 settings: EngineSettings = EngineSettings()):  # fmt: skip
        self.ids, self.audio_eos = ids, audio_eos
        self._head: tuple[bytes, int] | None = None  # the prompt head the backbone holds
        threads = settings.n_threads
        self.backbone = Backbone(backbone, BackboneSettings(
            n_ctx=settings.n_ctx, n_threads=threads, kv_cache_type_k=settings.kv_cache_type,
            kv_cache_type_v=settings.kv_cache_type, flash_attn=settings.flash_attn))  # fmt: skip
        try:
            self.depth = DepthTransformer(depth, ids.rvq, audio_eos, threads=max(1, threads))
            self._text = RowTable(_tensor(gguf.GGUFReader(backbone), "token_embd.weight",
                                          backbone))  # fmt: skip
            reader = gguf.GGUFReader(depth)
            self._audio = [RowTable(_tensor(reader, f"audio_embd.{q}.weight", depth))
                           for q in range(1, ids.rvq + 1)]  # fmt: skip
        except BaseException:
            self.close()
            raise

    def embed(self, rows: np.ndarray) -> np.ndarray:
        """(n, 1 + rvq) rows → (n, hidden) float32: the sum of the 17 tables' rows."""
        out = self._text.take(rows[:, 0]).astype(np.float32)
        for q, table in enumerate(self._audio):
            out += table.take(rows[:, q + 1])
        return out

    def frames(self, text: list[int] | TextFeed, encode, sampler: Sampler, *, lead: int,
               max_frames: int, min_frames: int = 0, window: int = 50,
               reference: np.ndarray | None = None) -> Iterator[np.ndarray | None]:  # fmt: skip
        """Each frame's (rvq,) codes, as made, until the audio EOS or MAX_FRAMES. TEXT is the
        whole text's ids, or a TextFeed still growing: then None is yielded while the text the
        next row needs has not arrived (the prompt waits for LEAD tokens or the input's end,
        each frame for its token), and the caller steps again later."""
        ids = self.ids
        known = _Known(text)
        self._start(prompt_head(encode, ids, reference))  # before the text: it needs none
        while not known.has(lead):
            yield None
        hidden, _ = self.backbone.prefill(self.embed(lead_rows(ids, known.ids, lead)),
                                          logits=False)  # fmt: skip
        history = np.zeros((0, ids.rvq), np.int64)
        seen = np.zeros((ids.rvq, self.depth.vocab), np.float32)
        for n in range(max_frames):
            seen[:] = 0.0
            if n > 0:  # upstream's first frame has no penalty
                recent = history[-window:] if window > 0 else history
                seen[np.arange(ids.rvq)[None, :].repeat(len(recent), 0), recent] = 1.0
            codes = self.depth.frame(hidden, sampler, seen, allow_stop=n >= min_frames)
            if codes[0] == self.audio_eos:
                return
            codes = codes.astype(np.int64)
            history = np.concatenate([history, codes[None]])
            yield codes
            if n + 1 == max_frames:  # no row after the last frame: nothing to wait for
                return
            at = min(lead, len(known.ids)) + n  # the row's text: the lead's next token
            while not known.has(at + 1):
                yield None
            row = np.concatenate([[text_at(known.ids, n + 1, lead, ids.text_pad)], codes])
            hidden, _ = self.backbone.step(self.embed(row[None])[0], logits=False)

    def positions(self, head_rows: int, lead: int, max_frames: int) -> int:
        """The backbone positions a prompt of HEAD_ROWS + LEAD rows and MAX_FRAMES frames
        takes: a row fed back after every frame but the last."""
        return head_rows + lead + max_frames - 1

    @property
    def n_ctx(self) -> int:
        return self.backbone.n_ctx

    def _start(self, head: np.ndarray) -> None:
        """The backbone holding HEAD's rows and nothing after: kept from the last prompt when
        it began the same way, else filled now."""
        key = head.tobytes()
        if self._head is not None and self._head[0] == key:
            self.backbone.keep(len(head))
            return
        self._head = None
        self.backbone.reset()
        self.backbone.fill(self.embed(head))
        self._head = (key, len(head))

    def close(self) -> None:
        for part in ("depth", "backbone"):
            if getattr(self, part, None) is not None:
                getattr(self, part).close()
            setattr(self, part, None)


class _Known:
    """The text's ids known so far: all of a list, a feed's stable ones."""

    def __init__(self, text: list[int] | TextFeed):
        self.text = text
        self.ids = list(text) if isinstance(text, list) else text.ids

    def has(self, count: int) -> bool:
        """Whether the first COUNT ids are known, or no more will come (the text ended)."""
        if isinstance(self.text, list):
            return True
        ended = self.text.ended
        self.ids = self.text.ids  # read after `ended`: an end seen means every id is here
        return ended or len(self.ids) >= count
