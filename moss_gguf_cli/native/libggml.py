"""The libggml that llama-cpp-python ships, through ctypes: one loader for every user.

Used for ggml's own quantization routines (the code `llama-quantize` runs, from the very
library it links) and for its GGUF context API (the code that writes llama-quantize's
headers), so that what we produce with them is what llama.cpp would produce; and for the
graph API that graphs/ builds its compute graphs on.
ctypes releases the GIL for the length of each call: Python threads quantize in parallel.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import libllama


class GgmlUnavailable(Exception):
    """llama-cpp-python, or the libggml it ships, cannot be used here."""


class _InitParams(ctypes.Structure):  # struct ggml_init_params
    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


class _GgufInitParams(ctypes.Structure):  # struct gguf_init_params
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


InitParams = _InitParams
FloatP = ctypes.POINTER(ctypes.c_float)

_VP, _CP, _SZ, _I64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int64
_I32, _U32, _BOOL = ctypes.c_int, ctypes.c_uint32, ctypes.c_bool
_FP = ctypes.POINTER(ctypes.c_float)

# name: (argtypes, restype); all in libggml-base
_BASE = {
    "ggml_init": ([_InitParams], _VP),
    "ggml_free": ([_VP], None),
    "ggml_reset": ([_VP], None),
    "ggml_new_tensor_2d": ([_VP, _I32, _I64, _I64], _VP),
    "ggml_mul_mat": ([_VP, _VP, _VP], _VP),
    "ggml_new_tensor_1d": ([_VP, _I32, _I64], _VP),
    "ggml_new_tensor_3d": ([_VP, _I32, _I64, _I64, _I64], _VP),
    "ggml_view_3d": ([_VP, _VP, _I64, _I64, _I64, _SZ, _SZ, _SZ], _VP),
    "ggml_reshape_1d": ([_VP, _VP, _I64], _VP),
    "ggml_norm": ([_VP, _VP, ctypes.c_float], _VP),
    "ggml_mul": ([_VP, _VP, _VP], _VP),
    "ggml_add": ([_VP, _VP, _VP], _VP),
    "ggml_gelu": ([_VP, _VP], _VP),
    "ggml_swiglu_split": ([_VP, _VP, _VP], _VP),
    "ggml_cpy": ([_VP, _VP, _VP], _VP),
    "ggml_soft_max_ext": ([_VP, _VP, _VP, ctypes.c_float, ctypes.c_float], _VP),
    "ggml_rope_ext": ([_VP, _VP, _VP, _VP, _I32, _I32, _I32] + [ctypes.c_float] * 6, _VP),
    "ggml_view_1d": ([_VP, _VP, _I64, _SZ], _VP),
    "ggml_view_2d": ([_VP, _VP, _I64, _I64, _SZ, _SZ], _VP),
    "ggml_reshape_2d": ([_VP, _VP, _I64, _I64], _VP),
    "ggml_cont_2d": ([_VP, _VP, _I64, _I64], _VP),
    "ggml_permute": ([_VP, _VP, _I32, _I32, _I32, _I32], _VP),
    "ggml_set_rows": ([_VP, _VP, _VP, _VP], _VP),
    "ggml_get_rows": ([_VP, _VP, _VP], _VP),
    "ggml_top_k": ([_VP, _VP, _I32], _VP),
    "ggml_argsort": ([_VP, _VP, _I32], _VP),
    "ggml_argmax": ([_VP, _VP], _VP),
    "ggml_cumsum": ([_VP, _VP], _VP),
    "ggml_step": ([_VP, _VP], _VP),
    "ggml_relu": ([_VP, _VP], _VP),
    "ggml_sum": ([_VP, _VP], _VP),
    "ggml_sub": ([_VP, _VP, _VP], _VP),
    "ggml_scale": ([_VP, _VP, ctypes.c_float], _VP),
    "ggml_scale_bias": ([_VP, _VP, ctypes.c_float, ctypes.c_float], _VP),
    "ggml_clamp": ([_VP, _VP, ctypes.c_float, ctypes.c_float], _VP),
    "ggml_cast": ([_VP, _VP, _I32], _VP),
    "ggml_nelements": ([_VP], _I64),
    "ggml_backend_cpu_buffer_from_ptr": ([_VP, _SZ], _VP),
    "ggml_backend_tensor_alloc": ([_VP, _VP, _VP], _I32),
    "ggml_backend_buffer_free": ([_VP], None),
    "ggml_set_input": ([_VP], None),
    "ggml_set_output": ([_VP], None),
    "ggml_nbytes": ([_VP], _SZ),
    "ggml_backend_cpu_buffer_type": ([], _VP),
    "ggml_gallocr_new": ([_VP], _VP),
    "ggml_gallocr_free": ([_VP], None),
    "ggml_gallocr_alloc_graph": ([_VP, _VP], _BOOL),
    "ggml_backend_graph_compute": ([_VP, _VP], _I32),
    "ggml_backend_free": ([_VP], None),
    "ggml_new_graph_custom": ([_VP, _SZ, _BOOL], _VP),
    "ggml_graph_overhead_custom": ([_SZ, _BOOL], _SZ),
    "ggml_new_graph": ([_VP], _VP),
    "ggml_build_forward_expand": ([_VP, _VP], None),
    "ggml_get_data": ([_VP], _VP),
    "ggml_graph_overhead": ([], _SZ),
    "ggml_tensor_overhead": ([], _SZ),
    "ggml_get_tensor": ([_VP, _CP], _VP),
    "ggml_get_name": ([_VP], _CP),
    "ggml_set_name": ([_VP, _CP], _VP),
    "ggml_n_dims": ([_VP], _I32),
    "ggml_op_desc": ([_VP], _CP),
    "ggml_type_name": ([_I32], _CP),
    "ggml_type_size": ([_I32], _SZ),
    "ggml_blck_size": ([_I32], _I64),
    "ggml_graph_n_nodes": ([_VP], _I32),
    "ggml_graph_node": ([_VP, _I32], _VP),
    "ggml_graph_get_tensor": ([_VP, _CP], _VP),
    "ggml_rms_norm": ([_VP, _VP, ctypes.c_float], _VP),
    "ggml_reshape_3d": ([_VP, _VP, _I64, _I64, _I64], _VP),
    "ggml_row_size": ([_I32, _I64], _SZ),
    "ggml_quantize_init": ([_I32], None),
    "ggml_quantize_chunk": ([_I32, _FP, _VP, _I64, _I64, _I64, _FP], _SZ),
    "ggml_validate_row_data": ([_I32, _VP, _SZ], _BOOL),
    "gguf_init_empty": ([], _VP),
    "gguf_init_from_file": ([_CP, _GgufInitParams], _VP),
    "gguf_free": ([_VP], None),
    "gguf_set_kv": ([_VP, _VP], None),
    "gguf_set_val_u32": ([_VP, _CP, _U32], None),
    "gguf_set_val_str": ([_VP, _CP, _CP], None),
    "gguf_remove_key": ([_VP, _CP], _I64),
    "gguf_add_tensor": ([_VP, _VP], None),
    "gguf_set_tensor_type": ([_VP, _CP, _I32], None),
    "gguf_get_n_tensors": ([_VP], _I64),
    "gguf_find_tensor": ([_VP, _CP], _I64),
    "gguf_get_tensor_name": ([_VP, _I64], _CP),
    "gguf_get_tensor_offset": ([_VP, _I64], _SZ),
    "gguf_get_tensor_size": ([_VP, _I64], _SZ),
    "gguf_get_meta_size": ([_VP], _SZ),
    "gguf_get_meta_data": ([_VP, _VP], None),
}
_CPU = {
    "ggml_cpu_init": ([], None),
    "ggml_cpu_has_f16c": ([], _I32),
    "ggml_graph_compute_with_ctx": ([_VP, _VP, _I32], _I32),
    "ggml_backend_cpu_init": ([], _VP),
    "ggml_backend_cpu_set_n_threads": ([_VP, _I32], None),
}


@dataclass(frozen=True)
class Ggml:
    base: ctypes.CDLL
    cpu: ctypes.CDLL
    libdir: Path


_loaded: Ggml | None = None
_lock = threading.Lock()


def load() -> Ggml:
    """libggml-base and libggml-cpu of the installed llama-cpp-python, signatures set."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        try:
            llama_cpp = libllama.bindings()  # loads libggml the way llama-cpp-python does
        except Exception as exc:  # noqa: BLE001 - any import failure means: not available
            raise GgmlUnavailable(f"llama_cpp does not import: {exc}") from exc
        libdir = Path(llama_cpp.__file__).parent / "lib"
        try:
            # the files libllama loaded, by the names it needs them by (their SONAMEs): a
            # wheel holds copies, not links, and dlopen of another copy loads a second
            # ggml (its own CPU state, beside the one llama.cpp computes with)
            base = ctypes.CDLL(str(_soname(libdir, "libggml-base.so")), mode=ctypes.RTLD_GLOBAL)
            cpu = ctypes.CDLL(str(_soname(libdir, "libggml-cpu.so")), mode=ctypes.RTLD_GLOBAL)
            for lib, table in ((base, _BASE), (cpu, _CPU)):
                for name, (args, res) in table.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, res
        except (OSError, AttributeError) as exc:
            raise GgmlUnavailable(f"libggml not usable in {libdir}: {exc}") from exc
        cpu.ggml_cpu_init()
        _loaded = Ggml(base, cpu, libdir)
        return _loaded


