"""configs/: upstream's synth YAMLs, the recipes, one set of defaults, upstream's command lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from moss_gguf_cli.delay.config import SynthConfig
from moss_gguf_cli.pipeline.layout import synth_config
from moss_gguf_cli.pipeline.recipes import load_recipe
from moss_gguf_cli.source.tiny_codec import write_tiny_codec
from moss_gguf_cli.tts.defaults import SYNTH_DEFAULTS

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
# upstream's PipelineConfig keys and their types (moss_tts_delay/llama_cpp/pipeline.py)
UPSTREAM_KEYS: dict[str, type | tuple[type, ...]] = {
    "backbone_gguf": str, "embedding_dir": str, "lm_head_dir": str, "tokenizer_dir": str,
    "audio_backend": str, "audio_encoder_onnx": str, "audio_decoder_onnx": str,
    "audio_encoder_trt": str, "audio_decoder_trt": str, "audio_model_name_or_path": str,
    "heads_backend": str, "n_ctx": int, "n_batch": int, "n_threads": int, "n_gpu_layers": int,
    "max_new_tokens": int, "use_gpu_audio": bool, "low_memory": bool, "profile": bool,
    "kv_cache_type_k": str, "kv_cache_type_v": str, "flash_attn": str,
    "text_temperature": (int, float), "text_top_p": (int, float), "text_top_k": int,
    "audio_temperature": (int, float), "audio_top_p": (int, float), "audio_top_k": int,
    "audio_repetition_penalty": (int, float),
}  # fmt: skip
PATHS = ("backbone_gguf", "embedding_dir", "lm_head_dir", "tokenizer_dir",
         "audio_encoder_onnx", "audio_decoder_onnx")  # fmt: skip


def synth_yamls() -> list[Path]:
    return sorted((CONFIGS / "llama_cpp").glob("*.yaml"))


def test_configs_exist():
    assert {p.name for p in synth_yamls()} >= {"default.yaml", "cpu-only.yaml"}
    assert len(list((CONFIGS / "recipes").glob("*.yaml"))) >= 5


@pytest.mark.parametrize("path", synth_yamls(), ids=lambda p: p.name)
def test_synth_yamls_have_upstream_keys_and_types_and_load(path: Path):
    data = yaml.safe_load(path.read_text())
    for key, value in data.items():
        assert key in UPSTREAM_KEYS, key
        assert isinstance(value, UPSTREAM_KEYS[key]), (key, value)
    for key in PATHS:
        assert data[key].startswith(("weights/MOSS-TTS-GGUF/", "weights/MOSS-Audio-Tokenizer-ONNX"))
    config = SynthConfig.from_dict(data, base=path.parent, source=path)
    assert config.backbone_gguf.name == "MOSS_TTS_Q4_K_M.gguf"


@pytest.mark.parametrize(
    "path", sorted((CONFIGS / "recipes").glob("*.yaml")), ids=lambda p: p.name
)
def test_recipes_load(path: Path):
    recipe = load_recipe(path)
    assert recipe.model and recipe.model.startswith("OpenMOSS-Team/")
    assert recipe.file_types and recipe.audio_tokenizer
    assert f"--config configs/recipes/{path.name}" in path.read_text()


def test_one_set_of_defaults():
    """layout's YAML, SynthConfig's defaults and configs/llama_cpp/default.yaml agree."""
    written = synth_config("b.gguf", None, None)
    default = yaml.safe_load((CONFIGS / "llama_cpp" / "default.yaml").read_text())
    fields = SynthConfig.__dataclass_fields__
    for key, value in SYNTH_DEFAULTS.items():
        assert written[key] == value, key
        assert fields[key].default == value, key
        if key in default:
            assert default[key] == value, key
    shared = set(default) & set(written) - set(PATHS)
    assert {"max_new_tokens", "n_threads", "flash_attn", "heads_backend"} <= shared
    for key in shared:
        assert default[key] == written[key], key


def test_a_bad_recipe_says_which_key(tmp_path: Path):
    bad = tmp_path / "r.yaml"
    bad.write_text("model: x/y\nquants: [Q4_K_M]\n")
    done = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "all", "--config", str(bad), "-o",
         str(tmp_path / "w")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown recipe key 'quants'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "w").exists()


def test_a_recipe_runs_and_flags_override_it(tmp_path: Path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        "model: builtin:tiny\nquant: [Q8_0]\nouttype: auto\n"
        "synth:\n  max_new_tokens: 64\n  n_threads: 1\n"
    )
    out = tmp_path / "w"
    done = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "all", "--config", str(recipe), "--quant", "Q6_K",
         "-o", str(out), "-q"], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load((out / "moss-tts.yaml").read_text())
    assert config["backbone_gguf"] == "backbone_q6_k.gguf"  # the flag won over the recipe
    assert config["max_new_tokens"] == 64 and config["n_threads"] == 1


# ----------------------------------------------------------------------------- upstream's layout


@pytest.fixture(scope="module")
def project(builds, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project root as upstream's README sets it up: the two official repos under weights/,
    the GGUF repo's files those of the run's shared `all --model builtin:tiny` (hard links)."""
    root = tmp_path_factory.mktemp("project")
    (root / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    demo = builds.all("--model", "builtin:tiny").path
    gguf = root / "weights" / "MOSS-TTS-GGUF"
    gguf.mkdir(parents=True)
    for sub in ("embeddings", "lm_heads", "tokenizer"):
        builds.copy(demo / sub, gguf / sub)
    builds.copy(demo / "backbone_q4_k_m.gguf", gguf / "MOSS_TTS_Q4_K_M.gguf")
    write_tiny_codec(root / "weights" / "MOSS-Audio-Tokenizer-ONNX", external_data=True)
    shutil.copytree(CONFIGS / "llama_cpp", root / "configs" / "llama_cpp")
    (root / "scripts" / "deep").mkdir(parents=True)
    wav = np.sin(np.arange(24000) * 2 * np.pi * 220 / 24000).astype(np.float32) * 0.3
    sf.write(root / "ref.wav", wav, 24000)
    return root


def moss_gguf(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", *args], cwd=cwd, capture_output=True, text=True,
        timeout=900, env=env,
    )  # fmt: skip


def assert_wav(path: Path) -> None:
    audio, rate = sf.read(path)
    assert rate == 24000 and audio.size > 0 and np.isfinite(audio).all()


@pytest.mark.parametrize("name", ["default.yaml", "cpu-only.yaml"])
def test_upstream_yamls_drive_synth_from_a_subfolder(project: Path, name: str):
    cwd = project / "scripts" / "deep"
    done = moss_gguf(
        ["synth", "--config", f"../../configs/llama_cpp/{name}", "--text", "Hello", "--seed", "1",
         "--max-new-tokens", "120"], cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_wav(cwd / "output.wav")  # upstream's default output name
    (cwd / "output.wav").unlink()


# upstream's documented example command lines (`python -m moss_tts_delay.llama_cpp` → synth)
UPSTREAM_EXAMPLES = [
    '--config configs/llama_cpp/default.yaml --text "Hello, world!" --output output.wav',
    '--config configs/llama_cpp/default.yaml --text "Hello!" --reference ref.wav '
    "--output output.wav",
    '--config configs/llama_cpp/default.yaml --text "Hello!" --heads-backend numpy',
    '--config configs/llama_cpp/default.yaml --text "Hello!" --reference ref.wav --profile',
    '--config configs/llama_cpp/default.yaml --text "Hello!" --audio-temp 1.5 '
    "--audio-rep-penalty 1.2",
    "--config configs/llama_cpp/cpu-only.yaml --text \"Hello!\" --max-tokens 200 --text-temp 1.0"
    " --n-gpu-layers 0 --low-memory --language en --instruction calm --quality high --tokens 50",
]


@pytest.mark.parametrize("line", UPSTREAM_EXAMPLES)
def test_upstream_command_lines(project: Path, line: str):
    import shlex

    done = moss_gguf(["synth", *shlex.split(line)], project)
    assert done.returncode == 0, done.stderr
    assert_wav(project / "output.wav")
    if "--profile" in line:
        assert "real-time factor" in done.stdout
    (project / "output.wav").unlink()


def test_upstream_trt_yaml_says_what_to_set(project: Path):
    trt = project / "configs" / "llama_cpp" / "trt.yaml"
    default = yaml.safe_load((project / "configs/llama_cpp/default.yaml").read_text())
    data = {k: v for k, v in default.items() if not k.startswith("audio_")}
    data.update(audio_backend="trt", low_memory=True, profile=False,
                audio_encoder_trt="weights/MOSS-Audio-Tokenizer-TRT/encoder.engine",
                audio_decoder_trt="weights/MOSS-Audio-Tokenizer-TRT/decoder.engine")  # fmt: skip
    trt.write_text(yaml.safe_dump(data))
    done = moss_gguf(["synth", "--config", str(trt), "--text", "Hello!"], project)
    assert done.returncode == 2
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "TensorRT" in line
    assert "audio_encoder_onnx" in line and "audio_decoder_onnx" in line
