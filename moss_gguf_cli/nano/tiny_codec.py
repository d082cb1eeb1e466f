"""A tiny audio tokenizer laid out as the MOSS-Audio-Tokenizer-Nano ONNX release.

For `builtin:tiny-nano` and the tests: the release's folder (`codec_browser_onnx_meta.json`
and three graphs, the two decoders sharing one external data file), its input and output
names, dtypes and ranks, 48 kHz stereo, 3,840 samples a frame, 16 codebooks of 1,024 codes —
and a decode_step graph whose streaming state really carries the audio before it: each
frame's sound depends on the frame before, so a stream decoded chunk by chunk equals the
whole decode only when the state is passed on (a fresh state changes the first frame of a
chunk). A random linear map stands in for the trained network: what it speaks is noise.

encode:      waveform f32 (B, 2, T), input_lengths i32 (B,)
             → audio_codes i32 (B, ⌈T/3840⌉, 16), audio_code_lengths i32 (B,)
decode_full: audio_codes i32 (B, F, 16), audio_code_lengths i32 (B,)
             → audio f32 (B, 2, F·3840), audio_lengths i32 (B,)
decode_step: the same, batch 1, plus the state named in the meta's streaming_decode (one
             transformer offset, one attention cache: offset, keys, values, positions), each
             input NAME answered by its output (the previous frame's features ride in keys)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..source.tiny_codec import code_nodes

SAMPLE_RATE = 48_000
CHANNELS = 2
FRAME = 3_840  # samples a frame per channel: 12.5 frames a second
BOOKS = 16
CODES = 1_024
FEATURES = 8  # width of a frame's features (the real codec's is far wider)
OPSET = 17
VERSION = 1  # bump when the generated graphs change
META = "codec_browser_onnx_meta.json"
FILES = {
    "encode": "moss_audio_tokenizer_encode.onnx",
    "decode_full": "moss_audio_tokenizer_decode_full.onnx",
    "decode_step": "moss_audio_tokenizer_decode_step.onnx",
}
ENCODE_DATA = "moss_audio_tokenizer_encode.data"
DECODE_DATA = "moss_audio_tokenizer_decode_shared.data"
# the streaming state, named as upstream's runtime reads it from the meta
STATE = {
    "transformer_offsets": [
        {"input_name": "transformer_offset_0", "output_name": "transformer_offset_out_0",
         "shape": [1], "dtype": "int32"},
    ],
    "attention_caches": [
        {"offset_input_name": "attn_offset_0", "offset_output_name": "attn_offset_out_0",
         "offset_shape": [1],
         "cached_keys_input_name": "attn_cached_keys_0",
         "cached_keys_output_name": "attn_cached_keys_out_0",
         "cached_values_input_name": "attn_cached_values_0",
         "cached_values_output_name": "attn_cached_values_out_0",
         "cache_shape": [1, 1, 1, FEATURES], "cache_dtype": "float32",
         "cached_positions_input_name": "attn_cached_positions_0",
         "cached_positions_output_name": "attn_cached_positions_out_0",
         "positions_shape": [1, 1], "positions_dtype": "int32"},
    ],
}  # fmt: skip


def meta() -> dict:
    """The meta file's contents: the files, the codec's facts, the streaming state."""
    return {
        "format_version": 1,
        "files": dict(FILES),
        "external_data_files": {
            FILES["encode"]: [ENCODE_DATA],
            FILES["decode_full"]: [DECODE_DATA],
            FILES["decode_step"]: [DECODE_DATA],
        },
        "codec_config": {
            "sample_rate": SAMPLE_RATE,
            "channels": CHANNELS,
            "num_quantizers": BOOKS,
            "codebook_size": CODES,
            "downsample_rate": FRAME,
        },
        "streaming_decode": {"batch_size": 1, **STATE},
    }


def _const(name: str, values, dtype) -> object:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3840)
    return {
        # 16 tables of 1024 rows, stacked: code c of book q is row q·1024 + c
        "embedding": rng.standard_normal((BOOKS * CODES, FEATURES)).astype(np.float32) * 0.5,
        # multiples of 1/256 (and features of 1/16, below): every product and partial sum of
        # the synthesis is exact in float32, so a frame's samples are the same bits whatever
        # number of frames a call decodes (a stream equals the whole decode, to the bit)
        "synthesis": (np.round(rng.standard_normal((FEATURES, CHANNELS * FRAME)) * 64) / 256)
        .astype(np.float32),
        "analysis": (rng.standard_normal((CHANNELS * FRAME, BOOKS)) * 8 / np.sqrt(FRAME))
        .astype(np.float32),
    }


def encode_model():
    from onnx import TensorProto, helper

    w = _weights()
    i64 = np.int64
    nodes = [
        # pad T to whole frames: (FRAME - T % FRAME) % FRAME zeros at the end
        helper.make_node("Shape", ["waveform"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["samples"], axis=0),  # (1,)
        helper.make_node("Mod", ["samples", "frame"], ["rest"]),
        helper.make_node("Sub", ["frame", "rest"], ["short"]),
        helper.make_node("Mod", ["short", "frame"], ["pad_end"]),
        helper.make_node("Concat", ["zeros5", "pad_end"], ["pads"], axis=0),
        helper.make_node("Pad", ["waveform", "pads"], ["padded"]),
        helper.make_node("Reshape", ["padded", "by_frame"], ["b2nf"]),  # (B, 2, N, 3840)
        helper.make_node("Transpose", ["b2nf"], ["bn2f"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["bn2f", "flat_frames"], ["frames"]),  # (B, N, 7680)
        *code_nodes("analysis", "", "audio_codes", TensorProto.INT32),
        # ⌈length / 3840⌉ frames hold a clip's samples
        helper.make_node("Add", ["input_lengths", "frame_less_one32"], ["rounded_up"]),
        helper.make_node("Div", ["rounded_up", "frame32"], ["audio_code_lengths"]),
    ]
    inits = [
        _const("two", [2], i64), _const("frame", [FRAME], i64),
        _const("zeros5", [0] * 5, i64), _const("by_frame", [0, CHANNELS, -1, FRAME], i64),
        _const("flat_frames", [0, -1, CHANNELS * FRAME], i64),
        _const("analysis", w["analysis"], np.float32),
        _const("half_range", CODES / 2, np.float32), _const("low", 0, np.float32),
        _const("high", CODES - 1, np.float32),
        _const("frame_less_one32", FRAME - 1, np.int32), _const("frame32", FRAME, np.int32),
    ]  # fmt: skip
    inputs = [
        helper.make_tensor_value_info("waveform", TensorProto.FLOAT,
                                      ["batch", CHANNELS, "samples"]),  # fmt: skip
        helper.make_tensor_value_info("input_lengths", TensorProto.INT32, ["batch"]),
    ]
    outputs = [
        helper.make_tensor_value_info("audio_codes", TensorProto.INT32,
                                      ["batch", "frames", BOOKS]),  # fmt: skip
        helper.make_tensor_value_info("audio_code_lengths", TensorProto.INT32, ["batch"]),
    ]
    return helper.make_graph(nodes, "moss_audio_tokenizer_encode", inputs, outputs, inits)


def decode_model(streaming: bool):
    """decode_full, or decode_step with the state: the previous frame's features."""
    from onnx import TensorProto, helper

    w = _weights()
    i64 = np.int64
    cache = STATE["attention_caches"][0]
    offset = STATE["transformer_offsets"][0]
    nodes = [
        helper.make_node("Cast", ["audio_codes"], ["codes64"], to=TensorProto.INT64),
        helper.make_node("Add", ["codes64", "book_offsets"], ["rows"]),
        helper.make_node("Gather", ["embedding", "rows"], ["per_book"], axis=0),  # (B,F,16,D)
        helper.make_node("ReduceSum", ["per_book", "axis2"], ["x"], keepdims=0),  # (B, F, D)
        helper.make_node("Slice", ["x", "zero", "minus_one", "one"], ["x_but_last"]),
    ]
    if streaming:  # the frame before this chunk's first is the state's
        nodes.append(helper.make_node("Reshape", [cache["cached_keys_input_name"], "bfd"],
                                      ["before"]))  # fmt: skip
        before = _const("bfd", [1, 1, FEATURES], i64)
    else:
        nodes += [
            helper.make_node("Slice", ["x", "zero", "one", "one"], ["x_first"]),
            helper.make_node("Mul", ["x_first", "nothing"], ["before"]),  # zeros, (B, 1, D)
        ]
        before = _const("nothing", 0.0, np.float32)
    nodes += [
        helper.make_node("Concat", ["before", "x_but_last"], ["previous"], axis=1),
        helper.make_node("Mul", ["previous", "half"], ["echo"]),
        helper.make_node("Add", ["x", "echo"], ["mixed"]),
        helper.make_node("Tanh", ["mixed"], ["squashed"]),
        helper.make_node("Mul", ["squashed", "sixteen"], ["scaled"]),
        helper.make_node("Round", ["scaled"], ["steps"]),
        helper.make_node("Div", ["steps", "sixteen"], ["hidden"]),  # multiples of 1/16
        helper.make_node("MatMul", ["hidden", "synthesis"], ["raw"]),  # (B, F, 7680)
        helper.make_node("Tanh", ["raw"], ["bounded"]),
        helper.make_node("Mul", ["bounded", "half"], ["samples"]),
        helper.make_node("Reshape", ["samples", "by_channel"], ["bf2s"]),  # (B, F, 2, 3840)
        helper.make_node("Transpose", ["bf2s"], ["b2fs"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["b2fs", "channel_major"], ["audio"]),  # (B, 2, F·3840)
        helper.make_node("Mul", ["audio_code_lengths", "frame32"], ["audio_lengths"]),
    ]
    inits = [
        _const("embedding", w["embedding"], np.float32),
        _const("synthesis", w["synthesis"], np.float32),
        _const("book_offsets", np.arange(BOOKS) * CODES, i64),
        _const("axis2", [2], i64), _const("zero", [0], i64), _const("one", [1], i64),
        _const("minus_one", [-1], i64), _const("half", 0.5, np.float32),
        _const("sixteen", 16.0, np.float32), before,
        _const("by_channel", [0, 0, CHANNELS, FRAME], i64),
        _const("channel_major", [0, CHANNELS, -1], i64), _const("frame32", FRAME, np.int32),
    ]  # fmt: skip
    batch = 1 if streaming else "batch"
    inputs = [
        helper.make_tensor_value_info("audio_codes", TensorProto.INT32, [batch, "frames", BOOKS]),
        helper.make_tensor_value_info("audio_code_lengths", TensorProto.INT32, [batch]),
    ]
    outputs = [
        helper.make_tensor_value_info("audio", TensorProto.FLOAT, [batch, CHANNELS, "samples"]),
        helper.make_tensor_value_info("audio_lengths", TensorProto.INT32, [batch]),
    ]
    if streaming:
        nodes += _state_nodes(cache, offset)
        inits += [_const("last_frame", [-1], i64), _const("int_max", [2**62], i64),
                  _const("cache_shape", cache["cache_shape"], i64),
                  _const("positions_shape", cache["positions_shape"], i64),
                  _const("one32", 1, np.int32)]  # fmt: skip
        inputs += _state_values(cache, offset, "input")
        outputs += _state_values(cache, offset, "output")
    return helper.make_graph(nodes, "moss_audio_tokenizer_decode_" +
                             ("step" if streaming else "full"), inputs, outputs, inits)  # fmt: skip


def _state_nodes(cache: dict, offset: dict) -> list:
    """The next state: the chunk's last frame's features, the offsets moved on by its frames,
    the last frame's position."""
    from onnx import helper

    return [
        helper.make_node("Slice", ["x", "last_frame", "int_max", "one"], ["x_last"]),
        helper.make_node("Reshape", ["x_last", "cache_shape"], [cache["cached_keys_output_name"]]),
        helper.make_node("Identity", [cache["cached_values_input_name"]],
                         [cache["cached_values_output_name"]]),  # fmt: skip
        helper.make_node("Add", [offset["input_name"], "audio_code_lengths"],
                         [offset["output_name"]]),  # fmt: skip
        helper.make_node("Add", [cache["offset_input_name"], "audio_code_lengths"],
                         [cache["offset_output_name"]]),  # fmt: skip
        helper.make_node("Sub", [cache["offset_output_name"], "one32"], ["last_position"]),
        helper.make_node("Reshape", ["last_position", "positions_shape"],
                         [cache["cached_positions_output_name"]]),  # fmt: skip
    ]


def _state_values(cache: dict, offset: dict, side: str) -> list:
    from onnx import TensorProto, helper

    key = "input_name" if side == "input" else "output_name"
    i32, f32 = TensorProto.INT32, TensorProto.FLOAT
    return [
        helper.make_tensor_value_info(offset[key], i32, offset["shape"]),
        helper.make_tensor_value_info(cache[f"offset_{key}"], i32, cache["offset_shape"]),
        helper.make_tensor_value_info(cache[f"cached_keys_{key}"], f32, cache["cache_shape"]),
        helper.make_tensor_value_info(cache[f"cached_values_{key}"], f32, cache["cache_shape"]),
        helper.make_tensor_value_info(cache[f"cached_positions_{key}"], i32,
                                      cache["positions_shape"]),  # fmt: skip
    ]


def _model(graph):
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="moss-gguf tiny-nano codec")  # fmt: skip
    model.ir_version = 8  # readable by every onnxruntime this project supports
    onnx.checker.check_model(model)
    return model