def _soname(libdir: Path, name: str) -> Path:
    """NAME.0 where the wheel has it (what libllama links), else NAME."""
    versioned = libdir / f"{name}.0"
    return versioned if versioned.is_file() else libdir / name


_CTYPES = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float16): ctypes.c_uint16,
           np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64}


def tensor_array(tensor: int, n: int, dtype=np.float32) -> np.ndarray:
    """A NumPy view of a ggml tensor's first N values of DTYPE (its data, not a copy: valid
    while its context lives)."""
    dtype = np.dtype(dtype)
    raw = (_CTYPES[dtype] * n).from_address(load().base.ggml_get_data(tensor))
    array = np.ctypeslib.as_array(raw)
    return array.view(np.float16) if dtype == np.float16 else array


def new_graph(nodes: int) -> tuple[int, int]:
    """(context, graph): a context holding only the tensor headers of a graph of up to NODES
    nodes (their data is placed by `allocate`), and the graph."""
    b = load().base
    size = nodes * b.ggml_tensor_overhead() + b.ggml_graph_overhead_custom(nodes, False)
    ctx = b.ggml_init(InitParams(size, None, True))
    if not ctx:
        raise GgmlUnavailable("ggml_init failed (out of memory?)")
    return ctx, b.ggml_new_graph_custom(ctx, nodes, False)


