"""`moss-gguf serve` on a MOSS-TTS-Nano folder: the real server on 127.0.0.1, spoken to with
the official `openai` client and httpx. It answers model "moss-tts-nano" (listed in
/v1/models); wav / flac / mp3 / opus / aac are 48 kHz stereo, `pcm` is OpenAI's (24 kHz mono
16-bit: 96,000 bytes for 2.0 s); a streamed answer is the whole one, byte for byte; greedy
requests repeat; requests at once take turns and each gets the bytes it gets alone; a client
that leaves midway is stopped at its next frame; a registered voice is cloned; what Nano does
not take is a 400 naming the field. The one serve core's reliability holds as for the delay
models: a runaway chunk is run again, a stalled frame is answered by the watchdog, a stop
answers what runs and waits with 503."""

from __future__ import annotations

import base64
import io
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from conftest import RUN_CPUS, nano_yaml
from test_serve import KEY, TIMEOUT, add_voice, av_decode, error_of, start_serve
from test_serve_stream import metric, wait_abandoned_and_idle

from moss_gguf_cli.hold_points import ENV as HOLD_ENV
from moss_gguf_cli.native.cpu_features import physical_cores
from moss_gguf_cli.tts.codec import resample

MODEL = "moss-tts-nano"
TEXT = "Hello from the Nano server."
TWO_S = {"min_new_tokens": 25, "max_new_tokens": 25, "seed": 11}
GREEDY = {**TWO_S, "text_temperature": 0, "audio_temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_nano_folder, tmp_path_factory):
    # on the whole machine, so that two requests at once get an engine a core; one thread an
    # engine: an engine's two threads spinning against the other test worker made a stream
    # 4x slower, and the engines step in turn on one thread anyway (nano/serving.py)
    config = nano_yaml(tiny_nano_folder, "serve-nano.yaml", tmp_path_factory.mktemp("nano"),
                       n_threads=1)  # fmt: skip
    srv = start_serve(config, tmp_path_factory.mktemp("log") / "serve.log", "--api-key", KEY,
                      "--voices", str(tmp_path_factory.mktemp("voices")),
                      whole_machine=True)  # fmt: skip
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


def speak(client: openai.OpenAI, fmt: str, voice: str = "alloy", **extra) -> bytes:
    return client.audio.speech.create(model=MODEL, voice=voice, input=TEXT, response_format=fmt,
                                      extra_body={**TWO_S, **extra}).content  # fmt: skip


@pytest.fixture(scope="module")
def wav(client) -> np.ndarray:
    data, rate = sf.read(io.BytesIO(speak(client, "wav")), dtype="int16")
    assert rate == 48_000
    return data


def test_the_model_is_listed_and_announced(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert f"serving MOSS-TTS-Nano (nano_global_q8_0.gguf, n_vq 16) as model '{MODEL}'" \
        in server.text()  # fmt: skip


def test_wav_is_two_seconds_of_48k_stereo_and_pcm_is_openais(client, wav):
    assert wav.shape == (96_000, 2) and np.abs(wav).max() > 300
    pcm = np.frombuffer(speak(client, "pcm"), dtype="<i2")
    assert pcm.size * 2 == 96_000  # 2.0 s of 24 kHz mono 16-bit
    # the channels averaged and resampled (from the floats the WAV rounds: within 2 steps)
    expected = resample(wav.astype(np.float32).mean(axis=1) / 32767.0, 48_000, 24_000)
    assert np.abs(np.round(expected * 32767.0) - pcm).max() <= 2


def test_flac_holds_the_wav_samples_and_compressed_formats_are_48k_stereo(client, wav):
    flac, rate = sf.read(io.BytesIO(speak(client, "flac")), dtype="int16")
    assert rate == 48_000 and np.array_equal(flac, wav)
    for fmt in ("mp3", "opus", "aac"):
        data = speak(client, fmt)
        samples, rate, _ = av_decode(data)
        with av.open(io.BytesIO(data)) as c:
            channels = c.streams.audio[0].codec_context.channels
        seconds = samples.size / channels / rate
        assert (rate, channels) == (48_000, 2) and abs(seconds - 2.0) < 0.1, (fmt, seconds)


def sse(http, **fields) -> tuple[list[dict], list[bytes]]:
    """A wav request's SSE events, and the audio of its deltas (a WAV header, then samples)."""
    body = {"model": MODEL, "input": TEXT, "response_format": "wav", "stream_format": "sse",
            **fields}  # fmt: skip
    events = [json.loads(line[5:]) for line in
              http.post("/v1/audio/speech", json=body).text.splitlines()
              if line.startswith("data:")]  # fmt: skip
    return events, [base64.b64decode(e["audio"]) for e in events
                    if e["type"] == "speech.audio.delta"]  # fmt: skip


def test_a_stream_is_the_whole_answer_byte_for_byte(client, http):
    whole = speak(client, "pcm")
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="alloy", input=TEXT, response_format="pcm",
        extra_body={**TWO_S, "stream_format": "audio"},
    ) as reply:
        pieces = list(reply.iter_bytes())
    assert b"".join(pieces) == whole
    # SSE: wav deltas (a streamed header, then the samples) hold the whole WAV's samples
    events, deltas = sse(http, **TWO_S)
    assert len(deltas) > 2 and events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == 25
    assert b"".join(deltas)[44:] == speak(client, "wav")[44:]


def test_requests_at_once_each_equal_their_answer_alone(server, client):
    """Two engines on this 2-core machine (one a core): two requests are spoken side by side,
    each the bytes it is alone; greedy ones repeat; seeds decide the sampled ones."""
    alone = [speak(client, "wav", seed=s) for s in (12, 13)]
    assert alone[0] != alone[1]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda s: speak(client, "wav", seed=s), (12, 13)))
        greedy = list(pool.map(lambda _: speak(client, "wav", **GREEDY), range(2)))
    assert together == alone and greedy[0] == greedy[1]
    assert metric(server, "moss_gguf_batch_size_max") == min(2, physical_cores(RUN_CPUS))