def _save_shared(models: dict[str, object], folder: Path) -> None:
    """Save the three graphs as the release does: the encoder's weights in its own data file,
    the two decoders' in one file they share (the same tensor is stored once)."""
    import onnx
    from onnx.external_data_helper import set_external_data

    onnx.save_model(models["encode"], folder / FILES["encode"], save_as_external_data=True,
                    all_tensors_to_one_file=True, location=ENCODE_DATA,
                    size_threshold=1024)  # fmt: skip
    full = models["decode_full"]
    onnx.save_model(full, folder / FILES["decode_full"], save_as_external_data=True,
                    all_tensors_to_one_file=True, location=DECODE_DATA,
                    size_threshold=1024)  # fmt: skip
    stored = onnx.load(folder / FILES["decode_full"], load_external_data=False)
    where = {t.name: {e.key: e.value for e in t.external_data}
             for t in stored.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    step = models["decode_step"]
    for tensor in step.graph.initializer:
        if tensor.name in where:  # a weight decode_full stored: point at its bytes
            entry = where[tensor.name]
            set_external_data(tensor, DECODE_DATA, int(entry.get("offset", 0)),
                              int(entry["length"]))  # fmt: skip
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(step, folder / FILES["decode_step"])


def write_tiny_nano_codec(dest: Path) -> Path:
    """Write the codec folder at DEST (atomically: built beside it, renamed into place)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        models = {"encode": _model(encode_model()),
                  "decode_full": _model(decode_model(streaming=False)),
                  "decode_step": _model(decode_model(streaming=True))}  # fmt: skip
        _save_shared(models, tmp)
        (tmp / META).write_text(json.dumps(meta(), indent=2) + "\n", encoding="utf-8")
        (tmp / ".version").write_text(str(VERSION))
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def ensure_tiny_nano_codec(dest: Path) -> Path:
    """DEST holding this version's codec, written when missing or older."""
    dest = Path(dest)
    stamp = dest / ".version"
    if stamp.is_file() and stamp.read_text().strip() == str(VERSION):
        return dest
    return write_tiny_nano_codec(dest)