def allocate(graph: int) -> int:
    """A graph allocator that has placed GRAPH's tensors in CPU memory (free it after)."""
    b = load().base
    alloc = b.ggml_gallocr_new(b.ggml_backend_cpu_buffer_type())
    if not alloc or not b.ggml_gallocr_alloc_graph(alloc, graph):
        if alloc:
            b.ggml_gallocr_free(alloc)
        raise GgmlUnavailable("ggml cannot allocate a graph (out of memory?)")
    return alloc


def row_size(type_id: int, n_per_row: int) -> int:
    return int(load().base.ggml_row_size(type_id, n_per_row))


def quantize_rows(
    type_id: int,
    src: np.ndarray,
    dst: np.ndarray,
    row0: int,
    row1: int,
    imatrix: np.ndarray | None,
) -> int:
    """Quantize rows row0..row1 of src (float32, rows × n_per_row, C order) into dst (the
    bytes of all of src's rows); returns the bytes written. Safe to call from threads."""
    g = load().base
    n_per_row = src.shape[1]
    im = imatrix.ctypes.data_as(_FP) if imatrix is not None else None
    return int(
        g.ggml_quantize_chunk(
            type_id,
            src.ctypes.data_as(_FP),
            dst.ctypes.data,
            row0 * n_per_row,
            row1 - row0,
            n_per_row,
            im,
        )  # fmt: skip
    )


