"""families/: the one registry the stages ask which family an input, a folder or a synth config
is (docs/ARCHITECTURE.md §6, "The family interface")."""

from __future__ import annotations

import json

import pytest
import yaml
from in_process import moss_gguf

from moss_gguf_cli.errors import InputError
from moss_gguf_cli.families import (
    DELAY,
    FAMILIES,
    NANO,
    REALTIME,
    for_config,
    for_folder,
    for_input,
)
from moss_gguf_cli.nano.tiny import ensure_tiny_nano
from moss_gguf_cli.source.checkpoint import resolve_model


def test_every_family_is_registered_once_by_its_own_name():
    assert [f.name for f in FAMILIES] == ["moss-tts-nano", "moss-tts-realtime", "moss-tts-delay"]
    assert FAMILIES[-1] is DELAY  # last: it claims what no other does


@pytest.mark.parametrize(("model", "family"), [
    ("builtin:tiny-nano", NANO), ("builtin:tiny", DELAY), ("builtin:tiny-realtime", REALTIME),
    ("OpenMOSS-Team/MOSS-TTS-Nano-100M", NANO), ("OpenMOSS-Team/MOSS-TTS", DELAY),
    ("OpenMOSS-Team/MOSS-TTS-Realtime", REALTIME),
])  # fmt: skip
def test_an_input_is_claimed_by_its_family_without_a_download(model, family):
    assert for_input(model) is family


def test_a_local_folder_is_told_by_its_config(tmp_path):
    assert for_input(str(ensure_tiny_nano())) is NANO
    assert for_input(str(resolve_model("builtin:tiny"))) is DELAY


def test_a_folder_is_told_by_its_manifest(tiny_nano_folder, tmp_path):
    assert for_folder(tiny_nano_folder) is NANO
    assert for_folder(tmp_path) is DELAY  # nothing there: the delay family's verify says what
    assert for_folder("") is DELAY


def test_a_synth_config_is_told_by_its_family_key(tiny_nano_folder, tmp_path):
    assert for_config(tiny_nano_folder / "moss-tts-nano.yaml") is NANO
    plain = tmp_path / "moss-tts.yaml"
    plain.write_text(yaml.safe_dump({"backbone_gguf": "b.gguf"}))  # folders made before
    assert for_config(plain) is DELAY
    assert for_config(tmp_path / "missing.yaml") is DELAY  # its reader says it is missing


def test_a_family_this_version_does_not_speak_is_one_line(tmp_path):
    config = tmp_path / "moss-tts-local.yaml"
    config.write_text(yaml.safe_dump({"family": "moss-tts-local"}))
    with pytest.raises(InputError, match="family 'moss-tts-local', which this moss-gguf"):
        for_config(config)
    ran = moss_gguf("synth", "--config", str(config), "--text", "Hi", "-o",
                    str(tmp_path / "x.wav"))  # fmt: skip
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1, ran.stderr
    assert "it speaks moss-tts-nano, moss-tts-realtime, moss-tts-delay" in lines[0]
    assert not (tmp_path / "x.wav").exists()


def test_verify_asks_the_registry(tiny_nano_folder):
    ran = moss_gguf("verify", str(tiny_nano_folder), "--json")
    report = json.loads(ran.stdout)
    assert ran.returncode == 0 and report["kind"] == "nano", ran.stderr