def test_a_client_that_leaves_midway_is_stopped_at_its_next_frame(server, client):
    """A long stream whose client leaves after its first chunk ends at its next frame (the
    server says so), while a request spoken in turn beside it goes on to its whole answer,
    the bytes it gets alone; then the worker is free."""
    alone = speak(client, "wav", seed=12)
    long = {"min_new_tokens": 1500, "max_new_tokens": 1500, "seed": 3, "stream_format": "audio"}
    with ThreadPoolExecutor(1) as pool:
        with client.audio.speech.with_streaming_response.create(
            model=MODEL, voice="alloy", input=TEXT, response_format="pcm", extra_body=long,
        ) as reply:  # fmt: skip
            chunks = reply.iter_bytes()
            next(chunks)
            beside = pool.submit(speak, client, "wav", seed=12)
            while metric(server, "moss_gguf_batch_size_max") < 2 and not beside.done():
                next(chunks)  # the long one goes on until the other has joined it
        assert beside.result() == alone
    wait_abandoned_and_idle(server)
    assert "a speech request was cancelled at a generation step" in server.text()


def test_a_registered_voice_is_cloned(client, http, reference_wav):
    reply = add_voice(http, "nano-me", reference_wav)
    assert reply.status_code == 200, reply.text
    assert reply.json()["frames"] == -(-round(0.9 * 48_000) // 3840)
    assert reply.json()["seconds"] == round(reply.json()["frames"] * 0.08, 3)
    cloned = speak(client, "wav", voice="nano-me")
    assert sf.info(io.BytesIO(cloned)).frames == 96_000
    assert cloned != speak(client, "wav")


@pytest.mark.parametrize("field, value", [("language", "en"), ("instructions", "calm"),
                                          ("voices", ["a"]), ("lora", {"a": 1.0}),
                                          ("min_new_tokens", 376)])  # above the default max
def test_what_nano_does_not_take_is_a_400_naming_it(http, field, value):
    body = {"model": MODEL, "input": TEXT, field: value}
    reply = http.post("/v1/audio/speech", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field, reply.text


# the stop masked for 5,000 frames: beside its prompt, more than the server's n_ctx (2,048)
TOO_LONG = {"min_new_tokens": 5000, "max_new_tokens": 5000, "seed": 1}


def refused_at_once(error: dict, started: float) -> None:
    """ERROR (OpenAI's error object) names max_new_tokens and what fits, and came at once:
    made frame by frame, the request ran ~1,900 frames before it was refused."""
    assert time.monotonic() - started < 2.0
    assert error["param"] == "max_new_tokens" and error["code"] == "context_length_exceeded"
    assert "this server holds 2,048; lower max_new_tokens and min_new_tokens to" \
        in error["message"], error  # fmt: skip


def test_a_request_longer_than_the_context_is_refused_before_any_audio(client, http):
    """A request whose whole length cannot fit n_ctx is a 400 before its first frame: the
    whole answer, a stream (no 200 and then a cut body) and SSE alike."""
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as caught:
        speak(client, "wav", **TOO_LONG)
    refused_at_once(caught.value.body, started)
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as caught:
        with client.audio.speech.with_streaming_response.create(
            model=MODEL, voice="alloy", input=TEXT, response_format="pcm",
            extra_body={**TOO_LONG, "stream_format": "audio"},
        ):  # fmt: skip
            pass
    refused_at_once(caught.value.body, started)
    body = {"model": MODEL, "input": TEXT, "response_format": "wav", "stream_format": "sse",
            **TOO_LONG}  # fmt: skip
    started = time.monotonic()
    with http.stream("POST", "/v1/audio/speech", json=body) as reply:
        assert reply.status_code == 400
        refused_at_once(json.loads(reply.read())["error"], started)


def test_no_languages_are_offered(http):
    assert http.get("/v1/audio/languages").status_code == 404


def test_a_release_written_checkpoint_is_served_the_same_way(release_nano_folder, tmp_path):
    """The second tiny checkpoint (torch.save's pytorch_model.bin, tied storage, bf16) served
    to the openai client: 2.0 s of 48 kHz stereo, and pcm as OpenAI's (96,000 bytes)."""
    srv = start_serve(release_nano_folder / "moss-tts-nano.yaml", tmp_path / "serve.log",
                      "--api-key", KEY, "--voices", str(tmp_path / "voices"))  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0,
                               timeout=TIMEOUT)  # fmt: skip
        data, rate = sf.read(io.BytesIO(speak(client, "wav")), dtype="int16")
        assert rate == 48_000 and data.shape == (96_000, 2)
        assert len(speak(client, "pcm")) == 96_000
    finally:
        srv.stop()


def held_server(folder, tmp_path, *args: str):
    """The Nano server of FOLDER with ARGS, whose first frame holds (the `serve` hold point),
    and the marker saying it got there. One thread: two spinning against a busy machine's
    other work can take a stall limit before the first frame."""
    marker = tmp_path / "held"
    config = nano_yaml(folder, "held.yaml", tmp_path, n_threads=1)
    srv = start_serve(config, tmp_path / "s.log", "--api-key", KEY, "--voices",
                      str(tmp_path / "voices"), *args,
                      env={HOLD_ENV: f"serve={marker}"})  # fmt: skip
    return srv, marker


def test_a_stalled_nano_request_is_answered_by_the_watchdog(tiny_nano_folder, tmp_path):
    """The one serve core's watchdog (serve/scheduler.Watchdog) watches Nano's frames too:
    held inside a frame (the `serve` hold point), the request gets 500 engine_stalled after
    --stall-timeout and /health says stalled, as for the delay models (test_serve_hostile)."""
    srv, marker = held_server(tiny_nano_folder, tmp_path, "--stall-timeout", "2")
    try:
        started = time.monotonic()
        reply = httpx.post(f"{srv.url}/v1/audio/speech", timeout=TIMEOUT,
                           headers={"Authorization": f"Bearer {KEY}"},
                           json={"model": MODEL, "input": TEXT, **GREEDY})  # fmt: skip
        assert marker.exists()
        assert reply.status_code == 500 and reply.json()["error"]["code"] == "engine_stalled"
        assert time.monotonic() - started < 30
        health = httpx.get(f"{srv.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "stalled"
    finally:
        srv.stop()


# the stop allowed from frame 2, at most 3 frames: builtin:tiny-nano's first try with seed 10
# runs to its max (a runaway) and its retry stops at 2 frames; seed 0's retry runs away too
RUNAWAY = {"min_new_tokens": 2, "max_new_tokens": 3}
FRAME = 3840  # samples of 48 kHz audio a frame makes


def test_a_runaway_chunk_is_run_again_with_another_seed(server, client, http):
    """As the delay models': a chunk that reaches max_new_tokens though its stop was allowed
    runs again with another seed, --runaway-retries times (1 by default), and one that runs
    away again is counted; a stream keeps its first try (its audio went out as it was made)."""
    before = metric(server, "moss_gguf_runaway_chunks_total")
    assert sf.info(io.BytesIO(speak(client, "wav", seed=10, **RUNAWAY))).frames == 2 * FRAME
    assert sf.info(io.BytesIO(speak(client, "wav", seed=0, **RUNAWAY))).frames == 3 * FRAME
    assert metric(server, "moss_gguf_runaway_chunks_total") == before + 1  # seed 0's
    events, deltas = sse(http, seed=10, **RUNAWAY)
    assert len(b"".join(deltas)[44:]) == 3 * FRAME * 4  # 16-bit stereo
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["runaways"] == [1]


def test_sigterm_answers_what_runs_and_waits_with_503(tiny_nano_folder, tmp_path):
    """One engine (--max-batch 1): a request held inside a frame and one waiting for the
    engine are both answered 503 shutting_down by a stop, and the server exits 0."""
    srv, marker = held_server(tiny_nano_folder, tmp_path, "--max-batch", "1")
    try:
        http = httpx.Client(base_url=srv.url, timeout=TIMEOUT,
                            headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
        replies: dict[str, httpx.Response] = {}

        def send(name: str) -> None:
            replies[name] = http.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT,
                                                                **GREEDY})  # fmt: skip

        threads = {name: threading.Thread(target=send, args=(name,))
                   for name in ("running", "waiting")}  # fmt: skip
        threads["running"].start()
        deadline = time.monotonic() + TIMEOUT
        while not marker.exists():  # the worker is inside a frame, held there
            assert time.monotonic() < deadline and srv.proc.poll() is None
            time.sleep(0.02)
        threads["waiting"].start()
        while http.get("/health").json()["queue"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert srv.stop(signal.SIGTERM) == 0
        for name, thread in threads.items():
            thread.join(TIMEOUT)
            assert error_of(replies[name], 503, None)["code"] == "shutting_down"
        assert "Traceback" not in srv.text()
    finally:
        srv.stop()


def test_the_stream_input_socket_is_refused_with_a_reason(server):
    """The WebSocket route is for text that grows (MOSS-TTS-Realtime); a Nano server closes it
    at once, saying to use the speech endpoint."""
    from test_realtime_serve import converse, socket_url

    _, _, closed = converse(socket_url(server), {"text": " "}, [])
    assert closed.code == 1008 and "takes its text whole" in closed.reason, closed
