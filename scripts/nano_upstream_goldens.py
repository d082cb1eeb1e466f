"""Make tests/data/nano_upstream/ from upstream's own MOSS-TTS-Nano code, once.

Upstream's model code lives in the Hub repo OpenMOSS-Team/MOSS-TTS-Nano-100M (remote code:
configuration_moss_tts_nano.py, modeling_moss_tts_nano.py, gpt2_decoder.py, prompting.py,
tokenization_moss_tts_nano.py, __init__.py). CI cannot reach it, so tests/test_nano_upstream.py
compares ours against what this script recorded. It imports upstream's files as a package from
the folder given (nothing of them is copied into this repo), builds tiny Nano checkpoints the
way the tests build them (builtin:tiny-nano, and tests/tiny_nano.py's release writer as .bin and
safetensors, bf16 and f32), and writes:

- goldens.npz / goldens.json, per checkpoint: the rows upstream's `build_inference_input_ids`
  makes (continuation or voice_clone with random reference codes) followed by 40 teacher-forced
  frames (upstream's `_build_generation_row`); upstream's global last hidden states (after ln_f)
  over them (every frame row and PROMPT_KEPT of the prompt's rows are kept), and the same with
  only upstream's GELU swapped for ggml's float16 table; for each frame the local transformer's
  outputs as `_iter_generation_events` computes them with the frame's codes forced: text
  logits at [audio_assistant_slot, audio_end] and every channel's audio logits (at most
  AUDIO_IDS ids a channel, with each channel's logsumexp and argmax over all ids, to keep the
  files small);
- the prompt rows with and without a reference for a few texts, through upstream's prompting
  and its SentencePiece tokenizer class on the tiny tokenizer.model;
- `_split_text_into_best_sentences` on long texts at two budgets.

All math is float32 on the CPU with eager attention (upstream's own CPU fallback); bf16
checkpoints are loaded into upstream's float32 model. Run:

    PYTHONPATH=. python scripts/nano_upstream_goldens.py /work/upstream-nano

where the folder holds the six files of ml-inory/moss-tts-nano.axera, models/llm/repo/ at
commit 20017d781d46fe4307574fe05cc84228b4de9bec (a verbatim snapshot of the Hub repo's remote
code; goldens.json records each file's sha256). torchaudio is stood in for when absent:
upstream imports it only to load clips, which this script never asks of it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "nano_upstream"
sys.path.insert(0, str(ROOT / "tests"))  # tests/tiny_nano.py: the release writer the tests use

UPSTREAM_FILES = ("__init__.py", "configuration_moss_tts_nano.py", "modeling_moss_tts_nano.py",
                  "gpt2_decoder.py", "prompting.py", "tokenization_moss_tts_nano.py")  # fmt: skip
UPSTREAM_ORIGIN = {
    "hub_repo": "OpenMOSS-Team/MOSS-TTS-Nano-100M (remote code)",
    "vendored_in": "github.com/ml-inory/moss-tts-nano.axera",
    "path": "models/llm/repo/",
    "commit": "20017d781d46fe4307574fe05cc84228b4de9bec",
}
COMMAND = "PYTHONPATH=. python scripts/nano_upstream_goldens.py <folder with upstream's files>"

FRAMES = 40  # teacher-forced frames after each prompt
REFERENCE_FRAMES = 5  # random reference codes in voice_clone mode
AUDIO_IDS = 24  # audio logits kept per channel where a codebook is larger than this
PROMPT_KEPT = 24  # hidden states kept of a prompt's rows (evenly spaced, the last included)
SEED = 47

# the tests' release writer at small sizes; the text vocabulary is the tiny tokenizer's 384
RELEASE_GPT2 = {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": 192, "vocab_size": 384,
                "n_positions": 512}  # fmt: skip
# (.bin, safetensors) x (bf16, f32), each with one of upstream's two prompt modes
CHECKPOINTS: list[dict[str, Any]] = [
    {"name": "tiny-nano", "source": "builtin", "format": "bin", "dtype": "bf16",
     "mode": "voice_clone", "text": "Hello, world! 你好。"},
    {"name": "release-bin-f32", "source": "release", "format": "bin", "dtype": "f32", "seed": 11,
     "mode": "continuation", "text": "The quick brown fox."},
    {"name": "release-st-bf16", "source": "release", "format": "safetensors", "dtype": "bf16",
     "seed": 12, "mode": "voice_clone", "text": "语音合成，测试。"},
    {"name": "release-st-f32", "source": "release", "format": "safetensors", "dtype": "f32",
     "seed": 13, "mode": "continuation", "text": "Mixed 中文 and English."},
]  # fmt: skip

PROMPT_TEXTS = [
    "Hello, world! This is MOSS-TTS-Nano speaking.",
    "你好，世界。今天天气很好！",
    "MOSS-TTS-Nano 支持 English 和中文，对吧？",
    "  Numbers 123, 4.5 and   odd  spacing\nacross lines ",
]
SPLIT_TEXTS = [
    "The first sentence is short. The second one goes on a little longer, with a clause or two, "
    'and a comma; then a semicolon! Is this a question? Yes: it is. "Quoted words end here." '
    "Finally (in brackets) the last sentence of the paragraph arrives, slowly, carefully, and "
    "without any hurry at all, because long sentences are what the splitter is for.",
    "今天天气很好，我们去公园散步吧。公园里有很多人，有的在跑步，有的在打太极拳，还有的在唱歌！"
    "你想去哪里？我想去湖边看看，那里的风景最美；湖面上有几只小船，慢慢地划过。",
    "this text has no punctuation at all and simply keeps going on and on with plain words "
    "until the budget forces a cut somewhere in the middle of the stream of words",
    "MOSS-TTS-Nano 是一个小模型, it runs on CPUs. 它支持中文和英文：mixed text works too!",
]
SPLIT_BUDGETS = [75, 12]


def import_upstream(folder: Path) -> types.ModuleType:
    """Upstream's remote code as the package `upstream_nano` (its files import each other
    relatively)."""
    import transformers.modeling_utils  # noqa: F401 - before the torchaudio stand-in below
    import transformers.tokenization_utils_base  # noqa: F401

    try:
        import torchaudio  # noqa: F401
    except ImportError:
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    spec = importlib.util.spec_from_file_location(
        "upstream_nano", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["upstream_nano"] = package
    spec.loader.exec_module(package)
    return package


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checkpoint(spec: dict[str, Any], folder: Path) -> Path:
    """The checkpoint folder SPEC names (tests/test_nano_upstream.py rebuilds it the same way)."""
    import torch
    from safetensors.torch import save_file
    from tiny_nano import nano_config, release_state, write_release

    from moss_gguf_cli.nano.tiny import ensure_tiny_nano

    tiny = ensure_tiny_nano()
    if spec["source"] == "builtin":
        return tiny
    folder.mkdir(parents=True)
    config = nano_config(**RELEASE_GPT2)
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    state = release_state(config, dtype, seed=spec["seed"])
    if spec["format"] == "bin":
        write_release(folder, config, state)
    else:  # as a safetensors release holds it: the tables once, no tied head names
        (folder / "config.json").write_text(json.dumps(config))
        save_file({n: t for n, t in state.items() if "lm_head" not in n},
                  str(folder / "model.safetensors"))  # fmt: skip
    shutil.copyfile(tiny / "tokenizer.model", folder / "tokenizer.model")
    return folder


def state_fingerprint(tensors: dict[str, np.ndarray], unused: list[str]) -> str:
    """sha256 over the names and float32 values of the tensors upstream reads (the release
    writer draws the unused local_transformer.wte from torch's global generator)."""
    digest = hashlib.sha256()
    for name in sorted(set(tensors) - set(unused)):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(np.asarray(tensors[name], np.float32)).tobytes())
    return digest.hexdigest()


