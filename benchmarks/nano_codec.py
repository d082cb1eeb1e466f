"""A MOSS-Audio-Tokenizer-Nano of the release's architecture and size, random weights, written in
the release's ONNX layout, and its decode timed as a user pays it (issue #62).

    python benchmarks/nano_codec.py build   [--clean]
    python benchmarks/nano_codec.py measure [--threads 1,2] [--frames-per-call 1,4,8]
                                            [--frames 160] [--rounds 3] [--json out.json]
    python benchmarks/nano_codec.py check   [--frames 160]

`build` writes the codec once under $MOSS_GGUF_BENCH_DIR (default /tmp/moss-gguf-bench)
/nano-codec-real and later commands reuse it (`--clean` deletes it first). Its graphs are the
release's (moss_gguf_cli/nano/tiny_codec.py writes the same layout at toy size):
`codec_browser_onnx_meta.json`, `moss_audio_tokenizer_encode.onnx` (+ its .data),
`moss_audio_tokenizer_decode_full.onnx` and `moss_audio_tokenizer_decode_step.onnx` sharing
`moss_audio_tokenizer_decode_shared.data` (each weight stored once), the streaming state named
in the meta's `streaming_decode` (4 transformer offsets, 12 attention caches).

The architecture (the Hub code's MossAudioTokenizerModel at the Nano's sizes): 48 kHz stereo,
L/R interleaved into one 96 kHz stream; encoder patch 240 → causal transformer stages at
400/200/100/50 tokens/s (4, 2, 2, 4 layers) joined by patches of 2, then a patch of 4 to 12.5 Hz
and 768 channels; RLFQ 16 × 1024 (768→512 input_proj, per book 512→8 in_proj, L2-normalised
nearest code, 8→512 out_proj, 512→768 output_proj; all 1×1 convolutions weight-normed); the
decoder mirrors it (patch 4, stages at 50/100/200/400 with 4, 2, 2, 4 layers, patches of 2,
patch 240). Every stage: d_model 256, 4 heads of 64, FFN 1024, bias-free linears, LayerNorm
(1e-5, with bias), LayerScale, exact-erf GELU, RoPE on interleaved pairs (max period 10000),
sliding-window causal attention (windows 500/800/1200/1600 tokens for the decoder's
50/100/200/400 stages; the encoder's stages the same windows at the same rates). The stage
widths are not published; these follow the large MOSS-Audio-Tokenizer's config.json pattern
(a stage's output twice the next one's input): encoder 240→…→384, 768→…→384 (×2),
768→…→192; decoder 192→…→768, 384→…→768 (×2), 384→…→240 — and give the release's 21,969,664
parameters exactly (weight-norm g and v counted apart, as its checkpoint stores them) and
11,058,688 on the decode path (codebooks, out_projs, output_proj, decoder). Weights are random,
variance-keeping (PyTorch's default init shrinks the signal a stage at a time).

Exported as upstream exports MOSS-TTS-Nano (onnx/export_moss_tts_browser_onnx.py):
torch.onnx.export with dynamo=False, opset 17. decode_step's attention caches are rings as the
Hub code's RingKVCache: per layer the last `window` keys, values and their positions (token p
in slot p % window, positions -1 while empty). A call of T new tokens attends over the ring
and the T new keys together, then scatters them in — so any grouping of frames gives what
decode_full gives (masked to the same windows) up to float rounding, where a ring written
before attending (the Hub code's) would drop up to T-1 keys at a chunk's start. A call takes at
most 50 frames (the 400 Hz stage's 1600-token window).

`measure`: decode_step through ONNX Runtime (CPU EP, ORT_ENABLE_ALL, inter-op 1) at each
intra-op thread count, with `session.intra_op.allow_spinning` on and off, FRAMES frames a
stream in calls of 1, 4 or 8 frames, two ways: numpy feeds (upstream's ort_cpu_runtime and our
StreamDecoder: the state goes in as numpy arrays and comes back as new ones) and io_binding
(the state kept in two OrtValue sets that swap inputs and outputs, no copy); settings
alternated round-robin, medians; then decode_full of 100 frames; then one stream a
frames-a-call under ORT's profiler: the share of kernel time by kind (matmuls, the state's
rewrite, softmax and mask, elementwise, shape glue). The 1-minute load average is recorded
with every timing. `check`: our runtime (moss_gguf_cli.nano.codec.NanoCodecRuntime) opens the
folder and streams FRAMES frames one a call; the max abs difference against decode_full.

The random weights speak noise; only the time is measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(os.environ.get("MOSS_GGUF_BENCH_DIR", "/tmp/moss-gguf-bench"))
DEST = ROOT / "nano-codec-real"
VERSION = "3"
SEED = 62

SAMPLE_RATE, CHANNELS, FRAME, BOOKS, CODES = 48_000, 2, 3_840, 16, 1_024
D_MODEL, HEADS, FFN, LAYER_SCALE, MAX_PERIOD = 256, 4, 1_024, 0.01, 10_000.0
CODE_DIM, RVQ_DIM, CODEBOOK_DIM = 768, 512, 8
# (rate tokens/s, layers, input width, output width, window tokens), in the order data flows
ENCODER = [(400, 4, 240, 384, 1600), (200, 2, 768, 384, 1200), (100, 2, 768, 384, 800),
           (50, 4, 768, 192, 500)]  # fmt: skip
ENCODER_PATCHES = [240, 2, 2, 2, 4]  # before stage 1, between stages, after the last
DECODER = [(50, 4, 192, 768, 500), (100, 2, 384, 768, 800), (200, 2, 384, 768, 1200),
           (400, 4, 384, 240, 1600)]  # fmt: skip
DECODER_PATCHES = [4, 2, 2, 2, 240]  # before stage 1, between stages, after the last
RELEASE_PARAMS = 21_969_664
OPSET = 17
META = "codec_browser_onnx_meta.json"
FILES = {"encode": "moss_audio_tokenizer_encode.onnx",
         "decode_full": "moss_audio_tokenizer_decode_full.onnx",
         "decode_step": "moss_audio_tokenizer_decode_step.onnx"}  # fmt: skip
ENCODE_DATA = "moss_audio_tokenizer_encode.data"
DECODE_DATA = "moss_audio_tokenizer_decode_shared.data"


# ---------------------------------------------------------------------------------------------
# the model


def _torch():
    import torch

    return torch


def _modules():
    """The codec's torch modules (defined lazily: torch is imported only when building)."""
    torch = _torch()
    nn, F = torch.nn, torch.nn.functional

    def rope_tables(start, T):
        """cos, sin (1, 1, T, 32) of positions start + arange(T) (max period 10000)."""
        half = D_MODEL // HEADS // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32) * (-math.log(MAX_PERIOD) / half))
        ts = start.float().view(1, 1) + torch.arange(T, dtype=torch.float32).view(1, -1)
        angle = ts.view(1, 1, -1, 1) * freqs
        return torch.cos(angle), torch.sin(angle)

    def turn(x, cos, sin):
        """RoPE on interleaved pairs: (x[2i], x[2i+1]) turned by position · freq i."""
        # (the legacy exporter bakes a traced shape into flatten/unflatten: reshape it is)
        B, H, T, D = x.shape
        pairs = x.reshape(B, H, T, D // 2, 2)
        xr, xi = pairs[..., 0], pairs[..., 1]
        return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).reshape(B, H, T, D)

    def window_bias(pos_q, pos_k, window):
        """0 where a query may see a key (valid, not after it, inside the window), else -inf."""
        delta = pos_q.view(-1, 1) - pos_k.view(1, -1)
        ok = (pos_k.view(1, -1) >= 0) & (delta >= 0) & (delta < window)
        return torch.zeros(ok.shape, dtype=torch.float32).masked_fill(~ok, float("-inf"))

    scale = 1.0 / math.sqrt(D_MODEL // HEADS)

    class Layer(nn.Module):
        def __init__(self, window: int):
            super().__init__()
            self.window = window
            self.norm1 = nn.LayerNorm(D_MODEL, eps=1e-5)
            self.in_proj = nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
            self.out_proj = nn.Linear(D_MODEL, D_MODEL, bias=False)
            self.layer_scale_1 = nn.Parameter(torch.full((D_MODEL,), LAYER_SCALE))
            self.norm2 = nn.LayerNorm(D_MODEL, eps=1e-5)
            self.linear1 = nn.Linear(D_MODEL, FFN, bias=False)
            self.linear2 = nn.Linear(FFN, D_MODEL, bias=False)
            self.layer_scale_2 = nn.Parameter(torch.full((D_MODEL,), LAYER_SCALE))

        def _qkv(self, x, cos, sin):
            B, T, _ = x.shape
            qkv = self.in_proj(self.norm1(x)).reshape(B, T, 3, HEADS, D_MODEL // HEADS)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, 64)
            return turn(q, cos, sin), turn(k, cos, sin), v

        def _finish(self, x, attended):
            B, T, _ = x.shape
            attended = attended.transpose(1, 2).reshape(B, T, D_MODEL)
            x = x + self.layer_scale_1 * self.out_proj(attended)
            update = self.linear2(F.gelu(self.linear1(self.norm2(x))))  # exact erf GELU
            return x + self.layer_scale_2 * update

        def forward(self, x, cos, sin, bias):
            """The whole sequence at once."""
            q, k, v = self._qkv(x, cos, sin)
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
            return self._finish(x, torch.matmul(torch.softmax(scores, dim=-1), v))

        def step(self, x, cos, sin, new_pos, offset, keys, values, positions):
            """T new tokens after the ring cache's (the last `window` tokens, token p in slot
            p % window): attend over the cache and the new tokens, then write them in."""
            T = x.shape[1]
            q, k, v = self._qkv(x, cos, sin)
            old_pos = positions.to(torch.int64)
            bias = window_bias(new_pos, torch.cat([old_pos, new_pos.view(1, -1)], dim=1),
                               self.window)  # fmt: skip
            scores = torch.cat([torch.matmul(q, keys.transpose(-1, -2)),
                                torch.matmul(q, k.transpose(-1, -2))], dim=-1)  # fmt: skip
            probs = torch.softmax(scores * scale + bias, dim=-1)
            w = self.window
            attended = (torch.matmul(probs[..., :w], values)
                        + torch.matmul(probs[..., w:], v))  # fmt: skip
            slots = torch.remainder(new_pos, w)  # (T,)
            where = slots.view(1, 1, -1, 1).expand(1, HEADS, T, D_MODEL // HEADS)
            return (
                self._finish(x, attended),
                offset + T,
                keys.scatter(2, where, k),
                values.scatter(2, where, v),
                positions.scatter(1, slots.view(1, -1), new_pos.view(1, -1).to(torch.int32)),
            )

    class Stage(nn.Module):
        """ProjectedTransformer: input_proj, layers, output_proj (Identity where widths match)."""

        def __init__(self, layers: int, d_in: int, d_out: int, window: int):
            super().__init__()
            self.window = window
            self.input_proj = (nn.Linear(d_in, D_MODEL, bias=False) if d_in != D_MODEL
                               else nn.Identity())  # fmt: skip
            self.layers = nn.ModuleList(Layer(window) for _ in range(layers))
            self.output_proj = (nn.Linear(D_MODEL, d_out, bias=False) if d_out != D_MODEL
                                else nn.Identity())  # fmt: skip

        def forward(self, x):
            x = self.input_proj(x)
            T = x.shape[1]
            cos, sin = rope_tables(torch.zeros(1, dtype=torch.int32), T)
            pos = torch.arange(T, dtype=torch.int64)
            bias = window_bias(pos, pos, self.window)
            for layer in self.layers:
                x = layer(x, cos, sin, bias)
            return self.output_proj(x)

        def step(self, x, caches):
            """CACHES: per layer (offset, keys, values, positions); returns x and their next."""
            x = self.input_proj(x)
            T = x.shape[1]
            start = caches[0]  # every layer of a stage has seen the same tokens
            cos, sin = rope_tables(start, T)
            new_pos = start.to(torch.int64) + torch.arange(T, dtype=torch.int64)
            out = []
            for i, layer in enumerate(self.layers):
                x, *new = layer.step(x, cos, sin, new_pos, *caches[4 * i : 4 * i + 4])
                out += new
            return self.output_proj(x), out

    class WNConv1x1(nn.Module):
        """A weight-normed 1×1 Conv1d (weight_g, weight_v, bias), applied channels-last."""

        def __init__(self, d_in: int, d_out: int):
            super().__init__()
            conv = nn.Conv1d(d_in, d_out, 1)
            self.weight_v = nn.Parameter(conv.weight.detach().clone())
            self.weight_g = nn.Parameter(conv.weight.detach().norm(dim=(1, 2), keepdim=True))
            self.bias = nn.Parameter(conv.bias.detach().clone())

        def weight(self):  # (out, in)
            v = self.weight_v[:, :, 0]
            return self.weight_g[:, :, 0] * v / v.norm(dim=1, keepdim=True)

        def forward(self, x):
            return F.linear(x, self.weight(), self.bias)

    class LFQ(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj = WNConv1x1(RVQ_DIM, CODEBOOK_DIM)
            self.out_proj = WNConv1x1(CODEBOOK_DIM, RVQ_DIM)
            self.codebook = nn.Embedding(CODES, CODEBOOK_DIM)

    class Quantizer(nn.Module):
        """ResidualLFQ: 16 books of 1024 codes of 8 dims."""

        def __init__(self):
            super().__init__()
            self.input_proj = WNConv1x1(CODE_DIM, RVQ_DIM)
            self.output_proj = WNConv1x1(RVQ_DIM, CODE_DIM)
            self.quantizers = nn.ModuleList(LFQ() for _ in range(BOOKS))

        def decode(self, codes):
            """(B, F, 16) codes → (B, F, 768)."""
            emb = None
            for i, book in enumerate(self.quantizers):
                part = book.out_proj(F.embedding(codes[:, :, i], book.codebook.weight))
                emb = part if emb is None else emb + part
            return self.output_proj(emb)

        def encode(self, z):
            """(B, F, 768) → (B, F, 16) int64 codes."""
            residual = self.input_proj(z)
            codes = []
            for book in self.quantizers:
                e = F.normalize(book.in_proj(residual), dim=-1)
                table = F.normalize(book.codebook.weight, dim=-1)
                index = torch.argmax(torch.matmul(e, table.t()), dim=-1)  # nearest on the sphere
                codes.append(index)
                residual = residual - book.out_proj(F.embedding(index, book.codebook.weight))
            return torch.stack(codes, dim=-1)

    def patch_down(x, h):  # (B, L, d) → (B, L/h, d·h), channel c·h + j as the Hub code's
        B, _, d = x.shape
        return x.reshape(B, -1, h, d).transpose(-1, -2).reshape(B, -1, d * h)

    def patch_up(x, h):  # (B, L, d·h) → (B, L·h, d)
        B, _, dh = x.shape
        return x.reshape(B, -1, dh // h, h).transpose(-1, -2).reshape(B, -1, dh // h)

    class Codec(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.ModuleList(Stage(n, i, o, w) for _, n, i, o, w in ENCODER)
            self.quantizer = Quantizer()
            self.decoder = nn.ModuleList(Stage(n, i, o, w) for _, n, i, o, w in DECODER)

        def decode_path_params(self) -> int:
            q = self.quantizer
            quant = sum(p.numel() for p in q.output_proj.parameters())
            quant += sum(
                p.numel()
                for b in q.quantizers
                for p in (*b.out_proj.parameters(), *b.codebook.parameters())
            )
            return quant + sum(p.numel() for p in self.decoder.parameters())

    class Encode(nn.Module):
        def __init__(self, codec):
            super().__init__()
            self.codec = codec

        def forward(self, waveform, input_lengths):
            B, C, T = waveform.shape
            pad = (FRAME - T % FRAME) % FRAME
            x = F.pad(waveform, (0, pad))
            x = x.transpose(1, 2).reshape(B, -1, 1)  # L/R interleaved, channels last
            x = patch_down(x, ENCODER_PATCHES[0])
            for stage, h in zip(self.codec.encoder, ENCODER_PATCHES[1:], strict=True):
                x = patch_down(stage(x), h)
            codes = self.codec.quantizer.encode(x).to(torch.int32)
            lengths = torch.div(input_lengths + (FRAME - 1), FRAME, rounding_mode="floor")
            return codes, lengths.to(torch.int32)

    def decode_to_stream(codec, x):
        x = patch_up(codec.quantizer.decode(x), DECODER_PATCHES[0])
        return x

    def to_audio(x):
        x = patch_up(x, DECODER_PATCHES[-1])  # (B, F·7680, 1) at 96 kHz
        return x.reshape(x.shape[0], -1, CHANNELS).transpose(1, 2)  # (B, 2, F·3840)

    class DecodeFull(nn.Module):
        def __init__(self, codec):
            super().__init__()
            self.codec = codec

        def forward(self, audio_codes, audio_code_lengths):
            x = decode_to_stream(self.codec, audio_codes.to(torch.int64))
            for i, stage in enumerate(self.codec.decoder):
                x = stage(x)
                if i + 1 < len(self.codec.decoder):
                    x = patch_up(x, DECODER_PATCHES[i + 1])
            return to_audio(x), audio_code_lengths * FRAME

    class DecodeStep(nn.Module):
        """decode_full for batch 1 plus the state: per stage its transformer offset, per layer
        (offset, keys, values, positions); flat inputs in the meta's order, outputs likewise."""

        def __init__(self, codec):
            super().__init__()
            self.codec = codec

        def forward(self, audio_codes, audio_code_lengths, *state):
            stages = len(self.codec.decoder)
            offsets, caches = state[:stages], state[stages:]
            x = decode_to_stream(self.codec, audio_codes.to(torch.int64))
            out_offsets, out_caches, n = [], [], 0
            for i, stage in enumerate(self.codec.decoder):
                out_offsets.append(offsets[i] + x.shape[1])
                k = 4 * len(stage.layers)
                x, new = stage.step(x, caches[n : n + k])
                out_caches += new
                n += k
                if i + 1 < stages:
                    x = patch_up(x, DECODER_PATCHES[i + 1])
            return (to_audio(x), audio_code_lengths * FRAME, *out_offsets, *out_caches)

    return Codec, Encode, DecodeFull, DecodeStep


def build_codec():
    torch = _torch()
    Codec, *_ = _modules()
    torch.manual_seed(SEED)
    codec = Codec().eval()
    # variance-keeping weights (PyTorch's default init shrinks the signal 3× a stage, to codes
    # the biases alone decide); LayerNorms, LayerScales and biases random around their inits
    with torch.no_grad():
        for module in codec.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5)
            elif hasattr(module, "weight_v"):  # the weight-normed 1×1 convolutions
                module.weight_v.normal_()
                module.weight_g.uniform_(0.8, 1.2)
                module.bias.normal_(0.0, 0.01)
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.1)
                module.bias.normal_(0.0, 0.1)
        for name, p in codec.named_parameters():
            if "layer_scale" in name:
                p.uniform_(0.5 * LAYER_SCALE, 2.0 * LAYER_SCALE)
        codec.decoder[-1].output_proj.weight.mul_(0.03)  # samples mostly within ±1
    return codec


# ---------------------------------------------------------------------------------------------
# the meta and the state


def layer_windows() -> list[tuple[int, int]]:
    """(stage, window) of each decoder layer, in order."""
    return [(s, w) for s, (_, n, _, _, w) in enumerate(DECODER) for _ in range(n)]


def state_spec() -> dict:
    head_dim = D_MODEL // HEADS
    return {
        "transformer_offsets": [
            {"input_name": f"transformer_offset_{s}", "output_name": f"transformer_offset_out_{s}",
             "shape": [1], "dtype": "int32"} for s in range(len(DECODER))],
        "attention_caches": [
            {"offset_input_name": f"attn_offset_{i}", "offset_output_name": f"attn_offset_out_{i}",
             "offset_shape": [1],
             "cached_keys_input_name": f"attn_cached_keys_{i}",
             "cached_keys_output_name": f"attn_cached_keys_out_{i}",
             "cached_values_input_name": f"attn_cached_values_{i}",
             "cached_values_output_name": f"attn_cached_values_out_{i}",
             "cache_shape": [1, HEADS, w, head_dim], "cache_dtype": "float32",
             "cached_positions_input_name": f"attn_cached_positions_{i}",
             "cached_positions_output_name": f"attn_cached_positions_out_{i}",
             "positions_shape": [1, w], "positions_dtype": "int32"}
            for i, (_, w) in enumerate(layer_windows())],
    }  # fmt: skip


def state_names(side: str) -> list[str]:
    spec = state_spec()
    key = "input_name" if side == "input" else "output_name"
    names = [t[key] for t in spec["transformer_offsets"]]
    for c in spec["attention_caches"]:
        names += [c[f"{part}_{key}"] for part in
                  ("offset", "cached_keys", "cached_values", "cached_positions")]  # fmt: skip
    return names


def fresh_state() -> list[np.ndarray]:
    spec = state_spec()
    out = [np.zeros(t["shape"], np.int32) for t in spec["transformer_offsets"]]
    for c in spec["attention_caches"]:
        out += [np.zeros(c["offset_shape"], np.int32), np.zeros(c["cache_shape"], np.float32),
                np.zeros(c["cache_shape"], np.float32),
                np.full(c["positions_shape"], -1, np.int32)]  # fmt: skip
    return out


def meta() -> dict:
    return {
        "format_version": 1,
        "files": dict(FILES),
        "external_data_files": {FILES["encode"]: [ENCODE_DATA],
                                FILES["decode_full"]: [DECODE_DATA],
                                FILES["decode_step"]: [DECODE_DATA]},  # fmt: skip
        "codec_config": {"sample_rate": SAMPLE_RATE, "channels": CHANNELS,
                         "num_quantizers": BOOKS, "codebook_size": CODES,
                         "downsample_rate": FRAME},  # fmt: skip
        "streaming_decode": {"batch_size": 1, **state_spec()},
        "benchmark_note": "random weights of MOSS-Audio-Tokenizer-Nano's architecture "
                          "(benchmarks/nano_codec.py); it speaks noise",
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# export


def _export(module, args, path: Path, inputs, outputs, dynamic) -> None:
    torch = _torch()
    import warnings

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False,
                          do_constant_folding=True)  # fmt: skip


def _externalise(models: dict[str, object], folder: Path) -> dict[str, int]:
    """Save the graphs with their weights outside: the encoder's in its own file, the two
    decoders' in one shared file, each distinct tensor (by content) stored once. Returns the
    data files' sizes."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    def move(model, data_name: str, handle, stored: dict) -> None:
        for t in model.graph.initializer:
            array = numpy_helper.to_array(t)
            if array.nbytes < 1024:
                continue
            blob = np.ascontiguousarray(array).tobytes()
            key = (t.data_type, tuple(t.dims), hashlib.sha256(blob).hexdigest())
            if key not in stored:
                pos = handle.tell()
                pad = (-pos) % 4096
                handle.write(b"\0" * pad)
                stored[key] = (pos + pad, len(blob))
                handle.write(blob)
            offset, length = stored[key]
            for field in ("float_data", "int32_data", "int64_data", "double_data"):
                t.ClearField(field)
            t.raw_data = blob  # set_external_data asks for it, then it goes
            set_external_data(t, data_name, offset, length)
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL

    sizes = {}
    for data_name, roles in ((ENCODE_DATA, ["encode"]),
                             (DECODE_DATA, ["decode_full", "decode_step"])):  # fmt: skip
        stored: dict = {}
        with open(folder / data_name, "wb") as handle:
            for role in roles:
                move(models[role], data_name, handle, stored)
        for role in roles:
            onnx.save_model(models[role], str(folder / FILES[role]))
        sizes[data_name] = (folder / data_name).stat().st_size
    return sizes


def build(dest: Path = DEST) -> dict:
    torch = _torch()
    import onnx

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    start = time.perf_counter()
    codec = build_codec()
    _, Encode, DecodeFull, DecodeStep = _modules()
    total = sum(p.numel() for p in codec.parameters())
    decode = codec.decode_path_params()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    raw = tmp / "raw"
    raw.mkdir()
    timings = {}
    try:
        t0 = time.perf_counter()
        wave = torch.randn(1, CHANNELS, 2 * FRAME) * 0.1
        _export(Encode(codec).eval(), (wave, torch.tensor([2 * FRAME], dtype=torch.int32)),
                raw / "encode.onnx", ["waveform", "input_lengths"],
                ["audio_codes", "audio_code_lengths"],
                {"waveform": {0: "batch", 2: "samples"}, "input_lengths": {0: "batch"},
                 "audio_codes": {0: "batch", 1: "frames"},
                 "audio_code_lengths": {0: "batch"}})  # fmt: skip
        timings["export_encode_s"] = time.perf_counter() - t0
        codes = torch.randint(0, CODES, (1, 2, BOOKS), dtype=torch.int32)
        lengths = torch.tensor([2], dtype=torch.int32)
        t0 = time.perf_counter()
        _export(DecodeFull(codec).eval(), (codes, lengths), raw / "decode_full.onnx",
                ["audio_codes", "audio_code_lengths"], ["audio", "audio_lengths"],
                {"audio_codes": {0: "batch", 1: "frames"}, "audio_code_lengths": {0: "batch"},
                 "audio": {0: "batch", 2: "samples"},
                 "audio_lengths": {0: "batch"}})  # fmt: skip
        timings["export_decode_full_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        state = [torch.from_numpy(a) for a in fresh_state()]
        _export(
            DecodeStep(codec).eval(),
            (codes, lengths, *state),
            raw / "decode_step.onnx",
            ["audio_codes", "audio_code_lengths", *state_names("input")],
            ["audio", "audio_lengths", *state_names("output")],
            {"audio_codes": {1: "frames"}, "audio": {2: "samples"}},
        )
        timings["export_decode_step_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        models = {}
        for role in FILES:
            model = onnx.load(str(raw / f"{role}.onnx"))
            model.producer_name = "moss-gguf benchmarks/nano_codec.py"
            models[role] = model
        sizes = _externalise(models, tmp)
        shutil.rmtree(raw)
        (tmp / META).write_text(json.dumps(meta(), indent=2) + "\n", encoding="utf-8")
        facts = {"params_total": total, "params_release": RELEASE_PARAMS,
                 "params_decode_path": decode, "params_decode_path_release": "11.06M",
                 "data_bytes": sizes}  # fmt: skip
        (tmp / "build.json").write_text(json.dumps(facts, indent=2) + "\n")
        (tmp / ".version").write_text(VERSION)
        timings["save_s"] = time.perf_counter() - t0
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    timings["build_s"] = time.perf_counter() - start
    facts.update(timings)
    (dest / "build.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def ensure(dest: Path = DEST) -> Path:
    stamp = dest / ".version"
    if not (stamp.is_file() and stamp.read_text().strip() == VERSION):
        facts = build(dest)
        print(json.dumps(facts, indent=2), flush=True)
    return dest


# ---------------------------------------------------------------------------------------------
# measure


def load() -> float:
    return os.getloadavg()[0]


def session(path: Path, threads: int, spin: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def random_codes(frames: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CODES, (1, frames, BOOKS)).astype(np.int32)


def stream_numpy(sess, codes: np.ndarray, per_call: int) -> tuple[float, list[np.ndarray]]:
    """Frames a call PER_CALL through decode_step with numpy feeds (as upstream's runtime and
    ours): wall seconds, the audio pieces."""
    ins, outs = state_names("input"), state_names("output")
    names = [o.name for o in sess.get_outputs()]
    where = {n: i for i, n in enumerate(names)}
    state = dict(zip(ins, fresh_state(), strict=True))
    pieces = []
    start = time.perf_counter()
    for f in range(0, codes.shape[1], per_call):
        chunk = codes[:, f : f + per_call]
        feeds = {
            "audio_codes": chunk,
            "audio_code_lengths": np.array([chunk.shape[1]], np.int32),
            **state,
        }
        result = sess.run(None, feeds)
        state = {i: result[where[o]] for i, o in zip(ins, outs, strict=True)}
        pieces.append(result[0])
    return time.perf_counter() - start, pieces


def stream_bound(sess, codes: np.ndarray, per_call: int) -> tuple[float, list[np.ndarray]]:
    """The same with io_binding: the state lives in two sets of OrtValues that swap roles as
    inputs and outputs (no copy in or out); only the codes and the audio cross."""
    import onnxruntime as ort

    ins, outs = state_names("input"), state_names("output")
    sets = [
        [ort.OrtValue.ortvalue_from_numpy(a) for a in fresh_state()],
        [ort.OrtValue.ortvalue_from_numpy(a) for a in fresh_state()],
    ]
    binding = sess.io_binding()
    pieces = []
    start = time.perf_counter()
    for n, f in enumerate(range(0, codes.shape[1], per_call)):
        chunk = np.ascontiguousarray(codes[:, f : f + per_call])
        src, dst = sets[n % 2], sets[(n + 1) % 2]
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input("audio_codes", chunk)
        binding.bind_cpu_input("audio_code_lengths", np.array([chunk.shape[1]], np.int32))
        for name, value in zip(ins, src, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("audio")  # bound outputs come back in the order bound
        binding.bind_output("audio_lengths")
        for name, value in zip(outs, dst, strict=True):
            binding.bind_ortvalue_output(name, value)
        sess.run_with_iobinding(binding)
        pieces.append(binding.get_outputs()[0].numpy())
    return time.perf_counter() - start, pieces


def decode_full(sess, codes: np.ndarray) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    audio, _ = sess.run(
        None, {"audio_codes": codes, "audio_code_lengths": np.array([codes.shape[1]], np.int32)}
    )
    return time.perf_counter() - start, audio


GROUPS = {  # ORT kernels by what they do in decode_step
    "linears + attention matmuls": {"MatMul", "FusedMatMul", "Gemm"},
    "state rewrite (ScatterElements)": {"ScatterElements"},
    "softmax + mask": {
        "Softmax",
        "Where",
        "GreaterOrEqual",
        "Less",
        "And",
        "Equal",
        "Not",
        "Expand",
        "ConstantOfShape",
    },
    "norms, GELU, RoPE, residual (elementwise)": {
        "LayerNormalization",
        "Gelu",
        "Mul",
        "Add",
        "Sub",
        "Div",
        "Cos",
        "Sin",
        "Mod",
        "Erf",
    },
}  # everything else: shape and layout glue (Shape, Gather, Unsqueeze, Concat, Reshape, ...)


def profile(folder: Path, threads: int, per_call: int, frames: int) -> dict:
    """Where decode_step's time goes (ORT's profiler, spinning off): share of kernel time by
    GROUPS, and run() wall against the kernels' sum."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    options.enable_profiling = True
    scratch = Path(tempfile.mkdtemp(prefix="nano-codec-prof."))
    options.profile_file_prefix = str(scratch / "prof")
    sess = ort.InferenceSession(str(folder / FILES["decode_step"]), options,
                                providers=["CPUExecutionProvider"])  # fmt: skip
    stream_numpy(sess, random_codes(frames), per_call)
    events = json.loads(Path(sess.end_profiling()).read_text())
    shutil.rmtree(scratch, ignore_errors=True)
    kernels: dict[str, float] = {}
    run_us = 0.0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            group = next((g for g, ops in GROUPS.items() if op in ops), "shape/layout glue")
            kernels[group] = kernels.get(group, 0.0) + e["dur"]
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            run_us += e["dur"]
    total = sum(kernels.values())
    return {
        "run_ms_per_frame": run_us / 1000 / frames,
        "kernels_ms_per_frame": total / 1000 / frames,
        "shares": {g: v / total for g, v in sorted(kernels.items(), key=lambda kv: -kv[1])},
    }


def measure(args) -> dict:
    folder = ensure()
    step_path, full_path = folder / FILES["decode_step"], folder / FILES["decode_full"]
    threads = [int(t) for t in args.threads.split(",")]
    groups = [int(g) for g in args.frames_per_call.split(",")]
    codes = random_codes(args.frames)
    settings = [(t, spin) for t in threads for spin in (False, True)]
    sessions = {s: session(step_path, *s) for s in settings}
    for s in settings:  # warm: first runs allocate
        stream_numpy(sessions[s], codes[:, :8], 4)
    samples: dict[tuple, list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for g in groups:
            for s in settings:
                for how, fn in (("numpy", stream_numpy), ("bound", stream_bound)):
                    if how == "bound" and args.no_bound:
                        continue
                    before = load()
                    wall, _ = fn(sessions[s], codes, g)
                    samples.setdefault((s[0], s[1], g, how), []).append(
                        (1000 * wall / args.frames, before)
                    )
                    print(f"round {r} threads {s[0]} spin {int(s[1])} frames/call {g} {how}: "
                          f"{1000 * wall / args.frames:.2f} ms/frame (load {before:.2f})",
                          flush=True)  # fmt: skip
    full = {}
    for t in threads:
        full_sessions = {spin: session(full_path, t, spin) for spin in (False, True)}
        for sess in full_sessions.values():
            decode_full(sess, codes[:, :8])
        for _ in range(args.rounds):
            for spin, sess in full_sessions.items():
                before = load()
                wall, _ = decode_full(sess, codes[:, : args.full_frames])
                full.setdefault((t, spin), []).append((1000 * wall / args.full_frames, before))
                print(f"decode_full threads {t} spin {int(spin)} {args.full_frames} frames: "
                      f"{1000 * wall / args.full_frames:.2f} ms/frame (load {before:.2f})",
                      flush=True)  # fmt: skip
    profiles = {}
    if not args.no_profile:
        for g in groups:
            before = load()
            profiles[g] = {**profile(folder, threads[0], g, min(args.frames, 80)),
                           "load": before}  # fmt: skip
    return {"samples": samples, "full": full, "profiles": profiles}


def table(result: dict, args) -> str:
    samples, full = result["samples"], result["full"]
    lines = [f"decode_step, {args.frames} frames a stream, ms a frame (median of {args.rounds}; "
             f"load = 1-min load average before each run, min–max)", "",
             "| threads | spinning | frames/call | numpy feeds | io_binding | state copy share "
             "| load |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    keys = sorted({k[:3] for k in samples}, key=lambda k: (k[0], k[1], k[2]))
    for t, spin, g in keys:
        numpy_ms = [m for m, _ in samples[(t, spin, g, "numpy")]]
        bound = samples.get((t, spin, g, "bound"), [])
        loads = [lo for how in ("numpy", "bound") for _, lo in samples.get((t, spin, g, how), [])]
        a = statistics.median(numpy_ms)
        b = statistics.median(m for m, _ in bound) if bound else float("nan")
        share = (a - b) / a if bound else float("nan")
        lines.append(
            f"| {t} | {'on' if spin else 'off'} | {g} | {a:.2f} | {b:.2f} | "
            f"{100 * share:.0f} % | {min(loads):.2f}–{max(loads):.2f} |"
        )
    lines += [
        "",
        f"decode_full, {args.full_frames} frames in one call, ms a frame",
        "",
        "| threads | spinning | ms/frame | load |",
        "|---|---|---|---|",
    ]
    for (t, spin), runs in sorted(full.items()):
        ms = statistics.median(m for m, _ in runs)
        loads = [lo for _, lo in runs]
        lines.append(
            f"| {t} | {'on' if spin else 'off'} | {ms:.2f} | {min(loads):.2f}–{max(loads):.2f} |"
        )
    if result.get("profiles"):
        groups = list(next(iter(result["profiles"].values()))["shares"])
        lines += ["", "decode_step under ORT's profiler (1st thread count, spinning off; the "
                  "profiler adds its own time): share of kernel time", "",
                  "| frames/call | run() ms/frame | " + " | ".join(groups) + " | load |",
                  "|---|---|" + "---|" * len(groups) + "---|"]  # fmt: skip
        for g, p in result["profiles"].items():
            shares = " | ".join(f"{100 * p['shares'].get(k, 0):.0f} %" for k in groups)
            lines.append(f"| {g} | {p['run_ms_per_frame']:.2f} | {shares} | {p['load']:.2f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# check: our runtime on it


def check(args) -> dict:
    folder = ensure()
    from moss_gguf_cli.nano.codec import NanoCodecRuntime
    from moss_gguf_cli.nano.codec_folder import open_nano_codec

    codec = open_nano_codec(folder)
    runtime = NanoCodecRuntime(codec, threads=1)
    codes = random_codes(args.frames, seed=7)[0]
    stream = runtime.stream()
    start = time.perf_counter()
    pieces = [stream.decode(codes[f : f + 1]) for f in range(codes.shape[0])]
    wall = time.perf_counter() - start
    streamed = np.concatenate(pieces, axis=1)
    sess = session(folder / FILES["decode_full"], 1, False)
    _, whole = decode_full(sess, codes[None].astype(np.int32))
    whole = whole[0]
    diff = np.abs(streamed - whole)
    per_frame = diff.reshape(CHANNELS, -1, FRAME).max(axis=(0, 2))
    # and grouped as our runtime's plan groups them (1, 2, 4, then 8)
    from moss_gguf_cli.nano.codec import DecodePlan

    plan, grouped, f, calls = DecodePlan(), [], 0, 0
    stream = runtime.stream()
    while f < codes.shape[0]:
        take = plan.ready(calls, codes.shape[0] - f) or codes.shape[0] - f
        grouped.append(stream.decode(codes[f : f + take]))
        f, calls = f + take, calls + 1
    grouped_diff = np.abs(np.concatenate(grouped, axis=1) - whole)
    # the encoder too: a clip in, codes out
    wave = np.random.default_rng(3).standard_normal((CHANNELS, 5 * FRAME)).astype(np.float32)
    enc = runtime.encode(wave * 0.1)
    return {"frames": args.frames, "streamed_1_a_call_ms_per_frame": 1000 * wall / args.frames,
            "max_abs_diff_1_a_call": float(diff.max()),
            "max_abs_diff_plan_groups": float(grouped_diff.max()),
            "max_abs_diff_frames_150_on": float(per_frame[150:].max())
            if args.frames > 150 else None,
            "max_abs_sample_full": float(np.abs(whole).max()),
            "rms_full": float(np.sqrt(np.mean(whole ** 2))),
            "worst_frame": int(per_frame.argmax()),
            "encode_codes_shape": list(enc.shape),
            "encode_codes_range": [int(enc.min()), int(enc.max())]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "measure", "check"])
    ap.add_argument("--clean", action="store_true", help="delete the built codec first")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--frames-per-call", default="1,4,8")
    ap.add_argument(
        "--frames",
        type=int,
        default=160,
        help="frames a stream (the 400 Hz stage's 1600-token window fills at 50)",
    )
    ap.add_argument("--full-frames", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-bound", action="store_true", help="numpy feeds only")
    ap.add_argument("--no-profile", action="store_true", help="skip the ORT profile")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.clean:
        shutil.rmtree(DEST, ignore_errors=True)
    if args.command == "build":
        if (DEST / ".version").is_file():
            print(f"{DEST} exists (--clean to rebuild)")
            print((DEST / "build.json").read_text())
            return
        print(json.dumps(build(), indent=2))
        return
    if args.command == "check":
        result = check(args)
        print(json.dumps(result, indent=2))
    else:
        result = measure(args)
        print(table(result, args))
        result = {
            "samples": {"/".join(map(str, k)): v for k, v in result["samples"].items()},
            "full": {"/".join(map(str, k)): v for k, v in result["full"].items()},
            "profiles": result["profiles"],
        }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
