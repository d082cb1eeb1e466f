"""Make tests/data/realtime_upstream/ from upstream's own MOSS-TTS-Realtime code, once.

Upstream's code lives in github.com/OpenMOSS/MOSS-TTS, folder moss_tts_realtime/ (the model
package mossttsrealtime/ and the offline inferencer.py that infer.py and the model card use).
CI cannot run it, so the Realtime tests compare ours against what this script recorded. It
imports upstream's files from the folder given (nothing of them is copied into this repo),
loads builtin:tiny-realtime into upstream's `MossTTSRealtime` with `from_pretrained` (float32,
eager attention: upstream's CPU fallback in infer.py), saves it back with `save_pretrained` and
checks every tensor round-trips equal to ours, then writes:

- goldens.json: upstream's commit and each used file's sha256; the checkpoint's fingerprint;
  upstream's system prompt and templates as its code has them; its sampling defaults with the
  file and line each comes from; per case the text, its token ids, the text token fed at each
  frame, the codes, and where they sit in the prompt;
- goldens.npz, per case (`short`, `long`, `long_reference`): `prompt` (the [T, 17] rows of
  upstream's prefill: system turn, optional voice turn, assistant start, the ≤ 12 lead text
  tokens), `rows_fed` (the row the backbone was last fed before each frame: the prefill's last
  row, then each step's row), `codes` [FRAMES, 16], `margins` (per frame and codebook the best
  logit minus the second best, as argmax saw them), `hidden` (the backbone's last hidden state
  each frame came from, float32 [FRAMES, hidden]), and for the reference case `reference`
  ([frames, 16] codes); also `streaming_ensemble/{plain,reference}`, the system rows of the
  package's own processor (processing_mossttsrealtime, used by the streaming demos).

The frames are upstream's `MossTTSRealtimeInference.generate` (inferencer.py) run unchanged with
do_sample=False and temperature 0 (its `sample_token` then takes the argmax), repetition penalty
1.0 (its penalty is then skipped), and max_length FRAMES - 1 (one frame from the prefill, one
per step). The only intervention is a forward hook on the depth transformer's head 0 that sets
the audio EOS logit (1026) to -inf, so every case runs FRAMES frames; 1024 and 1025 are left
possible and, when picked, fed back as upstream does. The same frames are checked against the
package's streaming `MossTTSRealtimeInference` (prefill, then one step per text token / pad).

A reference voice enters upstream's `generate` only as a wav path, encoded by the codec; here
a stand-in codec hands back the case's random codes as `audio_codes` [16, 1, frames] (the
layout inferencer.py's `.squeeze(1)` and `make_ensemble`'s `[:16, :]` then transpose imply),
and torchaudio (absent here; upstream's inferencer imports it only to load wavs) is a stub whose
`load` returns a silent clip at the codec's rate. Run:

    PYTHONPATH=. python scripts/realtime_upstream_goldens.py /tmp/upstream-rt/moss_tts_realtime

where the folder is moss_tts_realtime/ of OpenMOSS/MOSS-TTS at commit
58b20a0d5fcc6766658d50967a90a9d890009a46, e.g. extracted with
`git archive 58b20a0 moss_tts_realtime | tar -x -C /tmp/upstream-rt`.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.machinery
import inspect
import json
import platform
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "realtime_upstream"

UPSTREAM_FILES = ("mossttsrealtime/__init__.py", "mossttsrealtime/configuration_mossttsrealtime.py",
                  "mossttsrealtime/modeling_mossttsrealtime.py",
                  "mossttsrealtime/modeling_mossttsrealtime_local.py",
                  "mossttsrealtime/processing_mossttsrealtime.py",
                  "mossttsrealtime/streaming_mossttsrealtime.py", "inferencer.py",
                  "infer.py")  # fmt: skip
UPSTREAM_ORIGIN = {
    "repo": "github.com/OpenMOSS/MOSS-TTS",
    "commit": "58b20a0d5fcc6766658d50967a90a9d890009a46",
    "path": "moss_tts_realtime/",
}
COMMAND = (
    "PYTHONPATH=. python scripts/realtime_upstream_goldens.py /tmp/upstream-rt/moss_tts_realtime"
)
# the model card is outside moss_tts_realtime/; its table, read by hand at the commit above
# (checked against the file when the folder's parent holds docs/)
MODEL_CARD = {"file": "docs/moss_tts_realtime_model_card.md", "line": 33,
              "row": "| **MOSS-TTS-Realtime** | 0.8 | 0.6 | 30 | 1.1 | 50 |",
              "columns": ["temperature", "top_p", "top_k", "repetition_penalty",
                          "repetition_window"]}  # fmt: skip

FRAMES = 24  # frames per case: one from the prefill, FRAMES - 1 steps
REFERENCE_FRAMES = 6
AUDIO_EOS = 1026
SEED = 53
SHORT_TEXT = "Hello, world!"  # fewer than 12 tokens: all of it goes in the prefill
LONG_TEXT = ("Welcome to MOSS TTS Realtime, a streaming speech model for voice agents. It speaks "
             "as soon as the text arrives, 你好，世界！")  # fmt: skip
CASES = [{"name": "short", "text": SHORT_TEXT, "reference": False},
         {"name": "long", "text": LONG_TEXT, "reference": False},
         {"name": "long_reference", "text": LONG_TEXT, "reference": True}]  # fmt: skip


class Upstream(types.SimpleNamespace):
    configuration: types.ModuleType
    modeling: types.ModuleType
    local: types.ModuleType
    processing: types.ModuleType
    streaming: types.ModuleType
    inferencer: types.ModuleType
    mask_adapted: bool


def import_upstream(folder: Path) -> Upstream:
    """Upstream's modules, imported as its own scripts import them (the folder on sys.path:
    `mossttsrealtime` a package, `inferencer` a module), torchaudio stood in for when absent."""
    import torch
    import transformers.modeling_utils  # noqa: F401 - before the torchaudio stand-in below

    try:
        import torchaudio  # noqa: F401
    except ImportError:
        stub = types.ModuleType("torchaudio")
        stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        stub.load = lambda path: (torch.zeros(1, 2400), 24000)  # type: ignore[attr-defined]
        sys.modules["torchaudio"] = stub
    sys.path.insert(0, str(folder))
    name = "mossttsrealtime."
    up = Upstream(
        configuration=importlib.import_module(name + "configuration_mossttsrealtime"),
        modeling=importlib.import_module(name + "modeling_mossttsrealtime"),
        local=importlib.import_module(name + "modeling_mossttsrealtime_local"),
        processing=importlib.import_module(name + "processing_mossttsrealtime"),
        streaming=importlib.import_module(name + "streaming_mossttsrealtime"),
        inferencer=importlib.import_module("inferencer"),
    )
    up.mask_adapted = adapt_create_causal_mask(up.local)
    return up


def adapt_create_causal_mask(local: types.ModuleType) -> bool:
    """Upstream pins transformers 5.0.0, whose `create_causal_mask` takes `input_embeds`,
    `cache_position` and `past_key_values`; later releases (5.25) take `inputs_embeds` and
    `cache` and find the offset in the cache. Where the old names are gone, the depth
    transformer's module gets a wrapper that passes them on so (nothing else changes; main()
    runs it under either and goldens.json says which)."""
    original = local.create_causal_mask
    if "input_embeds" in inspect.signature(original).parameters:
        return False

    def create_causal_mask(config, input_embeds, attention_mask, cache_position,
                           past_key_values, position_ids=None, **kwargs):  # fmt: skip
        return original(
            config,
            inputs_embeds=input_embeds,
            attention_mask=attention_mask,
            cache=past_key_values,
            position_ids=position_ids,
            **kwargs,
        )

    local.create_causal_mask = create_causal_mask
    return True


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state_fingerprint(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over the sorted tensor names and their float32 values."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(np.asarray(tensors[name], np.float32)).tobytes())
    return digest.hexdigest()


def load_upstream_model(upstream: Upstream, folder: Path):
    """Upstream's MossTTSRealtime from FOLDER as infer.py loads it, but float32 and eager."""
    import torch

    model, info = upstream.modeling.MossTTSRealtime.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                         "error_msgs")), info  # fmt: skip
    return model.eval()