def load_upstream_model(upstream: types.ModuleType, folder: Path):
    """Upstream's MossTTSNanoForCausalLM from FOLDER's config and weights, float32, eval."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    config["attn_implementation"] = "eager"  # upstream's CPU fallback (no flash-attn here)
    config["local_transformer_attn_implementation"] = "eager"
    model = upstream.MossTTSNanoForCausalLM(upstream.MossTTSNanoConfig(**config))
    if (folder / "model.safetensors").is_file():
        state = load_file(str(folder / "model.safetensors"))
    else:
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(model.all_tied_weights_keys)
    assert set(missing) <= tied, missing  # the heads are their tables (tie_weights)
    assert set(unexpected) <= {"local_transformer.wte.weight"}, unexpected
    model.tie_weights()
    return model.float().eval(), state


def gelu_as_ggml(x):
    """ggml's CPU GELU (GGML_GELU_FP16 in ggml-cpu/vec.h): the input rounded to float16, the tanh
    form, the output rounded to float16; 0 below -10, x above 10."""
    import torch

    half = x.to(torch.float16).to(torch.float32)
    c = (2 / torch.pi) ** 0.5
    table = (0.5 * half * (1 + torch.tanh(c * (half + 0.044715 * half**3)))).to(torch.float16)
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, table.to(x.dtype)))


def hidden_with_ggml_gelu(model, rows):
    """Upstream's global hidden states with only its GELU swapped for ggml's table: what
    llama.cpp can reach, since the pinned ggml evaluates GELU that way."""
    import torch

    class GgmlGelu(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return gelu_as_ggml(x)

    saved = [block.mlp.act for block in model.transformer.h]
    for block in model.transformer.h:
        block.mlp.act = GgmlGelu()
    try:
        with torch.no_grad():
            return model(input_ids=rows, use_cache=False).global_hidden_states[0]
    finally:
        for block, act in zip(model.transformer.h, saved, strict=True):
            block.mlp.act = act


def global_and_local(model, tokenizer, spec: dict[str, Any], rng: np.random.Generator
                     ) -> dict[str, np.ndarray]:  # fmt: skip
    """Upstream's prompt + FRAMES teacher-forced frames: the global hidden states, and per frame
    the local outputs as `_iter_generation_events` makes them with the frame's codes forced."""
    import torch

    cfg = model.config
    sizes = [int(s) for s in cfg.audio_codebook_sizes]
    reference = None
    if spec["mode"] == "voice_clone":
        reference = torch.tensor(np.stack([rng.integers(0, s, REFERENCE_FRAMES) for s in sizes],
                                          axis=1), dtype=torch.long)  # fmt: skip
    prompt, _ = model.build_inference_input_ids(text=spec["text"], text_tokenizer=tokenizer,
                                                mode=spec["mode"], prompt_audio_codes=reference,
                                                device="cpu")  # fmt: skip
    codes = torch.tensor(np.stack([rng.integers(0, s, FRAMES) for s in sizes], axis=1),
                         dtype=torch.long)  # fmt: skip
    frames = [model._build_generation_row(1, torch.device("cpu"), codes[t : t + 1])
              for t in range(FRAMES)]  # fmt: skip
    rows = torch.cat([prompt, *frames], dim=1)  # (1, S, n_vq + 1)
    n_prompt = prompt.shape[1]
    with torch.no_grad():
        hidden = model(input_ids=rows, attention_mask=torch.ones(rows.shape[:2], dtype=torch.bool),
                       use_cache=False).global_hidden_states[0]  # fmt: skip
        # frame t is made from the hidden state of the row before it
        local_in = hidden[n_prompt - 1 : n_prompt - 1 + FRAMES].unsqueeze(1)  # (F, 1, H)
        text = model.text_lm_head(model._decode_local_last_hidden_state(local_in))
        slot, end = cfg.audio_assistant_slot_token_id, cfg.audio_end_token_id
        # every frame row, and PROMPT_KEPT of the prompt's (the file stays small; every row
        # is still computed, so each kept row carries all the rows before it)
        stride = -(-n_prompt // PROMPT_KEPT)
        kept_rows = sorted({*range(n_prompt - 1, -1, -stride), *range(n_prompt, rows.shape[1])})
        out = {"rows": rows[0].numpy().astype(np.int16), "n_prompt": np.array(n_prompt),
               "hidden_rows": np.array(kept_rows, np.int16),
               "hidden": hidden[kept_rows].numpy().astype(np.float32),
               "hidden_ggml_gelu": hidden_with_ggml_gelu(model, rows)[kept_rows].numpy(),
               "text_logits": text[:, [slot, end]].numpy().astype(np.float32)}  # fmt: skip
        current = model.transformer.wte(torch.full((FRAMES,), slot, dtype=torch.long))
        kept, logits, lse, argmax = [], [], [], []
        for k, size in enumerate(sizes):
            local_in = torch.cat([local_in, current.unsqueeze(1)], dim=1)
            channel = model.audio_lm_heads[k](model._decode_local_last_hidden_state(local_in))
            ids = np.arange(size) if size <= AUDIO_IDS else np.sort(
                rng.choice(size, AUDIO_IDS, replace=False))  # fmt: skip
            kept.append(ids)
            logits.append(channel[:, torch.from_numpy(ids)].numpy())
            lse.append(torch.logsumexp(channel.double(), dim=-1).numpy())
            argmax.append(channel.argmax(dim=-1).numpy())
            current = model.audio_embeddings[k](codes[:, k])
    out["audio_ids"] = np.stack(kept).astype(np.int16)  # (n_vq, K)
    out["audio_logits"] = np.stack(logits, axis=1).astype(np.float32)  # (F, n_vq, K)
    out["audio_lse"] = np.stack(lse, axis=1)  # (F, n_vq) float64
    out["audio_argmax"] = np.stack(argmax, axis=1).astype(np.int16)  # (F, n_vq)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("upstream", type=Path, help="folder with upstream's remote code files")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import torch
    import transformers

    from moss_gguf_cli.nano.checkpoint import open_nano

    torch.manual_seed(SEED)
    upstream = import_upstream(args.upstream.resolve())
    arrays: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {
        "upstream": {**UPSTREAM_ORIGIN,
                     "sha256": {f: sha256(args.upstream / f) for f in UPSTREAM_FILES}},
        "command": COMMAND,
        "made_with": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "python": platform.python_version(),
                      "moss_gguf_commit": subprocess.run(
                          ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()},
        "frames": FRAMES, "reference_frames": REFERENCE_FRAMES, "audio_ids": AUDIO_IDS,
        "prompt_kept": PROMPT_KEPT,
        "release_gpt2": RELEASE_GPT2, "checkpoints": [], "prompts": [], "splits": [],
    }  # fmt: skip
    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        tiny_model = tokenizer = None
        for spec in CHECKPOINTS:
            folder = write_checkpoint(spec, Path(tmp) / spec["name"])
            model, _ = load_upstream_model(upstream, folder)
            tok = upstream.MossTTSNanoSentencePieceTokenizer(
                vocab_file=str(folder / "tokenizer.model")
            )
            for key, value in global_and_local(model, tok, spec, rng).items():
                arrays[f"{spec['name']}/{key}"] = value
            opened = open_nano(folder)
            fingerprint = state_fingerprint(opened.tensors, opened.unused)
            record["checkpoints"].append({**spec, "state_fingerprint": fingerprint})
            if spec["source"] == "builtin":
                tiny_model, tokenizer = model, tok
        assert tiny_model is not None and tokenizer is not None
        sizes = [int(s) for s in tiny_model.config.audio_codebook_sizes]
        for i, text in enumerate(PROMPT_TEXTS):
            reference = torch.tensor(np.stack([rng.integers(0, s, 3) for s in sizes], axis=1),
                                     dtype=torch.long)  # fmt: skip
            plain, _ = tiny_model.build_inference_input_ids(text, tokenizer, mode="continuation",
                                                            device="cpu")  # fmt: skip
            clone, _ = tiny_model.build_inference_input_ids(
                text, tokenizer, mode="voice_clone", prompt_audio_codes=reference, device="cpu"
            )
            arrays[f"prompt{i}/reference"] = reference.numpy().astype(np.int16)
            arrays[f"prompt{i}/continuation"] = plain[0].numpy().astype(np.int16)
            arrays[f"prompt{i}/voice_clone"] = clone[0].numpy().astype(np.int16)
            record["prompts"].append({"key": f"prompt{i}", "text": text})
        for text in SPLIT_TEXTS:
            for budget in SPLIT_BUDGETS:
                chunks = tiny_model._split_text_into_best_sentences(tokenizer, text, budget)
                record["splits"].append({"text": text, "max_tokens": budget, "chunks": chunks})
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "goldens.npz", **arrays)
    (args.out / "goldens.json").write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n",
                                           encoding="utf-8")  # fmt: skip
    for path in sorted(args.out.iterdir()):
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
