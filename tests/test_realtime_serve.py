"""`serve` on a MOSS-TTS-Realtime folder (#63; its text-streaming WebSocket is #64): 24 kHz mono
WAV to the official openai client, a registered voice cloned, the fields it does not take
refused with a 400 naming them; and a greedy answer equal to `synth --codes-out`'s speech."""

from __future__ import annotations

import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from in_process import moss_gguf
from test_serve import KEY, TIMEOUT, add_voice, start_serve

MODEL = "moss-tts-realtime"
TEXT = "Hello from the Realtime server."
FRAMES = {"min_new_tokens": 12, "max_new_tokens": 12, "seed": 5}


@pytest.fixture(scope="module")
def folder(builds):
    return builds.all("--model", "builtin:tiny-realtime").path  # the run's shared build


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    srv = start_serve(folder / "moss-tts-realtime.yaml",
                      tmp_path_factory.mktemp("log") / "serve.log", "--api-key", KEY,
                      "--voices", str(tmp_path_factory.mktemp("voices")))  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {KEY}"}) as c:  # fmt: skip
        yield c


def speak(client: openai.OpenAI, voice: str = "alloy", **extra) -> bytes:
    return client.audio.speech.create(model=MODEL, voice=voice, input=TEXT, response_format="wav",
                                      extra_body={**FRAMES, **extra}).content  # fmt: skip


def test_a_greedy_answer_is_synth_s(client, folder, tmp_path):
    """The server's engine, decoder windows and all, against `synth` on the same folder."""
    greedy = {"audio_temperature": 0, "audio_repetition_penalty": 1.0}
    served, rate = sf.read(io.BytesIO(speak(client, **greedy)), dtype="int16")
    assert rate == 24_000 and served.ndim == 1 and len(served) == 12 * 1920
    out = tmp_path / "synth.wav"
    ran = moss_gguf("synth", "--config", str(folder / "moss-tts-realtime.yaml"), "--text", TEXT,
                    "-o", str(out), "--audio-temperature", "0", "--audio-repetition-penalty",
                    "1.0", "--min-new-tokens", "12", "--max-new-tokens", "12")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_array_equal(sf.read(out, dtype="int16")[0], served)


def test_a_registered_voice_is_cloned(client, http, reference_wav):
    reply = add_voice(http, "rt-me", reference_wav)
    assert reply.status_code == 200, reply.text
    assert reply.json()["frames"] == -(-round(0.9 * 24_000) // 1920)
    cloned = speak(client, voice="rt-me")
    assert sf.info(io.BytesIO(cloned)).frames == 12 * 1920
    assert cloned != speak(client)


@pytest.mark.parametrize("field, value", [("language", "en"), ("instructions", "calm"),
                                          ("voices", ["a"]), ("lora", {"a": 1.0}),
                                          ("min_new_tokens", 99999)])  # above the default max
def test_what_realtime_does_not_take_is_a_400_naming_it(http, field, value):
    reply = http.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, field: value})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field, reply.text
