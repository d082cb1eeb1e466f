"""`moss-gguf serve` as a real process on 127.0.0.1, driven by the official `openai` client
(httpx where the client cannot say it): every response format decoded back, voices, each
error case, auth, metrics, the queue bound and a clean stop on SIGTERM and SIGINT."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import unpinned
from prometheus_client.parser import text_string_to_metric_families

from moss_gguf_cli.hold_points import ENV as HOLD_ENV
from moss_gguf_cli.serve.audio import change_speed
from moss_gguf_cli.serve.settings import MAX_INPUT_CHARS, MAX_UPLOAD_BYTES
from moss_gguf_cli.tts.codec import FRAME_SAMPLES, SAMPLE_RATE

KEY = "sk-test-0123456789"
TEXT = "Hello from the server."
GREEDY = {"text_temperature": 0, "audio_temperature": 0, "max_new_tokens": 48}
TIMEOUT = 120  # seconds; a safety net for a stuck server, not a measure of speed


@dataclass
class Server:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    log: Path

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send SIG; the exit status, which must come within seconds."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=20)


def _default_sigint() -> None:
    # a test runner started in the background ignores SIGINT, and children inherit that
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _whole_machine() -> None:
    _default_sigint()
    unpinned()


def start_serve(config: Path, log: Path, *args: str, env: dict | None = None,
                whole_machine: bool = False) -> Server:  # fmt: skip
    """`moss-gguf serve --port 0` started and waited for: the URL it announces. WHOLE_MACHINE:
    on every CPU of the run, not the test worker's share (conftest.unpinned)."""
    cmd = [sys.executable, "-m", "moss_gguf_cli", "serve", "--config", str(config),
           "--host", "127.0.0.1", "--port", "0", *args]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})},
                                preexec_fn=_whole_machine if whole_machine
                                else _default_sigint)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
        assert proc.poll() is None, f"serve exited {proc.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, "serve never announced its address"
        time.sleep(0.05)
    return Server(proc, f"http://127.0.0.1:{found.group(1)}", log)


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def server(tiny_weights: Path, voices_dir: Path, tmp_path_factory):
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path_factory.mktemp("log") / "serve.log",
                      "--api-key", KEY, "--voices", str(voices_dir))  # fmt: skip
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def http(server: Server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {KEY}"}) as c:  # fmt: skip
        yield c


@pytest.fixture(scope="module")
def greedy_wav(server: Server) -> np.ndarray:
    """The greedy WAV every other format is compared with (samples at 24 kHz)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    reply = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT,
                                       response_format="wav", extra_body=GREEDY)  # fmt: skip
    data, rate = sf.read(io.BytesIO(reply.content), dtype="float32")
    assert rate == SAMPLE_RATE and data.ndim == 1
    assert data.size > 0 and data.size % FRAME_SAMPLES == 0
    return data


def speak(client: openai.OpenAI, fmt: str, **extra) -> bytes:
    return client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT,
                                      response_format=fmt, extra_body={**GREEDY, **extra}).content


def av_decode(data: bytes) -> tuple[np.ndarray, int, int]:
    """(samples, decoded rate, the rate the stream says it was made at) through PyAV."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        pieces = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    return np.concatenate(pieces), rate, stream.sample_rate


def rms_db(x: np.ndarray) -> float:
    return 20 * math.log10(float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) + 1e-12)


# ---------------------------------------------------------------- speech


def test_models_health_and_the_startup_line(server, client, http):
    assert [m.id for m in client.models.list().data] == ["moss-tts"]
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    line = next(x for x in server.text().splitlines() if "/v1" in x)
    assert "MOSS-TTS" in line and "f16.gguf, n_vq 32" in line and "API key required" in line


