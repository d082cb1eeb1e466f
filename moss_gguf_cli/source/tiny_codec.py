"""A tiny random audio tokenizer with the real MOSS-Audio-Tokenizer ONNX contract.

For the offline demo (`builtin:tiny`) and the tests: the same inputs, outputs,
dtypes and ranks as the real export (docs/ARCHITECTURE.md §5), 1920 samples per frame and 32
codebooks of 1024 codes, but a random linear map instead of a trained network —
what it "speaks" is noise. Built with the `onnx` package, deterministically, a few
hundred kB; the weights can sit in external ``.data`` files as the real export's do.

encoder.onnx: audio float32 (B, 1, N·1920), n_quantizers int64 scalar
              → codes int64 (32, B, N), lengths int64 (B,)
decoder.onnx: codes int64 (32, B, T), n_quantizers int64 scalar
              → audio float32 (B, 1, T·1920), lengths int64 (B,)
Codebooks at or past n_quantizers come out as 0 (encoder) / are ignored (decoder).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

FRAME = 1920
CODEBOOKS = 32
CODES = 1024
OPSET = 17
VERSION = 1  # bump when the generated graphs change


def _int64(name: str, values) -> object:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _float(name: str, values) -> object:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, dtype=np.float32), name)


def _codebook_mask(nodes: list, prefix: str) -> str:
    """Nodes computing a (32,) bool: codebook index < n_quantizers."""
    from onnx import helper

    nodes += [
        helper.make_node("Range", [f"{prefix}zero", f"{prefix}books", f"{prefix}one"], ["book"]),
        helper.make_node("Less", ["book", "n_quantizers"], ["book_used"]),
    ]
    return "book_used"


def encoder_model():
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1920)
    projection = rng.standard_normal((FRAME, CODEBOOKS)).astype(np.float32) / np.sqrt(FRAME)
    nodes: list = [
        # (B, 1, N) → (B, T, 1920): whole frames, as the real encoder expects
        helper.make_node("Reshape", ["audio", "e_frame_shape"], ["frames"]),
        *code_nodes("e_projection", "e_", "codes_btk", TensorProto.INT64),  # (B, T, 32)
        helper.make_node("Transpose", ["codes_btk"], ["codes_all"], perm=[2, 0, 1]),
    ]
    used = _codebook_mask(nodes, "e_")
    nodes += [
        helper.make_node("Unsqueeze", [used, "e_axes12"], ["used_kbt"]),  # (32, 1, 1)
        helper.make_node("Where", ["used_kbt", "codes_all", "e_zero"], ["codes"]),
        helper.make_node("Shape", ["codes_all"], ["codes_shape"]),  # (32, B, T)
        helper.make_node("Gather", ["codes_shape", "e_index1"], ["batch"], axis=0),
        helper.make_node("Gather", ["codes_shape", "e_index2"], ["frame_count"], axis=0),
        helper.make_node("Expand", ["frame_count", "batch"], ["lengths"]),
    ]
    inits = [
        _int64("e_frame_shape", [0, -1, FRAME]),
        _float("e_projection", projection),
        _float("e_half_range", CODES / 2),
        _float("e_low", 0.0),
        _float("e_high", CODES - 1),
        _int64("e_zero", 0),
        _int64("e_one", 1),
        _int64("e_books", CODEBOOKS),
        _int64("e_axes12", [1, 2]),
        _int64("e_index1", [1]),
        _int64("e_index2", 2),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_audio_encoder",
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1, "samples"]),
            helper.make_tensor_value_info("n_quantizers", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("codes", TensorProto.INT64, [CODEBOOKS, "batch", "t"]),
            helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"]),
        ],
        inits,
    )
    return _model(graph)


def decoder_model():
    from onnx import TensorProto, helper

    rng = np.random.default_rng(2400)
    synthesis = rng.standard_normal((CODEBOOKS, FRAME)).astype(np.float32) / np.sqrt(CODEBOOKS)
    nodes: list = []
    used = _codebook_mask(nodes, "d_")
    nodes += [
        helper.make_node("Cast", ["codes"], ["codes_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["codes_f", "d_half_range"], ["unit"]),
        helper.make_node("Sub", ["unit", "d_one_f"], ["centred"]),  # codes → [-1, 1)
        helper.make_node("Cast", [used], ["used_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["used_f", "d_axes12"], ["used_kbt"]),
        helper.make_node("Mul", ["centred", "used_kbt"], ["kept"]),  # (32, B, T)
        helper.make_node("Transpose", ["kept"], ["kept_btk"], perm=[1, 2, 0]),
        helper.make_node("MatMul", ["kept_btk", "d_synthesis"], ["frames"]),  # (B, T, 1920)
        helper.make_node("Tanh", ["frames"], ["bounded"]),
        helper.make_node("Mul", ["bounded", "d_gain"], ["quiet"]),
        helper.make_node("Reshape", ["quiet", "d_audio_shape"], ["audio"]),  # (B, 1, T·1920)
        helper.make_node("Shape", ["codes"], ["codes_shape"]),
        helper.make_node("Gather", ["codes_shape", "d_index1"], ["batch"], axis=0),
        helper.make_node("Gather", ["codes_shape", "d_index2"], ["frame_count"], axis=0),
        helper.make_node("Mul", ["frame_count", "d_frame"], ["sample_count"]),
        helper.make_node("Expand", ["sample_count", "batch"], ["lengths"]),
    ]
    inits = [
        _float("d_synthesis", synthesis),
        _float("d_half_range", CODES / 2),
        _float("d_one_f", 1.0),
        _float("d_gain", 0.5),
        _int64("d_zero", 0),
        _int64("d_one", 1),
        _int64("d_books", CODEBOOKS),
        _int64("d_axes12", [1, 2]),
        _int64("d_audio_shape", [0, 1, -1]),
        _int64("d_index1", [1]),
        _int64("d_index2", 2),
        _int64("d_frame", FRAME),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_audio_decoder",
        [
            helper.make_tensor_value_info("codes", TensorProto.INT64, [CODEBOOKS, "batch", "t"]),
            helper.make_tensor_value_info("n_quantizers", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1, "samples"]),
            helper.make_tensor_value_info("lengths", TensorProto.INT64, ["batch"]),
        ],
        inits,
    )
    return _model(graph)


def _model(graph):
    import onnx
    from onnx import helper

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="moss-gguf"
    )
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def write_tiny_codec(dest: Path, external_data: bool = True) -> tuple[Path, Path]:
    """Write encoder.onnx / decoder.onnx into DEST (weights in .data files if asked)."""
    import onnx

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in (("encoder", encoder_model), ("decoder", decoder_model)):
        model = build()
        path = dest / f"{name}.onnx"
        tmp = dest / f".{name}.onnx.tmp"
        (dest / f"{name}.onnx.data").unlink(missing_ok=True)  # onnx appends to an old one
        try:
            if external_data:
                data = f"{name}.onnx.data"
                onnx.save_model(
                    model,
                    str(tmp),
                    save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location=data,
                    size_threshold=1024,
                )
            else:
                onnx.save_model(model, str(tmp))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        paths.append(path)
    return paths[0], paths[1]


def ensure_tiny_codec(dest: Path, external_data: bool = True) -> tuple[Path, Path]:
    """(encoder, decoder) paths in DEST, written once (atomically) and reused after."""
    dest = Path(dest)
    encoder, decoder = dest / "encoder.onnx", dest / "decoder.onnx"
    stamp = dest / ".tiny-codec-version"
    if encoder.is_file() and decoder.is_file() and stamp.is_file():
        if stamp.read_text().strip() == str(VERSION):
            return encoder, decoder
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-codec-", dir=dest.parent))
    try:
        write_tiny_codec(staging, external_data=external_data)
        (staging / ".tiny-codec-version").write_text(f"{VERSION}\n")
        dest.mkdir(parents=True, exist_ok=True)
        for item in sorted(staging.iterdir()):
            os.replace(item, dest / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return encoder, decoder


def code_nodes(weights: str, prefix: str, codes: str, to: int) -> list:
    """The tiny codecs' quantizer as ONNX nodes: `frames` × WEIGHTS squashed by tanh onto
    [0, 2·half_range), floored and clipped to the PREFIX's low/high constants, cast to TO as
    CODES (its intermediate names fixed: the graphs' bytes are the same wherever it is used)."""
    from onnx import helper

    return [
        helper.make_node("MatMul", ["frames", weights], ["features"]),
        helper.make_node("Tanh", ["features"], ["squashed"]),
        helper.make_node("Mul", ["squashed", f"{prefix}half_range"], ["scaled"]),
        helper.make_node("Add", ["scaled", f"{prefix}half_range"], ["shifted"]),
        helper.make_node("Floor", ["shifted"], ["floored"]),
        helper.make_node("Clip", ["floored", f"{prefix}low", f"{prefix}high"], ["clipped"]),
        helper.make_node("Cast", ["clipped"], [codes], to=to),
    ]