def round_trip(model, ours: dict[str, np.ndarray], tmp: Path) -> list[str]:
    """Save MODEL with its class's save_pretrained and check every tensor equals ours."""
    from safetensors.torch import load_file

    saved_dir = tmp / "saved"
    model.save_pretrained(saved_dir)
    saved: dict[str, Any] = {}
    files = sorted(p.name for p in saved_dir.glob("*.safetensors"))
    for fname in files:
        saved.update(load_file(str(saved_dir / fname)))
    assert set(saved) == set(ours), sorted(set(saved) ^ set(ours))
    for name, value in ours.items():
        assert np.array_equal(saved[name].float().numpy(), value), name
    live = {n: t.detach().float().numpy() for n, t in model.state_dict().items()}
    assert set(live) == set(ours) and all(np.array_equal(live[n], ours[n]) for n in ours)
    return files


class Recorder:
    """What upstream's loop did: the backbone's inputs and last hidden states (hooks on the
    model), the logits each `sample_token` call saw; and the EOS mask on depth head 0."""

    def __init__(self, model) -> None:
        self.rows: list[np.ndarray] = []
        self.hidden: list[np.ndarray] = []
        self.logits: list[np.ndarray] = []
        self.handles = [
            model.register_forward_pre_hook(self._rows, with_kwargs=True),
            model.register_forward_hook(self._hidden),
            model.local_transformer.local_lm_heads[0].register_forward_hook(self._mask_eos),
        ]

    def _rows(self, module, args, kwargs):
        self.rows.append(kwargs["input_ids"][0].cpu().numpy().copy())

    def _hidden(self, module, args, output):
        self.hidden.append(output.last_hidden_state[0, -1].float().cpu().numpy().copy())

    @staticmethod
    def _mask_eos(module, args, output):
        output = output.clone()
        output[..., AUDIO_EOS] = float("-inf")
        return output

    def wrap_sampler(self, owner) -> None:
        original = owner.sample_token

        def sample_token(logits, *args, **kwargs):
            self.logits.append(logits.detach().float().reshape(-1).cpu().numpy().copy())
            return original(logits, *args, **kwargs)

        owner.sample_token = sample_token

    def reset(self) -> None:
        self.rows, self.hidden, self.logits = [], [], []

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class ReferenceCodec:
    """Stands in for MOSS-Audio-Tokenizer in upstream's `_encode_reference_audio`: `encode`
    hands back the codes it was given as `audio_codes` [n_q, batch 1, frames]."""

    def __init__(self) -> None:
        self.codes: np.ndarray | None = None  # [frames, n_q]
        self.calls = 0

    def encode(self, wav):
        import torch

        assert self.codes is not None
        self.calls += 1
        return {"audio_codes": torch.from_numpy(self.codes.T[:, None, :].copy())}