def test_pcm_and_flac_hold_the_wav_samples(client, greedy_wav):
    as_int16 = np.round(greedy_wav * 32768).astype(np.int16)  # soundfile read int / 32768
    pcm = np.frombuffer(speak(client, "pcm"), dtype="<i2")  # raw 16-bit LE mono, 24 kHz
    np.testing.assert_array_equal(pcm, as_int16)
    flac, rate = sf.read(io.BytesIO(speak(client, "flac")), dtype="int16")
    assert rate == SAMPLE_RATE
    np.testing.assert_array_equal(flac, as_int16)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_compressed_formats_decode_to_the_same_length_and_level(client, greedy_wav, fmt):
    samples, rate, made_at = av_decode(speak(client, fmt))
    assert made_at == SAMPLE_RATE or (fmt == "opus" and rate == 48000)  # Opus decodes at 48k
    seconds = samples.size / rate
    expected = greedy_wav.size / SAMPLE_RATE
    # encoders add up to a frame of priming/padding: 2 frames of slack (mp3 1152, aac 1024)
    assert abs(seconds - expected) <= 2 * 1152 / SAMPLE_RATE, (seconds, expected)
    assert abs(rms_db(samples) - rms_db(greedy_wav)) < 3.0


def test_mp3_is_the_default_format(server, greedy_wav):
    reply = httpx.post(f"{server.url}/v1/audio/speech", timeout=TIMEOUT,
                       headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": "tts-1", "input": TEXT, "voice": "default", **GREEDY})
    assert reply.status_code == 200 and reply.headers["content-type"] == "audio/mpeg"
    samples, rate, _ = av_decode(reply.content)
    assert rate == SAMPLE_RATE and samples.size > greedy_wav.size // 2


def test_speed_changes_the_tempo(client, greedy_wav):
    for speed in (2.0, 0.5):
        fast = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT,
                                          response_format="wav", speed=speed,
                                          extra_body=GREEDY).content  # fmt: skip
        data, rate = sf.read(io.BytesIO(fast))
        assert rate == SAMPLE_RATE
        assert data.size == pytest.approx(greedy_wav.size / speed, rel=0.1)


def test_change_speed_keeps_the_pitch():
    """Tempo, not pitch: a 220 Hz tone played twice (half) as fast is still 220 Hz."""
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    tone = (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    for speed in (2.0, 0.5, 0.25):
        out = change_speed(tone, SAMPLE_RATE, speed)
        assert out.size == pytest.approx(tone.size / speed, rel=0.03)
        spectrum = np.abs(np.fft.rfft(out * np.hanning(out.size)))
        peak_hz = np.argmax(spectrum) * SAMPLE_RATE / out.size
        assert peak_hz == pytest.approx(220, abs=3)
    assert change_speed(tone, SAMPLE_RATE, 1.0) is tone


def test_sampling_fields_reach_the_sampler(client):
    """Seeded sampling repeats itself; another seed, or greedy, says something else."""
    sampled = {"max_new_tokens": 48, "text_temperature": 1.0, "audio_temperature": 1.0,
               "audio_top_k": 25, "audio_top_p": 0.9, "text_top_k": 50, "text_top_p": 1.0,
               "audio_repetition_penalty": 1.1}  # fmt: skip
    first = speak(client, "pcm", seed=11, **sampled)
    assert speak(client, "pcm", seed=11, **sampled) == first
    assert speak(client, "pcm", seed=12, **sampled) != first
    assert speak(client, "pcm", seed=11, **{**sampled, **GREEDY}) != first


def test_instructions_reach_the_prompt(client, greedy_wav):
    """`instructions` is the prompt's Instruction field: greedy audio changes with it."""
    styled = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT,
                                        instructions="Whisper, slowly.", response_format="wav",
                                        extra_body=GREEDY).content  # fmt: skip
    data, rate = sf.read(io.BytesIO(styled), dtype="float32")
    assert rate == SAMPLE_RATE and data.size > 0
    assert not np.array_equal(data, greedy_wav)


