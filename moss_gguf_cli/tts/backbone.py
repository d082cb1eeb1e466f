"""The Qwen3 backbone in llama.cpp, fed embeddings, through llama-cpp-python's low-level API.

One context, batch 1, KV cache cleared per utterance. Input rows are summed
embeddings (`llama_batch_init(n, n_embd, 1)`, `batch.embd`); the outputs are the
final-norm hidden state (`llama_get_embeddings_ith`) and the text logits of the
GGUF's `output` head (`llama_get_logits_ith`).

A context created with ``embeddings = True`` outputs *every* row of a batch
(llama.cpp overrides the per-row output flags). The prompt is fed as upstream's
backend feeds it, so that the hidden state and logits of its last row are
bit-for-bit upstream's: chunks of n_batch rows from row 0, the final chunk (the
one holding the last row) decoded with embeddings on — all its rows are output,
and the last layer then runs on all of them, which is what fixes the bits. The
chunks before it only fill the KV cache (embeddings off, no row flagged: nothing
is materialised; their K/V do not depend on the output rows). Decoding the last
row on its own instead changes its bits (other matmul kernels: K-quant repacked
gemm vs gemv), and a near-tie in greedy decoding then flips a code.
Generation steps are single rows, embeddings on.

The text head (`output`, 155,648 rows on the real model: 0.5 GB in Q6_K, more than two of the
36 layers) is the last node of llama.cpp's graph, after `result_norm`, the hidden state. A
step that does not sample from the whole vocabulary does not need it (delay/text_head.py gives
the few logits it needs from the hidden state), so every call takes ``logits``: when False,
the graph's eval callback (`cb_eval`) stops the computation once `result_norm` is done —
ggml's scheduler computes the nodes up to the one the callback asked for and ends the graph
when the callback answers False (ggml-backend.cpp, `ggml_backend_sched_compute_splits`); the
KV cache, written by the layers before, is complete, and the logits llama.cpp copies out are
then stale and not returned.

Several utterances at once (`n_seq` > 1, serve's --max-batch): one KV sequence each, in
separate KV streams (`kv_unified` off), so a sequence's cache cells, and with them the order
its attention sums in, do not depend on the others; each of n_ctx positions. `step_many`
decodes one row per sequence in one llama_batch, always `n_seq` rows wide (idle sequences get
a throw-away row, removed after): llama.cpp picks its matmul kernels by the batch's width
(vector kernels for 1 row, tiled ones for more), so a fixed width keeps a sequence's bits
independent of how many others are being served; and row i is always sequence i, because a
batch whose sequences come out of order gets other bits too.

llama.cpp's log lines go to this module's logger at DEBUG level (shown with
``--verbose``); its recent error lines are kept to explain a failure.
"""

from __future__ import annotations

import collections
import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import InputError, ToolError, UsageError
from ..native import libggml, libllama
from ..native.cpu_features import physical_cores

log = logging.getLogger(__name__)