def margins_of(logits: list[np.ndarray], codes: np.ndarray) -> np.ndarray:
    """Best logit minus the second best, per sample_token call, as [frames, 16]; checks the
    best is the code upstream picked."""
    out = []
    for values in logits:
        order = np.argsort(-values.astype(np.float64), kind="stable")
        out.append(values[order[0]] - values[order[1]])
    margins = np.array(out, np.float32).reshape(codes.shape)
    best = np.array([int(np.argmax(v)) for v in logits]).reshape(codes.shape)
    assert np.array_equal(best, codes)
    return margins


def greedy_case(
    up: Upstream,
    model,
    tokenizer,
    recorder: Recorder,
    codec: ReferenceCodec,
    case: dict[str, Any],
    reference: np.ndarray | None,
) -> dict[str, Any]:
    """One case through upstream's `generate`, greedy, FRAMES frames."""
    inf = up.inferencer.MossTTSRealtimeInference(model, tokenizer, max_length=FRAMES - 1,
                                                 codec=codec)  # fmt: skip
    recorder.wrap_sampler(inf)
    recorder.reset()
    codec.codes = reference
    calls = codec.calls
    path = "<codes>" if case["reference"] else None  # the stand-in codec ignores the path
    result = inf.generate(case["text"], reference_audio_path=path, temperature=0.0, top_p=0.6,
                          top_k=30, do_sample=False, repetition_penalty=1.0,
                          repetition_window=50)  # fmt: skip
    assert codec.calls == calls + (1 if case["reference"] else 0)
    codes = np.asarray(result[0], np.int64)
    assert codes.shape == (FRAMES, 16), codes.shape
    assert len(recorder.rows) == FRAMES and len(recorder.hidden) == FRAMES
    prompt = recorder.rows[0]
    rows_fed = np.stack([rows[-1] for rows in recorder.rows])
    # each step's row: the next text token (or text_pad), then the previous frame's codes
    assert np.array_equal(rows_fed[1:, 1:], codes[:-1])
    return {"prompt": prompt, "rows_fed": rows_fed, "codes": codes,
            "margins": margins_of(recorder.logits, codes),
            "hidden": np.stack(recorder.hidden).astype(np.float32)}  # fmt: skip