def test_language_names_and_codes_reach_the_prompt(client, http, greedy_wav):
    """`language` takes a name or a code (the same name in the prompt: the same audio); auto
    is no tag at all; anything else is a 400 naming the field and listing the names."""
    by_code = speak(client, "pcm", language="zh")
    assert by_code == speak(client, "pcm", language="Chinese")
    assert by_code != speak(client, "pcm", language="en")
    auto = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT,
                                      response_format="wav",
                                      extra_body={**GREEDY, "language": "auto"}).content
    assert np.array_equal(sf.read(io.BytesIO(auto), dtype="float32")[0], greedy_wav)
    reply = http.post("/v1/audio/speech", json={"model": "moss-tts", "input": TEXT,
                                                "language": "klingon", **GREEDY})  # fmt: skip
    error = error_of(reply, 400, "language")
    assert "klingon" in error["message"] and "Persian (Farsi)" in error["message"]
    assert "\n" not in error["message"]


def test_the_languages_route_lists_upstreams_names(http):
    from moss_gguf_cli.delay.language import LANGUAGES

    reply = http.get("/v1/audio/languages")
    assert reply.status_code == 200
    body = reply.json()
    names = [entry["name"] for entry in body["data"]]
    assert names == list(LANGUAGES) and len(names) == 31 and body["auto"] == "auto"
    codes = {entry["name"]: entry["codes"] for entry in body["data"]}
    assert "zh" in codes["Chinese"] and "yue" in codes["Cantonese"] and "en" in codes["English"]


def test_voices_per_speaker_are_for_dialogue_models_only(http):
    reply = http.post("/v1/audio/speech", json={"model": "moss-tts", "input": TEXT,
                                                "voices": ["a", "b"], **GREEDY})  # fmt: skip
    assert "MOSS-TTSD" in error_of(reply, 400, "voices")["message"]


# ---------------------------------------------------------------- voices


def add_voice(http: httpx.Client, name: str, clip: Path, text: str | None = None):
    """POST /v1/audio/voices as a multipart form: name, file (, text)."""
    data = {"name": name, **({"text": text} if text else {})}
    with open(clip, "rb") as fh:
        return http.post("/v1/audio/voices", data=data, files={"file": (clip.name, fh)})


@pytest.fixture(scope="module")
def kept_voice(http, reference_wav, voices_dir) -> str:
    """A voice registered on the module's server: a later server on the folder must list it."""
    reply = add_voice(http, "narrator", reference_wav)
    assert reply.status_code == 200, reply.text
    assert (voices_dir / "narrator.npz").is_file()
    return "narrator"


def test_voice_registered_listed_used_deleted(client, http, reference_wav, voices_dir, greedy_wav):
    reply = add_voice(http, "me-1", reference_wav, text="a sine, as transcript")
    assert reply.status_code == 200, reply.text
    frames = math.ceil(round(0.9 * SAMPLE_RATE) / FRAME_SAMPLES)
    assert reply.json() == {**reply.json(), "name": "me-1", "frames": frames,
                            "text": "a sine, as transcript"}  # fmt: skip
    listed = {v["name"]: v for v in http.get("/v1/audio/voices").json()["data"]}
    assert listed["me-1"]["frames"] == frames
    assert not list(voices_dir.glob(".*tmp*"))  # written under a temporary name, renamed

    cloned = client.audio.speech.create(model="moss-tts", voice="me-1", input=TEXT,
                                        response_format="wav", extra_body=GREEDY).content
    data, rate = sf.read(io.BytesIO(cloned), dtype="float32")
    assert rate == SAMPLE_RATE and data.size % FRAME_SAMPLES == 0 and data.size > 0
    assert not np.array_equal(data, greedy_wav)  # the reference is in the prompt
    # OpenAI's custom-voice form names it too
    again = client.audio.speech.create(model="moss-tts", voice={"id": "me-1"}, input=TEXT,
                                       response_format="wav", extra_body=GREEDY).content
    assert again == cloned

    deleted = http.delete("/v1/audio/voices/me-1")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert not (voices_dir / "me-1.npz").exists()
    assert "me-1" not in {v["name"] for v in http.get("/v1/audio/voices").json()["data"]}
    with pytest.raises(openai.NotFoundError) as err:
        client.audio.speech.create(model="moss-tts", voice="me-1", input=TEXT)
    assert err.value.body["param"] == "voice"