# llama.cpp's KV cache types by name → ggml type id (cparams.type_k / type_v)
KV_TYPES = {
    name: int(GGMLQuantizationType[name.upper()])
    for name in ("f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "bf16")
}
FLASH_ATTN_TYPES = {"auto": -1, "disabled": 0, "enabled": 1}


def _llama():
    try:
        llama_cpp = libllama.bindings()
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything
        raise ToolError(
            f"llama-cpp-python does not import: {exc}",
            hint="pip install llama-cpp-python (a CPU or CUDA build)",
        ) from exc
    return llama_cpp


# ---------------------------------------------------------------- llama.cpp log routing

_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_pending: list[str] = []
_routed: list[object] = []  # the hook native.libllama installed for us, once


def _route_logs() -> None:
    """llama.cpp's log to our logger (DEBUG), instead of its default stderr chatter."""
    if _routed:
        return
    _llama()
    llama_log = logging.getLogger(__name__ + ".llama")

    def on_log(level: int, text: bytes) -> None:
        piece = text.decode("utf-8", errors="replace") if text else ""
        _pending.append(piece)
        if not piece.endswith("\n"):
            return  # continued on the next call
        line = "".join(_pending).rstrip()
        _pending.clear()
        if level == 3:  # GGML_LOG_LEVEL_ERROR
            _recent_errors.append(line)
        if line:
            llama_log.debug("%s", line)

    _routed.append(libllama.route_log(on_log))


# the names the hidden state's node has in llama.cpp's graph: `result_norm`, renamed
# `result_embd_pooled` by the pooling step when the context outputs embeddings unpooled
HIDDEN_NODES = (b"result_norm", b"result_embd_pooled")


def _node_name(tensor: int) -> bytes:
    return libggml.load().base.ggml_get_name(tensor) or b""


def _last_error() -> str:
    return _recent_errors[-1].strip() if _recent_errors else "no detail from llama.cpp"


# ---------------------------------------------------------------- backbone


@dataclass(frozen=True)
class BackboneSettings:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0  # 0: the physical cores
    n_threads_batch: int | None = None  # a prompt's rows (None: n_threads)
    n_gpu_layers: int = -1
    kv_cache_type_k: str = "f16"
    kv_cache_type_v: str = "f16"
    flash_attn: str = "auto"
    n_seq: int = 1  # sequences decoded together, each with n_ctx positions
    # llama.cpp's repacked CPU weights ("extra buffer types": Q4_K interleaved 8 rows at a
    # time on AVX2): faster n-row kernels, but a row's bits then depend on the batch width
    repack: bool = True
    use_mmap: bool = True  # False: the weights are read into memory (the file may then go)
    # stop the graph at the hidden state when no logits are wanted (ggml's eval callback: a
    # Python call per graph node); False for a model whose head costs less than those calls
    skip_head: bool = True


class Backbone:
    """Embeddings in, (final-norm hidden state, text logits) of the last row out."""

    def __init__(self, gguf: Path, settings: BackboneSettings | None = None):
        settings = settings or BackboneSettings()
        gguf = self.gguf = Path(gguf)
        if not gguf.is_file():
            raise InputError("backbone GGUF not found", path=gguf, hint="check backbone_gguf")
        for key in ("kv_cache_type_k", "kv_cache_type_v"):
            if getattr(settings, key) not in KV_TYPES:
                raise UsageError(f"{key} must be one of {', '.join(KV_TYPES)}")
        if settings.flash_attn not in FLASH_ATTN_TYPES:
            raise UsageError(f"flash_attn must be one of {', '.join(FLASH_ATTN_TYPES)}")
        lc = _llama()
        _route_logs()
        lc.llama_backend_init()
        self._lc = lc
        self.settings = settings
        self._model = None
        self._ctx = None
        self._batch = None
        self._adapters: tuple[tuple[int, float], ...] = ()  # the LoRA set applied (addresses)

        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers
        mparams.use_extra_bufts = settings.repack
        mparams.use_mmap = settings.use_mmap
        self._model = lc.llama_model_load_from_file(str(gguf).encode(), mparams)
        if not self._model:
            raise InputError(
                f"llama.cpp cannot load the backbone: {_last_error()}",
                path=gguf,
                hint="is it a complete qwen3 GGUF? rerun convert",
            )
        try:
            self._open_context(settings)
        except BaseException:
            self.close()
            raise

    def _open_context(self, settings: BackboneSettings) -> None:
        lc = self._lc
        threads = settings.n_threads or physical_cores()
        self.n_embd = int(lc.llama_model_n_embd(self._model))
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self._model)))
        cparams = lc.llama_context_default_params()
        n_seq = max(1, settings.n_seq)
        cparams.n_ctx = settings.n_ctx * n_seq
        cparams.n_batch = max(settings.n_batch, n_seq)
        cparams.n_ubatch = max(settings.n_batch, n_seq)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = False
        cparams.n_threads = threads
        cparams.n_threads_batch = (threads if settings.n_threads_batch is None else
                                   settings.n_threads_batch or physical_cores())  # fmt: skip
        cparams.embeddings = True
        cparams.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
        cparams.type_k = KV_TYPES[settings.kv_cache_type_k]
        cparams.type_v = KV_TYPES[settings.kv_cache_type_v]
        cparams.flash_attn_type = FLASH_ATTN_TYPES[settings.flash_attn]
        cparams.no_perf = True
        self._full_logits = True  # what the next decode computes (see `_on_node`)
        self.head_skipped = False  # whether the last decode stopped before the text head
        if settings.skip_head:
            self._eval_hook = lc.ggml_backend_sched_eval_callback(self._on_node)
            cparams.cb_eval = self._eval_hook
            cparams.cb_eval_user_data = None
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise ToolError(
                f"llama.cpp cannot create a context: {_last_error()}",
                hint="lower n_ctx, or use f16 KV caches (quantized V needs flash_attn)",
            )
        # llama.cpp may round the context up; the configured size is the limit we keep
        self.n_seq = n_seq
        self.n_ctx = min(settings.n_ctx, int(lc.llama_n_ctx(self._ctx)) // n_seq)
        self.n_batch = int(lc.llama_n_batch(self._ctx))
        self._memory = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(self.n_batch, self.n_embd, 1)
        b = self._batch
        self._embd = np.ctypeslib.as_array(b.embd, shape=(self.n_batch, self.n_embd))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._flags = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        self._hidden = np.empty(self.n_embd, dtype=np.float32)
        self._logits = np.empty(self.n_vocab, dtype=np.float32)
        self._hidden_rows = np.empty((n_seq, self.n_embd), dtype=np.float32)
        self._logit_rows = np.empty((n_seq, self.n_vocab), dtype=np.float32)
        self._past = np.zeros(n_seq, dtype=np.int64)  # positions filled, per sequence
        self.width = 1  # the rows of the last step_many
        self._embeddings_on = True

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        """ggml's eval callback: asked for each node whether we want it (only the hidden
        state, and only when the text head is not wanted); told when it is computed, our
        False ends the graph there."""
        if ask:
            return not self._full_logits and _node_name(tensor) in HIDDEN_NODES
        self.head_skipped = not self._full_logits
        return self._full_logits

    # -- state

    @property
    def n_past(self) -> int:
        return int(self._past[0])

    def reset(self, seq: int | None = None) -> None:
        """Forget the previous utterance of SEQ (of every sequence if None)."""
        if seq is None:
            self._lc.llama_memory_clear(self._memory, True)
            self._past[:] = 0
        else:
            self._lc.llama_memory_seq_rm(self._memory, seq, -1, -1)
            self._past[seq] = 0

    def keep(self, rows: int, seq: int = 0) -> None:
        """SEQ's first ROWS positions kept, the rest forgotten: a prompt's beginning that the
        next prompt shares is filled once and kept (MOSS-TTS-Realtime's system turn)."""
        if rows > self._past[seq]:
            raise ValueError(f"sequence {seq} holds {int(self._past[seq])} rows, not {rows}")
        self._lc.llama_memory_seq_rm(self._memory, seq, rows, -1)
        self._past[seq] = rows

    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            self._lc.llama_set_embeddings(self._ctx, on)
            self._embeddings_on = on

    def _decode(self, rows: np.ndarray, want_output: bool, seq: int = 0,
                logits: bool = True) -> None:  # fmt: skip
        n = rows.shape[0]
        past = int(self._past[seq])
        if past + n > self.n_ctx:
            raise InputError(
                f"the sequence needs {past + n} positions but n_ctx is {self.n_ctx}",
                hint="raise n_ctx in the config, or shorten the text / reference",
            )
        self._embd[:n] = rows
        self._pos[:n] = np.arange(past, past + n, dtype=np.int32)
        for i in range(n):
            self._batch.seq_id[i][0] = seq
        self._flags[:n] = 0
        if want_output:
            self._flags[n - 1] = 1
        self._set_embeddings(want_output)
        self._run(n, logits and want_output)
        self._past[seq] += n

    def _run(self, n: int, logits: bool) -> None:
        self._batch.n_tokens = n
        self._full_logits = logits
        self.head_skipped = False
        rc = self._lc.llama_decode(self._ctx, self._batch)
        if rc != 0:
            why = "no free KV-cache slot" if rc == 1 else _last_error()
            raise ToolError(f"llama_decode failed ({rc}): {why}", hint="raise n_ctx or n_batch")

    def _outputs(self, want_logits: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        lc = self._lc
        emb = lc.llama_get_embeddings_ith(self._ctx, -1)
        logits = lc.llama_get_logits_ith(self._ctx, -1)
        if not emb or not logits:
            raise ToolError(f"llama.cpp returned no output row: {_last_error()}")
        # copies (0.6 MB on the real vocab, tens of µs): llama.cpp's buffers move on the
        # next decode and vanish with the context
        self._hidden[:] = np.ctypeslib.as_array(emb, shape=(self.n_embd,))
        if not want_logits:
            return self._hidden, None
        self._logits[:] = np.ctypeslib.as_array(logits, shape=(self.n_vocab,))
        return self._hidden, self._logits

    # -- work

    def prefill(self, embeds: np.ndarray, seq: int = 0,
                logits: bool = True) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """Feed the prompt's (S, n_embd) rows; the outputs of its last row (its text logits
        None unless LOGITS: the text head is then not run, on any row of the final chunk).

        The returned arrays are reused (overwritten) by the next call."""
        embeds = np.asarray(embeds, dtype=np.float32)
        if embeds.ndim != 2 or embeds.shape[1] != self.n_embd or embeds.shape[0] == 0:
            raise InputError(
                f"prompt embeddings have shape {embeds.shape}, need (S, {self.n_embd})"
            )
        self._check_room(embeds.shape[0], seq)
        last = (embeds.shape[0] - 1) // self.n_batch * self.n_batch  # final chunk's start
        for start in range(0, last, self.n_batch):
            self._decode(embeds[start : start + self.n_batch], want_output=False, seq=seq)
        # every row of the final chunk is output
        self._decode(embeds[last:], want_output=True, seq=seq, logits=logits)
        self.width = embeds.shape[0] - last
        return self._outputs(logits)

    def _check_room(self, rows: int, seq: int) -> None:
        if self._past[seq] + rows > self.n_ctx:
            raise InputError(f"the prompt is {rows} rows but n_ctx is {self.n_ctx}",
                             hint="raise n_ctx in the config, or shorten the text / reference")

    def fill(self, embeds: np.ndarray, seq: int = 0) -> None:
        """Feed rows into SEQ's KV cache and output nothing: a prompt's shared beginning
        (`save`/`load` keep it for the others that begin the same way). A prompt fed as
        `fill` then `prefill` is batched otherwise than one `prefill` of it whole, so its
        bits may differ from upstream's: for chunks 2..n only (delay/speech.py)."""
        embeds = np.asarray(embeds, dtype=np.float32)
        self._check_room(embeds.shape[0], seq)
        for start in range(0, embeds.shape[0], self.n_batch):
            self._decode(embeds[start : start + self.n_batch], want_output=False, seq=seq)

    def save(self, seq: int) -> ctypes.Array:
        """SEQ's KV cache as llama.cpp serialises a sequence (`llama_state_seq_get_data`)."""
        lc = self._lc
        size = lc.llama_state_seq_get_size(self._ctx, seq)
        state = (ctypes.c_uint8 * size)()
        got = lc.llama_state_seq_get_data(self._ctx, state, size, seq)
        if got != size:
            raise ToolError(f"llama.cpp saved {got} of {size} bytes of a sequence")
        return state

    def load(self, seq: int, state: ctypes.Array, rows: int) -> None:
        """SEQ's KV cache (cleared first) from `save`'s STATE, which holds ROWS rows."""
        self.reset(seq)
        if self._lc.llama_state_seq_set_data(self._ctx, state, len(state), seq) == 0:
            raise ToolError(f"llama.cpp could not restore a sequence: {_last_error()}",
                            hint="raise n_ctx")  # fmt: skip
        self._past[seq] = rows

    def step(self, embed: np.ndarray, logits: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """Feed one (n_embd,) row; its hidden state and text logits (None unless LOGITS;
        reused buffers)."""
        self._decode(embed.reshape(1, -1), want_output=True, logits=logits)
        self.width = 1
        return self._outputs(logits)

    def step_many(self, embeds: np.ndarray, seqs: list[int], logits: bool = True,
                  fixed: bool = True,
                  min_width: int = 1) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """One row per sequence of SEQS (distinct), decoded together: n_seq rows wide when
        FIXED, else as many rows as SEQS but at least MIN_WIDTH (idle sequences' throw-away
        rows); the (len(seqs), n_embd) hidden states and (len(seqs), n_vocab) logits (None
        unless LOGITS; reused buffers). `width` is then the rows the batch had."""
        n = len(seqs)
        if self.n_seq == 1:  # the single-sequence path of `step`, bit for bit
            self.width = 1
            hidden, text = self.step(embeds[0], logits)
            self._hidden_rows[0] = hidden
            if text is None:
                return self._hidden_rows[:1], None
            self._logit_rows[0] = text
            return self._hidden_rows[:1], self._logit_rows[:1]
        if np.any(self._past[list(seqs)] + 1 > self.n_ctx):
            raise InputError(f"a sequence needs more than n_ctx {self.n_ctx} positions",
                             hint="raise n_ctx in the config")  # fmt: skip
        # row j holds sequence order[j], in ascending order: llama.cpp gives other bits for
        # the rows of a batch whose sequences come out of order (measured on the real dims:
        # up to 0.04 in the hidden state); FIXED: row i is sequence i, always, idle ones
        # with a throw-away row, so the order never depends on who is being served
        idle = [s for s in range(self.n_seq) if s not in seqs]
        pad = idle[: max(0, min(min_width, self.n_seq) - len(seqs))]
        order = list(range(self.n_seq)) if fixed else sorted([*seqs, *pad])
        where = {seq: j for j, seq in enumerate(order)}
        width = self.width = len(order)
        self._embd[:width] = 0.0  # throw-away rows of idle sequences
        self._embd[[where[s] for s in seqs]] = embeds
        for j, seq in enumerate(order):
            self._batch.seq_id[j][0] = seq
            self._pos[j] = self._past[seq]
        self._flags[:width] = 1
        self._set_embeddings(True)
        self._run(width, logits)
        lc = self._lc
        for i, seq in enumerate(seqs):
            emb = lc.llama_get_embeddings_ith(self._ctx, where[seq])
            if not emb:
                raise ToolError(f"llama.cpp returned no output row: {_last_error()}")
            self._hidden_rows[i] = np.ctypeslib.as_array(emb, shape=(self.n_embd,))
            if logits:
                text = lc.llama_get_logits_ith(self._ctx, where[seq])
                self._logit_rows[i] = np.ctypeslib.as_array(text, shape=(self.n_vocab,))
        for seq in set(order) - set(seqs):  # the throw-away rows leave nothing behind
            lc.llama_memory_seq_rm(self._memory, seq, int(self._past[seq]), -1)
        self._past[list(seqs)] += 1
        return self._hidden_rows[:n], (self._logit_rows[:n] if logits else None)

    def hidden_states(self, embeds: np.ndarray) -> np.ndarray:
        """Final-norm hidden states of every row (S, n_embd), from an empty cache (for checks)."""
        self.reset()
        embeds = np.asarray(embeds, dtype=np.float32)
        out = np.empty_like(embeds)
        for start in range(0, embeds.shape[0], self.n_batch):
            chunk = embeds[start : start + self.n_batch]
            self._decode(chunk, want_output=True, logits=False)  # every row is output
            for i in range(chunk.shape[0]):
                ptr = self._lc.llama_get_embeddings_ith(self._ctx, i)
                out[start + i] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        self.reset()
        return out

    def load_adapter(self, path: Path) -> object:
        """llama.cpp's handle of the LoRA adapter GGUF at PATH (tts/lora.py checked it);
        llama.cpp frees it with the model."""
        handle = self._lc.llama_adapter_lora_init(self._model, str(path).encode())
        if not handle:
            raise InputError(f"llama.cpp cannot load the adapter: {_last_error()}", path=path,
                             hint="was it converted for this model? moss-gguf convert "
                             "ADAPTER --format lora --base MODEL")  # fmt: skip
        return handle

    def use_adapters(self, adapters: list[tuple[object, float]]) -> bool:
        """Every later decode applies ADAPTERS ((handle, scale); scale 0: left out); whether
        the set changed. The KV cache written under another set is the caller's to drop."""
        chosen = [(h, float(s)) for h, s in adapters if s != 0]
        key = tuple((ctypes.cast(h, ctypes.c_void_p).value or 0, s) for h, s in chosen)
        if key == self._adapters:
            return False
        lc, n = self._lc, len(chosen)
        handles = (lc.llama_adapter_lora_p_ctypes * n)(*(h for h, _ in chosen)) if n else None
        scales = (ctypes.c_float * n)(*(s for _, s in chosen)) if n else None
        lc.llama_set_adapters_lora(self._ctx, handles, n, scales)
        self._adapters = key
        return True

    def close(self) -> None:
        lc = self._lc
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Backbone:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