def valid_rows(type_id: int, data: np.ndarray) -> bool:
    """ggml's check of quantized bytes (finite scales), as llama-quantize runs it."""
    return bool(load().base.ggml_validate_row_data(type_id, data.ctypes.data, data.nbytes))


class GgufHeader:
    """A GGUF context read from a file's header (tensor data not loaded), for copying."""

    def __init__(self, path: Path):
        g = load().base
        self._g = g
        self._ggml_ctx = ctypes.c_void_p()
        params = _GgufInitParams(True, ctypes.pointer(self._ggml_ctx))
        self.ctx = g.gguf_init_from_file(str(path).encode(), params)
        if not self.ctx:
            raise GgmlUnavailable(f"ggml cannot read the GGUF header of {path}")

    def tensor(self, name: str) -> int:
        t = self._g.ggml_get_tensor(self._ggml_ctx, name.encode())
        if not t:
            raise KeyError(name)
        return t

    def close(self) -> None:
        if self.ctx:
            self._g.gguf_free(self.ctx)
            self.ctx = None
        if self._ggml_ctx:
            self._g.ggml_free(self._ggml_ctx)
            self._ggml_ctx = ctypes.c_void_p()

    def __enter__(self) -> GgufHeader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class HeaderBytes:
    """A GGUF header as ggml writes it, and where each tensor's data goes after it."""

    meta: bytes
    offsets: dict[str, int]  # tensor name -> offset from the start of the data section
    sizes: dict[str, int]
    data_bytes: int  # the data section, padded tensors


def build_header(
    src: GgufHeader,
    order: list[tuple[str, int]],
    set_u32: list[tuple[str, int]],
    remove: list[str],
    overrides: list[tuple[str, int | bytes]],
) -> HeaderBytes:
    """A new context: src's key/values, then set_u32 (moved to the end, as ggml's setters
    do), `remove` dropped, overrides set, the tensors in `order` with their new types."""
    g = load().base
    ctx = g.gguf_init_empty()
    try:
        g.gguf_set_kv(ctx, src.ctx)
        for key, value in set_u32:
            g.gguf_set_val_u32(ctx, key.encode(), value)
        for key in remove:
            g.gguf_remove_key(ctx, key.encode())
        for key, value in overrides:
            if isinstance(value, bytes):
                g.gguf_set_val_str(ctx, key.encode(), value)
            else:
                g.gguf_set_val_u32(ctx, key.encode(), abs(int(value)))
        for name, _ in order:
            g.gguf_add_tensor(ctx, src.tensor(name))
        for name, type_id in order:
            g.gguf_set_tensor_type(ctx, name.encode(), type_id)
        offsets, sizes = {}, {}
        for i in range(g.gguf_get_n_tensors(ctx)):
            name = g.gguf_get_tensor_name(ctx, i).decode()
            offsets[name] = int(g.gguf_get_tensor_offset(ctx, i))
            sizes[name] = int(g.gguf_get_tensor_size(ctx, i))
        n = int(g.gguf_get_meta_size(ctx))
        buf = ctypes.create_string_buffer(n)
        g.gguf_get_meta_data(ctx, buf)
        last = max(offsets, key=offsets.get) if offsets else None
        end = offsets[last] + sizes[last] if last else 0
        return HeaderBytes(buf.raw, offsets, sizes, end + (-end % 32))
    finally:
        g.gguf_free(ctx)