# ---------------------------------------------------------------- errors


def error_of(reply: httpx.Response, status: int, param: str | None) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"] and "Traceback" not in error["message"]
    return error


def test_each_error_has_its_status_and_names_the_field(server, http, reference_wav, tmp_path):
    post = lambda body: http.post("/v1/audio/speech", json=body)  # noqa: E731
    ok = {"model": "moss-tts", "input": TEXT, **GREEDY}
    error_of(http.post("/v1/audio/speech", content=b"{nope",
                       headers={"Content-Type": "application/json"}), 400, None)  # fmt: skip
    assert "input" in error_of(post({**ok, "input": "   "}), 400, "input")["message"]
    error_of(post({k: v for k, v in ok.items() if k != "input"}), 400, "input")
    error_of(post({**ok, "speed": 10}), 400, "speed")
    error_of(post({**ok, "response_format": "ogg"}), 400, "response_format")
    error_of(post({**ok, "audio_top_p": 0}), 400, "audio_top_p")
    error_of(post({**ok, "max_new_tokens": 0}), 400, "max_new_tokens")
    error_of(post({**ok, "audio_temprature": 0.5}), 400, "audio_temprature")  # misspelt
    error_of(post({**ok, "stream_format": "chunks"}), 400, "stream_format")
    assert error_of(post({**ok, "model": "gpt-9"}), 404, "model")["code"] == "model_not_found"
    error_of(post({**ok, "voice": "nobody"}), 404, "voice")
    error_of(post({**ok, "input": "x" * (MAX_INPUT_CHARS + 1)}), 413, "input")
    error_of(add_voice(http, "../../etc/evil", reference_wav), 400, "name")
    error_of(add_voice(http, "alloy", reference_wav), 400, "name")  # a built-in name
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio at all")
    error = error_of(add_voice(http, "broken", bad), 400, "file")
    assert "notes.wav" in error["message"] and "moss-gguf-voice" not in error["message"]
    error_of(http.delete("/v1/audio/voices/nobody"), 404, "name")
    huge = tmp_path / "huge.wav"
    huge.write_bytes(b"\0" * (MAX_UPLOAD_BYTES + 1))
    error_of(add_voice(http, "huge", huge), 413, "file")
    error_of(http.get("/v1/nothing"), 404, None)
    # the server goes on answering, and said nothing of tracebacks
    assert post(ok).status_code == 200
    assert "Traceback" not in server.text()