def streaming_codes(
    up: Upstream, model, tokenizer, recorder: Recorder, ensemble: np.ndarray, text_ids: list[int]
) -> np.ndarray:
    """The same frames through the package's streaming MossTTSRealtimeInference (prefill with
    the ≤ 12 lead tokens, then a step per further token, then text_pad steps)."""
    inf = up.streaming.MossTTSRealtimeInference(model, tokenizer, max_length=FRAMES)
    inf._should_compile_local_transformer = False  # torch.compile is only for speed
    recorder.wrap_sampler(inf)
    greedy = {"temperature": 0.0, "do_sample": False, "repetition_window": 50}
    frames = [inf.prefill(input_ids=[ensemble], text_prefix_ids=[text_ids[:12]],
                          repetition_penalty=None, **greedy)]  # fmt: skip
    rest = text_ids[12:]
    for k in range(FRAMES - 1):
        token = rest[k] if k < len(rest) else None
        frames.append(inf.step(token, repetition_penalty=1.0, **greedy))
    return np.concatenate([f.cpu().numpy() for f in frames], axis=0)


def defaults_of(func, names: list[str], folder: Path) -> dict[str, Any]:
    """NAMES' default values in FUNC's signature, each with the file and line it is written on."""
    func = inspect.unwrap(func)
    source, start = inspect.getsourcelines(func)
    path = Path(inspect.getsourcefile(func) or "").resolve().relative_to(folder.parent)
    out = {}
    for name in names:
        value = inspect.signature(func).parameters[name].default
        line = next(start + i for i, text in enumerate(source)
                    if text.strip().startswith((f"{name}:", f"{name}=")))  # fmt: skip
        out[name] = {"value": value, "at": f"{path}:{line}"}
    return out


