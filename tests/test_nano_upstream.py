"""Ours against upstream's own MOSS-TTS-Nano code, through the goldens it made once
(tests/data/nano_upstream/, written by scripts/nano_upstream_goldens.py from the Hub repo's remote
code; README.md there says how and from which files):

- llama.cpp's hidden states from our F32 GGUF (nano/global_gguf) on our embeddings of upstream's
  rows (a prompt from `build_inference_input_ids`, then 40 teacher-forced frames);
- our local transformer and tied heads (nano/local, the arrays as the Nano folder holds them) on
  upstream's global hidden states: the continue/stop logits and every channel's audio logits;
- our prompt rows (nano/prompt) with and without a reference, and our long-text chunks.

The checkpoints are rebuilt here exactly as the script built them (builtin:tiny-nano and
tests/tiny_nano.py's release writer: .bin and safetensors, bf16 and f32); a fingerprint of their
values guards against a writer that changed since.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tiny_nano import nano_config, release_state, write_release

from moss_gguf_cli.nano import ggml_global
from moss_gguf_cli.nano.checkpoint import NanoCheckpoint, open_nano
from moss_gguf_cli.nano.engine import NanoEngine
from moss_gguf_cli.nano.ggml_global import GgmlGlobal
from moss_gguf_cli.nano.global_gguf import write_global_f32
from moss_gguf_cli.nano.layout import local_files
from moss_gguf_cli.nano.local import LocalTransformer
from moss_gguf_cli.nano.prompt import NanoTokenizer, prompt_ids, prompt_rows, split_text
from moss_gguf_cli.nano.tiny import ensure_tiny_nano
from moss_gguf_cli.tts.backbone import Backbone, BackboneSettings

DATA = Path(__file__).parent / "data" / "nano_upstream"
GOLDEN = json.loads((DATA / "goldens.json").read_text(encoding="utf-8"))
ARRAYS = np.load(DATA / "goldens.npz")
NAMES = [c["name"] for c in GOLDEN["checkpoints"]]

# Measured (worst checkpoint; docs/nano.md "Parity with upstream's own code"). llama.cpp's
# hidden states cannot reach 1e-4 against upstream's float32 math: ggml's CPU GELU reads a
# float16 table (GGML_GELU_FP16: input and output rounded to f16), which costs about 3e-4 at
# these dims, and the pinned llama.cpp is the user's, not patched (tests/test_nano_global_gguf.py
# shows everything else agrees to 1e-4 once the GELU is evaluated as ggml evaluates it).
GLOBAL = 5e-4  # ‖ours − upstream‖ / ‖upstream‖ over every kept row
GLOBAL_ROW = 1e-3  # the worst row
# Against upstream's own model with only its GELU swapped for ggml's table (the goldens'
# hidden_ggml_gelu): issue #47's 1e-4 over the whole array; a row where one f16 rounding of a
# GELU input falls the other way reaches about 1.3e-4.
GGML_GELU = 1e-4
GGML_GELU_ROW = 2e-4
LOCAL = 1e-4  # our local transformer and heads on upstream's hidden states: issue #47's bar


def relative(ours: np.ndarray, reference: np.ndarray) -> float:
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(ours - reference) / np.linalg.norm(reference))


def fingerprint(checkpoint: NanoCheckpoint) -> str:
    """The script's state_fingerprint: sha256 over the used tensors' names and float32 values."""
    tensors, digest = checkpoint.tensors, hashlib.sha256()
    for name in sorted(set(tensors) - set(checkpoint.unused)):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(np.asarray(tensors[name], np.float32)).tobytes())
    return digest.hexdigest()


def build(spec: dict[str, Any], folder: Path) -> Path:
    """The checkpoint folder of SPEC, as scripts/nano_upstream_goldens.py wrote it."""
    tiny = ensure_tiny_nano()
    if spec["source"] == "builtin":
        return tiny
    folder.mkdir(parents=True)
    config = nano_config(**GOLDEN["release_gpt2"])
    state = release_state(config, torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32,
                          seed=spec["seed"])  # fmt: skip
    if spec["format"] == "bin":
        write_release(folder, config, state)
    else:
        (folder / "config.json").write_text(json.dumps(config))
        save_file({n: t for n, t in state.items() if "lm_head" not in n},
                  str(folder / "model.safetensors"))  # fmt: skip
    shutil.copyfile(tiny / "tokenizer.model", folder / "tokenizer.model")
    return folder


def embed(checkpoint: NanoCheckpoint, rows: np.ndarray) -> np.ndarray:
    """Our engine's embedding of ROWS (NanoEngine.embed on the checkpoint's float32 tables)."""
    nano, t = checkpoint.nano, checkpoint.tensors
    tables = types.SimpleNamespace(
        nano=nano, wte=np.asarray(t["transformer.wte.weight"], np.float32),
        audio=[np.asarray(t[f"audio_embeddings.{q}.weight"], np.float32)
               for q in range(nano.n_vq)])  # fmt: skip
    return NanoEngine.embed(tables, rows.astype(np.int64))


@pytest.fixture(scope="module", params=NAMES)
def case(request, tmp_path_factory) -> tuple[dict[str, Any], NanoCheckpoint, dict[str, np.ndarray]]:
    spec = next(c for c in GOLDEN["checkpoints"] if c["name"] == request.param)
    checkpoint = open_nano(build(spec, tmp_path_factory.mktemp(spec["name"]) / "model"))
    assert fingerprint(checkpoint) == spec["state_fingerprint"], (
        "the checkpoint writer changed since the goldens were made: rerun the script"
    )
    golden = {k.split("/", 1)[1]: ARRAYS[k] for k in ARRAYS.files
              if k.startswith(spec["name"] + "/")}  # fmt: skip
    return spec, checkpoint, golden


def test_llamas_hidden_states_equal_upstreams(case, tmp_path):
    spec, checkpoint, golden = case
    rows, kept = golden["rows"], golden["hidden_rows"].astype(np.int64)
    assert rows.shape[0] - int(golden["n_prompt"]) == GOLDEN["frames"] >= 40
    gguf = write_global_f32(checkpoint, tmp_path / "global-f32.gguf")
    n = -(-rows.shape[0] // 64) * 64
    settings = BackboneSettings(n_ctx=n, n_batch=n, n_threads=2, n_gpu_layers=0,
                                kv_cache_type_k="f32", kv_cache_type_v="f32",
                                flash_attn="disabled")  # fmt: skip
    with Backbone(gguf, settings) as backbone:
        ours = np.array(backbone.hidden_states(embed(checkpoint, rows)))[kept]
    got = {}
    for key in ("hidden", "hidden_ggml_gelu"):
        reference = golden[key]
        got[key] = (
            relative(ours, reference),
            max(relative(a, b) for a, b in zip(ours, reference, strict=True)),
        )
        print(f"{spec['name']}: {key} {got[key][0]:.2e} (worst row {got[key][1]:.2e})")
    assert got["hidden"][0] <= GLOBAL and got["hidden"][1] <= GLOBAL_ROW, got
    table = got["hidden_ggml_gelu"]
    assert table[0] <= GGML_GELU and table[1] <= GGML_GELU_ROW, got


def against_goldens(ours: np.ndarray, golden: dict[str, np.ndarray], kept: np.ndarray,
                    name: str, what: str) -> dict[str, tuple[float, float]]:  # fmt: skip
    """(whole array, worst row) of OURS (the KEPT rows of the goldens' hidden states) against
    upstream's hidden states and against them with ggml's GELU."""
    got = {}
    for key in ("hidden", "hidden_ggml_gelu"):
        reference = golden[key][kept]
        got[key] = (relative(ours, reference),
                    max(relative(a, b) for a, b in zip(ours, reference, strict=True)))  # fmt: skip
        print(f"{name} {what}: {key} {got[key][0]:.2e} (worst row {got[key][1]:.2e})")
    return got


def test_our_ggml_global_equals_upstreams(case, tmp_path, monkeypatch):
    """nano/ggml_global, what the engine runs, on the same F32 GGUF with float32 keys and
    values: every row stepped alone (graphs over the cached keys rounded up to a bucket,
    masked), and the prompt fed whole then the frames stepped. Both are held to the bounds
    llama.cpp is held to above; they share its one difference from upstream (ggml's GELU).
    Two step graphs kept instead of 8: the ~220 rows cross 7 buckets, so graphs are dropped and
    built again on the way."""
    monkeypatch.setattr(ggml_global, "STEP_GRAPHS_KEPT", 2)
    spec, checkpoint, golden = case
    rows, kept = golden["rows"], golden["hidden_rows"].astype(np.int64)
    n_prompt = int(golden["n_prompt"])
    gguf = write_global_f32(checkpoint, tmp_path / "global-f32.gguf")
    embeds = embed(checkpoint, rows).astype(np.float32)
    model = GgmlGlobal(gguf, rows.shape[0], threads=2, kv_type="F32")
    try:
        stepped = np.array([model.step(row).copy() for row in embeds])
        model.reset()
        fed = [model.prefill(embeds[:n_prompt])]
        fed += [model.step(row).copy() for row in embeds[n_prompt:]]
    finally:
        model.close()
    from_prompt = kept[kept >= n_prompt - 1]
    for what, ours, at in (("stepped", stepped[kept], slice(None)),
                           ("prefilled", np.array(fed)[from_prompt - n_prompt + 1],
                            np.searchsorted(kept, from_prompt))):  # fmt: skip
        got = against_goldens(ours, {k: golden[k][at] for k in ("hidden", "hidden_ggml_gelu")},
                              slice(None), spec["name"], what)  # fmt: skip
        assert got["hidden"][0] <= GLOBAL and got["hidden"][1] <= GLOBAL_ROW, (what, got)
        table = got["hidden_ggml_gelu"]
        assert table[0] <= GGML_GELU and table[1] <= GGML_GELU_ROW, (what, got)


def test_local_logits_equal_upstreams(case):
    spec, checkpoint, golden = case
    nano, tensors = checkpoint.nano, checkpoint.tensors
    arrays = {Path(f).name[: -len(".npy")]: np.asarray(tensors[name], np.float32)
              for f, name in local_files(nano).items()}  # fmt: skip
    local = LocalTransformer(arrays, nano.dims, nano.local_layers, nano.n_vq + 1)
    wte = np.asarray(tensors["transformer.wte.weight"], np.float32)
    audio = [np.asarray(tensors[f"audio_embeddings.{q}.weight"], np.float32)
             for q in range(nano.n_vq)]  # fmt: skip
    tokens = nano.tokens
    slot, end = tokens["audio_assistant_slot_token_id"], tokens["audio_end_token_id"]
    n_prompt, frames = int(golden["n_prompt"]), GOLDEN["frames"]
    where = {int(r): i for i, r in enumerate(golden["hidden_rows"])}
    ids = golden["audio_ids"].astype(np.int64)
    text = np.empty((frames, 2), np.float32)
    logits = np.empty(golden["audio_logits"].shape, np.float32)
    lse = np.empty(golden["audio_lse"].shape)
    argmax = np.empty(golden["audio_argmax"].shape, np.int64)
    for t in range(frames):
        local.reset()
        text[t] = wte[[slot, end]] @ local.step(golden["hidden"][where[n_prompt - 1 + t]])
        x = wte[slot]
        codes = golden["rows"][n_prompt + t, 1:].astype(np.int64)
        for k in range(nano.n_vq):
            channel = (audio[k] @ local.step(x)).astype(np.float64)
            logits[t, k], argmax[t, k] = channel[ids[k]], channel.argmax()
            lse[t, k] = channel.max() + np.log(np.exp(channel - channel.max()).sum())
            x = audio[k][codes[k]]
    got = (relative(text, golden["text_logits"]), relative(logits, golden["audio_logits"]),
           relative(lse, golden["audio_lse"]))  # fmt: skip
    print(f"{spec['name']}: local text {got[0]:.2e}, audio {got[1]:.2e}, logsumexp {got[2]:.2e}")
    assert max(got) <= LOCAL, got
    assert (argmax == golden["audio_argmax"]).all()


def test_prompt_rows_equal_upstreams():
    """With and without a reference, on the tiny tokenizer (upstream's SentencePiece class)."""
    checkpoint = open_nano(ensure_tiny_nano())
    nano, tok = checkpoint.nano, NanoTokenizer(ensure_tiny_nano() / "tokenizer.model")
    for case in GOLDEN["prompts"]:
        key, text = case["key"], case["text"]
        plain = prompt_rows(prompt_ids(tok, nano.tokens, text, False), None, nano.tokens,
                            nano.n_vq, nano.audio_pad)  # fmt: skip
        assert plain.tolist() == ARRAYS[f"{key}/continuation"].tolist(), text
        reference = ARRAYS[f"{key}/reference"].astype(np.int64)
        clone = prompt_rows(prompt_ids(tok, nano.tokens, text, True), reference, nano.tokens,
                            nano.n_vq, nano.audio_pad)  # fmt: skip
        assert clone.tolist() == ARRAYS[f"{key}/voice_clone"].tolist(), text


def test_long_text_chunks_equal_upstreams():
    """Upstream speaks its split when it has more than one chunk, else the text as given."""
    tok = NanoTokenizer(ensure_tiny_nano() / "tokenizer.model")
    assert {len(c["chunks"]) > 1 for c in GOLDEN["splits"]} == {True}
    for case in GOLDEN["splits"]:
        chunks = case["chunks"] if len(case["chunks"]) > 1 else [case["text"]]
        assert split_text(tok, case["text"], case["max_tokens"]) == chunks, case["text"]