def test_the_api_key_is_required(server, client):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        reply = httpx.get(f"{server.url}/v1/models", headers=headers)
        assert error_of(reply, 401, None)["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT)
    assert client.models.list().data  # the right key still works


def test_metrics(http, greedy_wav):
    reply = http.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    speech_ok = (("path", "/v1/audio/speech"), ("status", "200"))
    assert samples[("moss_gguf_requests_total", speech_ok)] >= 1
    assert samples[("moss_gguf_audio_seconds_total", ())] >= greedy_wav.size / SAMPLE_RATE
    assert samples[("moss_gguf_generated_frames_total", ())] >= greedy_wav.size / FRAME_SAMPLES
    assert samples[("moss_gguf_generation_frames_per_second", ())] > 0
    assert samples[("moss_gguf_queue_length", ())] == 0
    count = ("moss_gguf_request_duration_seconds_count", (("path", "/v1/audio/speech"),))
    assert samples[count] >= 1


def test_a_client_that_leaves_frees_the_worker(server, http):
    """The request stops at its next generation step, not after its whole utterance."""
    body = json.dumps({"model": "moss-tts", "input": TEXT, "max_new_tokens": 2000}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nAuthorization: Bearer " + KEY.encode()
                    + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        while not http.get("/health").json()["busy"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    # n_ctx leaves ~900 steps: only a cancelled request says this before the worker is free
    while "cancelled at a generation step" not in server.text() or http.get("/health").json()[
        "busy"
    ]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert http.post("/v1/audio/speech", json={"model": "moss-tts", "input": TEXT,
                                               **GREEDY}).status_code == 200  # fmt: skip


# ---------------------------------------------------------------- start and stop


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moss_gguf_cli", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, **(env or {})})


def test_a_network_address_needs_a_key(tiny_weights):
    done = run_cli("serve", "--config", str(tiny_weights / "moss-tts.yaml"),
                   "--host", "0.0.0.0", "--port", "0")  # fmt: skip
    assert done.returncode == 2
    assert "--api-key" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_missing_extra_is_one_line(tiny_weights):
    config = str(tiny_weights / "moss-tts.yaml")
    code = ("import sys; sys.modules['fastapi'] = None\n"
            "from moss_gguf_cli.cli.app import main\n"
            f"sys.argv = ['moss-gguf', 'serve', '--config', {config!r}]\n"
            "main()\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT)  # fmt: skip
    assert done.returncode == 1
    assert "pip install 'moss-gguf[serve]'" in done.stderr and "fastapi" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigterm_answers_what_runs_and_waits_with_503_and_exits_0(
    tiny_weights, voices_dir, kept_voice, tmp_path
):
    marker = tmp_path / "held"
    # the key from the environment this time (it stays out of the process list)
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path / "serve.log",
                      "--voices", str(voices_dir), "--max-queue", "1", "--max-batch", "1",
                      env={HOLD_ENV: f"serve={marker}", "MOSS_GGUF_API_KEY": KEY})  # fmt: skip
    try:
        http = httpx.Client(base_url=srv.url, timeout=TIMEOUT,
                            headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
        assert http.get("/v1/models", headers={"Authorization": ""}).status_code == 401
        # a restarted server still has the voices stored before
        assert kept_voice in {v["name"] for v in http.get("/v1/audio/voices").json()["data"]}
        replies: dict[str, httpx.Response] = {}

        def send(name: str) -> None:
            replies[name] = http.post("/v1/audio/speech", json={"model": "moss-tts",
                                      "input": TEXT, "voice": kept_voice, **GREEDY})  # fmt: skip

        running = threading.Thread(target=send, args=("running",))
        running.start()
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():  # the worker is inside a generation step, held there
            assert time.monotonic() < deadline and srv.proc.poll() is None
            time.sleep(0.02)
        waiting = threading.Thread(target=send, args=("waiting",))
        waiting.start()
        while http.get("/health").json()["queue"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        full = http.post("/v1/audio/speech", json={"model": "moss-tts", "input": TEXT})
        assert error_of(full, 429, None)["code"] == "queue_full"

        assert srv.stop(signal.SIGTERM) == 0
        running.join(TIMEOUT)
        waiting.join(TIMEOUT)
        for name in ("running", "waiting"):
            assert error_of(replies[name], 503, None)["code"] == "shutting_down"
        assert "Traceback" not in srv.text()
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def test_sigint_exits_0_within_seconds(tiny_weights, tmp_path):
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path / "serve.log",
                      "--voices", str(tmp_path / "voices"))  # fmt: skip
    try:
        assert httpx.get(f"{srv.url}/health", timeout=TIMEOUT).status_code == 200  # no key here
        start = time.monotonic()
        assert srv.stop(signal.SIGINT) == 0
        assert time.monotonic() - start < 10
        assert "Traceback" not in srv.text() and "Shutting down" in srv.text()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{srv.url}/health", timeout=5)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