def call_keywords(path: Path, folder: Path, callee: str) -> dict[str, Any]:
    """The constant keyword arguments of the first call to CALLEE in PATH, with their lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == callee:
                rel = path.relative_to(folder.parent)
                return {k.arg: {"value": k.value.value, "at": f"{rel}:{k.value.lineno}"}
                        for k in node.keywords
                        if k.arg and isinstance(k.value, ast.Constant)}  # fmt: skip
    raise AssertionError(f"no call to {callee} in {path}")


def sampling_defaults(up: Upstream, folder: Path) -> dict[str, Any]:
    inf = up.inferencer.MossTTSRealtimeInference
    st = up.streaming
    sampling = ["temperature", "top_p", "top_k", "do_sample", "repetition_penalty",
                "repetition_window"]  # fmt: skip
    out = {
        "inferencer.generate": defaults_of(inf.generate, ["max_length", *sampling], folder),
        "inferencer.__init__": defaults_of(inf.__init__, ["max_length"], folder),
        "inferencer._build_prefill_batch": defaults_of(
            inf._build_prefill_batch, ["prefill_max_text"], folder
        ),
        "infer.py generate call": call_keywords(folder / "infer.py", folder, "generate"),
        "infer.py MossTTSRealtimeInference call": call_keywords(
            folder / "infer.py", folder, "MossTTSRealtimeInference"
        ),
        "streaming.MossTTSRealtimeInference.prefill": defaults_of(
            st.MossTTSRealtimeInference.prefill, sampling, folder
        ),
        "streaming.MossTTSRealtimeInference.step": defaults_of(
            st.MossTTSRealtimeInference.step, sampling, folder
        ),
        "streaming.MossTTSRealtimeStreamingSession.__init__": defaults_of(
            st.MossTTSRealtimeStreamingSession.__init__, ["prefill_text_len", *sampling], folder
        ),
        "processing.MossTTSRealtimeProcessor.__init__": defaults_of(
            up.processing.MossTTSRealtimeProcessor.__init__,
            ["delay_tokens_len", "audio_channel_pad", "audio_bos_token", "audio_eos_token"],
            folder,
        ),
        "model_card": MODEL_CARD,
    }
    card = folder.parent / MODEL_CARD["file"]
    if card.is_file():
        line = card.read_text(encoding="utf-8").splitlines()[MODEL_CARD["line"] - 1]
        assert line.strip() == MODEL_CARD["row"], line
        MODEL_CARD["checked_against_file"] = True
    return out


def templates(up: Upstream, tokenizer) -> dict[str, Any]:
    """Upstream's prompt strings, as its objects hold or build them."""
    proc_inf = up.inferencer.MossTTSRealtimeProcessor(tokenizer=tokenizer)
    proc_pkg = up.processing.MossTTSRealtimeProcessor(tokenizer=tokenizer)
    pad = "<|audio_pad|>"
    return {
        "inferencer": {
            "system_prompt": proc_inf.ttsbase_system_prompt,
            "voice_clone_prompt_for_2_frames": proc_inf.make_voice_clone_prompt(2),
            "voice_clone_prompt_template": proc_inf.make_voice_clone_prompt(1).replace(
                pad, "{'<|audio_pad|>' * frames}"
            ),
            "assistant_start": "<|im_start|>assistant\n",
            "assistant_text": "the text's token ids as tokenizer(text) gives them (no special "
            "tokens, no <|im_end|> after), ≤ 12 in the prefill, the rest one "
            "per step, then <|text_pad|>",
        },
        "processing": {
            "system_prompt": proc_pkg.tts_system_prompt,
            "voice_clone_prompt_template": proc_pkg.make_voice_clone_prompt(1).replace(
                pad, "{'<|audio_pad|>' * frames}"
            ),
            "user_turn_start": "<|im_end|>\n<|im_start|>user\n",
            "assistant_start": "<|im_end|>\n<|im_start|>assistant\n",
        },
        "system_prompts_equal": proc_inf.ttsbase_system_prompt == proc_pkg.tts_system_prompt,
        "ids": {
            "audio_pad": proc_pkg.audio_pad_token_id,
            "text_pad": proc_pkg.text_pad_token_id,
            "audio_channel_pad": 1024,
            "audio_bos": 1025,
            "audio_eos": AUDIO_EOS,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("upstream", type=Path, help="moss_tts_realtime/ of OpenMOSS/MOSS-TTS")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    folder = args.upstream.resolve()
    import torch
    import transformers

    from moss_gguf_cli.realtime.checkpoint import open_realtime
    from moss_gguf_cli.realtime.tiny import NAME, ensure_tiny_realtime

    torch.manual_seed(SEED)
    up = import_upstream(folder)
    checkpoint = ensure_tiny_realtime()
    opened = open_realtime(checkpoint)
    ours = {name: ref.read_f32() for name, ref in opened.tensors.items()}
    model = load_upstream_model(up, checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        saved_files = round_trip(model, ours, Path(tmp))

    rng = np.random.default_rng(SEED)
    reference = rng.integers(0, 1024, (REFERENCE_FRAMES, 16)).astype(np.int64)
    arrays: dict[str, np.ndarray] = {}
    record: dict[str, Any] = {
        "upstream": {**UPSTREAM_ORIGIN,
                     "sha256": {f: sha256(folder / f) for f in UPSTREAM_FILES}},
        "command": COMMAND,
        "made_with": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "python": platform.python_version(),
                      "moss_gguf_commit": subprocess.run(
                          ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip(),
                      "torchaudio": "stub" if getattr(sys.modules["torchaudio"], "__file__",
                                                      None) is None else "real",
                      "create_causal_mask_adapted": up.mask_adapted},
        "checkpoint": {"name": f"builtin:{NAME}", "state_fingerprint": state_fingerprint(ours),
                       "tensors": len(ours), "saved_by_upstream": saved_files,
                       "round_trip_equal": True,
                       "loaded_as": "MossTTSRealtime.from_pretrained(folder, "
                                    "attn_implementation='eager', dtype=torch.float32)"},
        "frames": FRAMES, "reference_frames": REFERENCE_FRAMES, "seed": SEED,
        "greedy": {"how": "inferencer.MossTTSRealtimeInference.generate(text, "
                          "reference_audio_path, max_length=FRAMES-1, temperature=0.0, "
                          "do_sample=False, repetition_penalty=1.0, repetition_window=50); "
                          "sample_token returns argmax when not do_sample",
                   "eos_masked": "forward hook on local_transformer.local_lm_heads[0]: logit "
                                 f"{AUDIO_EOS} set to -inf every frame; nothing else masked"},
        "templates": templates(up, tokenizer),
        "sampling_defaults": sampling_defaults(up, folder),
        "cases": [],
    }  # fmt: skip

    recorder = Recorder(model)
    codec = ReferenceCodec()
    proc_inf = up.inferencer.MossTTSRealtimeProcessor(tokenizer=tokenizer)
    proc_pkg = up.processing.MossTTSRealtimeProcessor(tokenizer=tokenizer)
    for case in CASES:
        name = case["name"]
        ref = reference if case["reference"] else None
        out = greedy_case(up, model, tokenizer, recorder, codec, case, ref)
        text_ids = [int(t) for t in tokenizer(case["text"])["input_ids"]]
        lead = min(len(text_ids), 12)
        ensemble = proc_inf.make_ensemble(None if ref is None else ref.T)
        prompt = out["prompt"]
        assert np.array_equal(prompt[: len(ensemble)], ensemble)
        assert len(prompt) == len(ensemble) + lead
        assert prompt[:, 0][len(ensemble) :].tolist() == text_ids[:lead]
        streamed = streaming_codes(up, model, tokenizer, recorder, ensemble, text_ids)
        assert np.array_equal(streamed, out["codes"]), name
        pkg = proc_pkg.make_ensemble(ref)  # [frames, 16] taken as is by this processor
        n_assistant = len(tokenizer.encode("<|im_start|>assistant\n"))
        assert np.array_equal(pkg, ensemble[:-n_assistant])
        arrays[f"streaming_ensemble/{'reference' if ref is not None else 'plain'}"] = pkg
        for key, value in out.items():
            arrays[f"{name}/{key}"] = value
        if ref is not None:
            arrays[f"{name}/reference"] = ref
            audio_rows = np.where(prompt[:, 0] == 151654)[0]
        else:
            audio_rows = np.array([], np.int64)
        record["cases"].append({
            "name": name, "text": case["text"], "reference": case["reference"],
            "text_ids": text_ids, "n_prompt": int(len(prompt)), "n_ensemble": int(len(ensemble)),
            "n_lead": lead, "bos_row": int(len(prompt) - 1),
            "reference_rows": audio_rows.tolist(),
            "prompt_text": tokenizer.decode(prompt[:, 0].tolist()),
            "text_fed": out["rows_fed"][:, 0].tolist(),
            "codes": out["codes"].tolist(),
            "min_margin": float(out["margins"].min()),
            "streaming_agrees": True,
            "processing_ensemble_is_inferencer_ensemble_without_assistant_start": True,
        })  # fmt: skip
    recorder.close()
    arrays = {k: (v.astype(np.int32) if v.dtype.kind in "iu" else v) for k, v in arrays.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "goldens.npz", **arrays)
    (args.out / "goldens.json").write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n",
                                           encoding="utf-8")  # fmt: skip
    for path in sorted(args.out.iterdir()):
        print(f"{path}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
