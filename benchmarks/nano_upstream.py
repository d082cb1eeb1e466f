"""Upstream's own CPU runtimes for MOSS-TTS-Nano, language model only (issue #48's baseline).

    python benchmarks/nano_upstream.py --checkpoint DIR --remote-code DIR --upstream-repo DIR \
        [--out /tmp/nanob/upstream-onnx] [--frames 100] [--runs 3] [--threads 1,2] [--json F]

DIR of --checkpoint: a Nano release-layout folder (config.json, pytorch_model.bin,
tokenizer.model). --remote-code: the Hub repo's remote code (modeling_moss_tts_nano.py, ...).
--upstream-repo: OpenMOSS/MOSS-TTS-Nano, a work tree or a bare git dir (then `git archive HEAD`
unpacks it under --out). Nothing of upstream's is copied here; everything runs from those folders,
offline, and everything written goes under --out:

1. checkpoint/: the release folder as `from_pretrained(trust_remote_code=True)` reads it (links
   to the files, config.json with the release's auto_map added);
2. onnx/: upstream's onnx/export_moss_tts_browser_onnx.py run on it (reused if already there),
   plus what its ONNX CPU runtime reads that the export does not make: browser_poc_manifest.json
   (prompt templates from upstream's prompting.py and tokenizer, a builtin voice of random codes,
   infer_onnx.py's sampling defaults) and a stand-in codec (never run: the language model only);
3. timed, round-robin, medians of --runs: `ort_cpu_runtime.OrtCpuRuntime.generate_audio_frames`
   as shipped (its session options: intra-op = thread_count, inter-op 1, spinning on) and with
   session.intra_op/inter_op.allow_spinning=0 added, at each thread count, in sample mode
   "fixed" (infer_onnx.py's default: one local graph a frame) and "full" (17 local_cached_step
   calls, host sampling); and the PyTorch path, `MossTTSNanoForCausalLM._iter_generation_events`
   (float32, sdpa as upstream's runtime sets on CPU, do_sample with its defaults) at
   torch.set_num_threads(t).

The stop is masked so that every run makes --frames frames: ONNX "fixed" - the frame graph's
should_continue is replaced by True (its frame codes are kept); ONNX "full" and PyTorch - the
assistant text token upstream samples is replaced by audio_assistant_slot after sampling. The
sampling itself still runs, so the cost is what upstream pays. frames/s = frames / the call's
wall time (prefill included); `steady` = (frames - 1) / (last frame - first frame).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import runpy
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REMOTE_FILES = ("__init__.py", "configuration_moss_tts_nano.py", "modeling_moss_tts_nano.py",
                "gpt2_decoder.py", "prompting.py", "tokenization_moss_tts_nano.py")  # fmt: skip
AUTO_MAP = {  # as the release's config.json has it
    "AutoConfig": "configuration_moss_tts_nano.MossTTSNanoConfig",
    "AutoModel": "modeling_moss_tts_nano.MossTTSNanoForCausalLM",
    "AutoModelForCausalLM": "modeling_moss_tts_nano.MossTTSNanoForCausalLM",
}
# infer_onnx.py's and moss_tts_nano_runtime.py's sampling defaults
SAMPLING = {"text_temperature": 1.0, "text_top_p": 1.0, "text_top_k": 50, "audio_temperature": 0.8,
            "audio_top_p": 0.95, "audio_top_k": 25, "audio_repetition_penalty": 1.2}  # fmt: skip
TEXT = "Hello there, this is a test of MOSS-TTS-Nano at its real size on two cores."
REFERENCE_FRAMES = 25  # the builtin voice's random codes (2 s)
NO_SPIN = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


def stub_torchaudio() -> None:
    """Upstream imports torchaudio only to load clips, which nothing here asks of it."""
    import transformers.modeling_utils  # noqa: F401 - before the stand-in
    import transformers.tokenization_utils_base  # noqa: F401

    try:
        import torchaudio  # noqa: F401
    except ImportError:
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")


def upstream_tree(repo: Path, out: Path) -> Path:
    if (repo / "ort_cpu_runtime.py").is_file():
        return repo
    tree = out / "repo"
    if not (tree / "ort_cpu_runtime.py").is_file():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", f"--git-dir={repo}", "archive", "HEAD"], check=True,
                                 capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def git_head(repo: Path) -> str:
    for args in (["-C", str(repo)], [f"--git-dir={repo}"]):
        done = subprocess.run(["git", *args, "rev-parse", "HEAD"], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    return "unknown"


def stage_checkpoint(checkpoint: Path, remote: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    links = {name: checkpoint / name for name in ("pytorch_model.bin", "tokenizer.model")}
    links.update({name: remote / name for name in REMOTE_FILES})
    for name, target in links.items():
        link = dest / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    config = json.loads((checkpoint / "config.json").read_text())
    config.setdefault("auto_map", AUTO_MAP)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def shim_transformers(staged: Path) -> None:
    """Make upstream's model class (written for transformers 4.57) load right under transformers 5,
    on the class as loaded (upstream's files are untouched): its _keys_to_ignore_on_load_unexpected
    is a list (5 unions it with a set), and 5 leaves non-persistent buffers (RoPE's inv_freq) as
    torch.empty after from_pretrained; they are taken from a model built by upstream's __init__."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    cls = get_class_from_dynamic_module(AUTO_MAP["AutoModelForCausalLM"], str(staged))
    for klass in cls.__mro__:
        value = klass.__dict__.get("_keys_to_ignore_on_load_unexpected")
        if isinstance(value, list):
            klass._keys_to_ignore_on_load_unexpected = set(value)
    load = cls.from_pretrained.__func__

    def from_pretrained(klass: type, *args: Any, **kwargs: Any) -> Any:
        model = load(klass, *args, **kwargs)
        fresh = dict(klass(model.config).named_buffers())
        persistent = model.state_dict()
        for name, buffer in model.named_buffers():
            if name not in persistent:
                buffer.copy_(fresh[name])
        return model

    cls.from_pretrained = classmethod(from_pretrained)


def export(tree: Path, staged: Path, onnx_dir: Path, force: bool) -> float:
    if (onnx_dir / "tts_browser_onnx_meta.json").is_file() and not force:
        return 0.0
    argv = sys.argv
    sys.argv = ["export_moss_tts_browser_onnx.py", "--checkpoint-path", str(staged),
                "--output-dir", str(onnx_dir)]  # fmt: skip
    start = time.perf_counter()
    try:
        runpy.run_path(str(tree / "onnx" / "export_moss_tts_browser_onnx.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return time.perf_counter() - start


def load_model(staged: Path) -> Any:
    """As moss_tts_nano_runtime.py loads it on a CPU: float32, sdpa global and local."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(staged), trust_remote_code=True,
                                                 local_files_only=True)  # fmt: skip
    model.to(device="cpu", dtype=torch.float32)
    model._set_attention_implementation("sdpa", local_attn_implementation="sdpa")
    return model.eval()


def upstream_module(model: Any, name: str) -> types.ModuleType:
    return importlib.import_module(type(model).__module__.rsplit(".", 1)[0] + "." + name)


def write_runtime_files(onnx_dir: Path, model: Any, staged: Path, frames: int) -> dict[str, Any]:
    """browser_poc_manifest.json and a stand-in codec, for what OrtCpuRuntime reads."""
    import onnx
    from onnx import TensorProto, helper

    prompting = upstream_module(model, "prompting")
    tokenization = upstream_module(model, "tokenization_moss_tts_nano")
    tokenizer = tokenization.MossTTSNanoSentencePieceTokenizer(str(staged / "tokenizer.model"))
    config = model.config
    meta = json.loads((onnx_dir / "tts_browser_onnx_meta.json").read_text())
    codec = onnx_dir / "codec"
    codec.mkdir(exist_ok=True)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "stand_in", io[:1],
                              io[1:])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(codec / "stand_in.onnx"))  # fmt: skip
    files = dict.fromkeys(("encode", "decode_full", "decode_step"), "stand_in.onnx")
    (codec / "codec_meta.json").write_text(json.dumps({"files": files, "codec_config": {
        "num_quantizers": int(config.n_vq)}}))  # fmt: skip
    rng = np.random.default_rng(48)
    codes = rng.integers(0, int(config.audio_codebook_sizes[0]), (REFERENCE_FRAMES, config.n_vq))
    manifest = {
        "model_files": {"tts_meta": "tts_browser_onnx_meta.json",
                        "codec_meta": "codec/codec_meta.json"},
        "tts_config": {k: v for k, v in meta["model_config"].items()
                       if k.endswith("_id") or k == "n_vq"},
        "generation_defaults": {"max_new_frames": frames, "do_sample": True, "sample_mode": "fixed",
                                **SAMPLING},
        "prompt_templates": {
            "user_prompt_prefix_token_ids": prompting.build_user_prompt_prefix(tokenizer, config),
            "user_prompt_after_reference_token_ids": prompting.build_user_prompt_after_reference(
                tokenizer),
            "assistant_prompt_prefix_token_ids": prompting.build_assistant_prompt_prefix(
                tokenizer, config),
        },
        "builtin_voices": [{"voice": "random", "prompt_audio_codes": codes.tolist()}],
        "text_samples": [{"text": TEXT, "text_token_ids": prompting.encode_text(tokenizer, TEXT)}],
    }  # fmt: skip
    (onnx_dir / "browser_poc_manifest.json").write_text(json.dumps(manifest, indent=1))
    return {"tokenizer": tokenizer, "codes": codes, "manifest": manifest}


class _NoSpinOrt(types.ModuleType):
    """onnxruntime as ort_cpu_runtime sees it, but its SessionOptions turn spinning off."""

    def __init__(self, ort: types.ModuleType) -> None:
        super().__init__("onnxruntime")
        self._ort = ort

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ort, name)

    def SessionOptions(self) -> Any:  # noqa: N802 - onnxruntime's name
        options = self._ort.SessionOptions()
        for key, value in NO_SPIN.items():
            options.add_session_config_entry(key, value)
        return options


def ort_runner(ort_cpu: types.ModuleType, onnx_dir: Path, threads: int, spin: bool, mode: str,
               frames: int) -> Callable[[], list[float]]:  # fmt: skip
    real_ort = ort_cpu.ort
    ort_cpu.ort = real_ort if spin else _NoSpinOrt(real_ort)
    try:
        runtime = ort_cpu.OrtCpuRuntime(onnx_dir, thread_count=threads, max_new_frames=frames,
                                        sample_mode=mode)  # fmt: skip
    finally:
        ort_cpu.ort = real_ort
    fixed = runtime.run_local_fixed_sampled_frame
    runtime.run_local_fixed_sampled_frame = lambda *a, **k: (True, fixed(*a, **k)[1])
    voice = runtime.list_builtin_voices()[0]["prompt_audio_codes"]
    text_ids = runtime.list_text_samples()[0]["text_token_ids"]
    rows = runtime.build_voice_clone_request_rows(voice, text_ids)

    def run() -> list[float]:
        runtime.rng = np.random.default_rng(1234)
        stamps = [time.perf_counter()]
        out = runtime.generate_audio_frames(
            rows, on_frame=lambda *_: stamps.append(time.perf_counter()))  # fmt: skip
        assert len(out) == frames, len(out)
        return stamps

    run.rows = rows["inputIds"]  # type: ignore[attr-defined]
    run.runtime = runtime  # type: ignore[attr-defined]
    return run


def torch_runner(model: Any, prompt: dict[str, Any], frames: int, threads: int
                 ) -> Callable[[], list[float]]:  # fmt: skip
    import torch

    input_ids, mask = model.build_inference_input_ids(
        TEXT, prompt["tokenizer"], mode="voice_clone",
        prompt_audio_codes=torch.as_tensor(prompt["codes"], dtype=torch.long))  # fmt: skip

    def run() -> list[float]:
        torch.set_num_threads(threads)
        torch.manual_seed(1234)
        stamps = [time.perf_counter()]
        with torch.no_grad():
            for event in model._iter_generation_events(input_ids, mask, max_new_frames=frames,
                                                       do_sample=True, **SAMPLING):  # fmt: skip
                if event["type"] == "frame":
                    stamps.append(time.perf_counter())
        assert len(stamps) == frames + 1, len(stamps)
        return stamps

    run.rows = input_ids[0].tolist()  # type: ignore[attr-defined]
    return run


def mask_torch_stop(model: Any) -> None:
    sample = model._sample_next_assistant_text_token

    def always_continue(**kwargs: Any) -> Any:
        return sample(**kwargs).fill_(int(model.config.audio_assistant_slot_token_id))

    model._sample_next_assistant_text_token = always_continue


def mask_ort_full_stop(ort_cpu: types.ModuleType) -> None:
    sample = ort_cpu._sample_assistant_text_token

    def always_continue(text_logits: Any, manifest: Any, *args: Any) -> int:
        sample(text_logits, manifest, *args)
        return int(manifest["tts_config"]["audio_assistant_slot_token_id"])

    ort_cpu._sample_assistant_text_token = always_continue


def same_weights(ort_run: Any, model: Any) -> float:
    """Max |ONNX prefill - PyTorch| over the prompt's last global hidden state."""
    import torch

    ids = np.asarray([ort_run.rows], dtype=np.int32)
    hidden = ort_run.runtime.sessions["prefill"].run(["global_hidden"], {
        "input_ids": ids, "attention_mask": np.ones(ids.shape[:2], dtype=np.int32)})[0]
    with torch.no_grad():
        embeds = model._build_inputs_embeds(torch.as_tensor(ids, dtype=torch.long))
        mask = torch.ones(ids.shape[:2], dtype=torch.bool)
        ours = model.transformer(inputs_embeds=embeds, attention_mask=mask, use_cache=False)
        ours = ours.last_hidden_state
    return float(np.abs(hidden[0, -1] - ours[0, -1].numpy()).max())


def cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--remote-code", type=Path, required=True)
    parser.add_argument("--upstream-repo", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("/tmp/nanob/upstream-onnx"))
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=[1, 2])
    parser.add_argument("--modes", type=lambda v: v.split(","), default=["fixed", "full"],
                        help="OrtCpuRuntime sample modes (fixed: infer_onnx.py's default)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch path")
    parser.add_argument("--reexport", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_MODULES_CACHE", str(args.out / "hf_modules"))
    stub_torchaudio()
    tree = upstream_tree(args.upstream_repo, args.out)
    staged = stage_checkpoint(args.checkpoint, args.remote_code, args.out / "checkpoint")
    shim_transformers(staged)
    onnx_dir = args.out / "onnx"
    export_s = export(tree, staged, onnx_dir, args.reexport)
    model = load_model(staged)
    prompt = write_runtime_files(onnx_dir, model, staged, args.frames)
    sys.path.insert(0, str(tree))
    import onnxruntime
    import torch

    ort_cpu = importlib.import_module("ort_cpu_runtime")
    mask_ort_full_stop(ort_cpu)
    mask_torch_stop(model)

    runners: dict[str, Callable[[], list[float]]] = {}
    for mode in args.modes:
        for spin in (True, False):
            for threads in args.threads:
                name = f"onnx {mode} spin {'on' if spin else 'off'} t{threads}"
                runners[name] = ort_runner(ort_cpu, onnx_dir, threads, spin, mode, args.frames)
    if not args.no_torch:
        for threads in args.threads:
            runners[f"torch t{threads}"] = torch_runner(model, prompt, args.frames, threads)
    rows = {name: run.rows for name, run in runners.items()}  # type: ignore[attr-defined]
    assert all(r == next(iter(rows.values())) for r in rows.values()), "prompts differ"

    first = next(iter(runners.values()))
    parity = same_weights(first, model)
    print(f"ONNX vs PyTorch, prompt's last hidden state: max abs diff {parity}")
    for run in runners.values():  # warm-up, untimed
        run()
    loads = [os.getloadavg()[0]]
    times: dict[str, list[list[float]]] = {name: [] for name in runners}
    for _ in range(args.runs):
        for name, run in runners.items():
            times[name].append(run())
            loads.append(os.getloadavg()[0])
            took = times[name][-1][-1] - times[name][-1][0]
            print(f"  {name}: {args.frames / took:.1f} frames/s, load {loads[-1]:.2f}", flush=True)

    results: dict[str, Any] = {}
    print(f"{'path':28} {'frames/s':>9} {'steady':>7} {'ms/frame':>9}  runs (frames/s)")
    for name, stamps in times.items():
        fps = [args.frames / (s[-1] - s[0]) for s in stamps]
        steady = [(args.frames - 1) / (s[-1] - s[1]) for s in stamps]
        results[name] = {"frames_per_s": statistics.median(fps), "steady_frames_per_s":
                         statistics.median(steady), "runs_frames_per_s": fps,
                         "prefill_s": [s[1] - s[0] for s in stamps]}  # fmt: skip
        print(f"{name:28} {results[name]['frames_per_s']:9.1f} "
              f"{results[name]['steady_frames_per_s']:7.1f} "
              f"{1e3 / results[name]['frames_per_s']:9.1f}  "
              + " ".join(f"{v:.1f}" for v in fps))  # fmt: skip
    print(f"load average (1 min) during the runs: {min(loads):.2f}-{max(loads):.2f}, "
          f"median {statistics.median(loads):.2f}; {os.cpu_count()} CPUs, {cpu_model()}")
    report = {
        "results": results, "frames": args.frames, "runs": args.runs,
        "prompt_rows": len(next(iter(rows.values()))),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_1min": loads},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "onnxruntime": onnxruntime.__version__, "upstream_repo": git_head(
                         args.upstream_repo)},
        "export_s": export_s, "onnx_vs_torch_max_abs_diff": parity,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
