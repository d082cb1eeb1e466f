"""The memory floor (delay/floor.py, docs/memory-floor.md), the GPU build option of
scripts/install.sh and what doctor says of offloaded layers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from gguf_reading import gguf_reader

from moss_gguf_cli.delay import SynthConfig
from moss_gguf_cli.delay.floor import read_bandwidth, step_bytes, step_floor
from moss_gguf_cli.doctor.environment import gpu_rows

REPO = Path(__file__).resolve().parents[1]


def test_step_bytes_are_the_gguf_tensors_a_step_reads(tiny_weights: Path):
    config = SynthConfig.from_yaml(tiny_weights / "moss-tts.yaml")
    reader = gguf_reader(config.backbone_gguf)  # gguf-py's own reader, not ours
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    head = sizes["output.weight"]
    backbone, text_rows, heads = step_bytes(config)
    assert backbone == sum(sizes.values()) - sizes["token_embd.weight"] - head
    assert text_rows == 2 * head // 151936  # the gen slot's row and the delay slot's
    one = np.load(config.lm_head_dir / "lm_head_audio_00.npy", mmap_mode="r")
    assert heads == 32 * one.shape[0] * one.shape[1] * 2  # float16, whatever runs them
    floor = step_floor(config, bandwidth=1e9)
    assert floor.step_bytes == backbone + text_rows + heads
    assert abs(floor.ms - floor.step_bytes / 1e6) < 1e-9


def test_read_bandwidth_is_a_rate():
    small = read_bandwidth(nbytes=8 << 20, repeats=2)
    assert 1e8 < small < 1e13  # bytes a second: from a slow VM to a fast workstation


def test_install_refuses_an_unknown_gpu_backend_before_building():
    done = subprocess.run(["bash", "scripts/install.sh", "--gpu", "tpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert "--gpu takes cuda, vulkan or metal, not 'tpu'" in done.stderr


def test_doctor_says_whether_layers_are_offloaded():
    row = next(r for r in gpu_rows(True, []) if r.name == "llama.cpp GPU")
    assert "layers offloaded: " in row.detail
