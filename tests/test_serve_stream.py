"""Streamed speech from a real `moss-gguf serve` process, read with the official `openai`
client's `with_streaming_response`: pcm, wav and SSE streams hold the non-streamed samples and
come in more than one chunk; a client that leaves midway frees the worker; concurrent greedy
requests, batched, get what they get alone."""

from __future__ import annotations

import base64
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families
from test_serve import GREEDY, KEY, TEXT, TIMEOUT, rms_db, start_serve

from moss_gguf_cli.tts.codec import FRAME_SAMPLES, SAMPLE_RATE, TARGET_DBFS

# Streamed samples are the whole decode's (tests/test_tts_streaming.py: within 1e-5 before
# rounding), so after rounding to 16 bits they may differ by one step at most.
LSB = 1


@pytest.fixture(scope="module")
def server(tiny_weights: Path, tmp_path_factory):
    log, voices = tmp_path_factory.mktemp("log") / "s.log", tmp_path_factory.mktemp("voices")
    srv = start_serve(tiny_weights / "moss-tts.yaml", log, "--api-key", KEY,
                      "--voices", str(voices))
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def whole_pcm(client) -> np.ndarray:
    data = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT,
                                      response_format="pcm", extra_body=GREEDY).content  # fmt: skip
    samples = np.frombuffer(data, dtype="<i2")
    # the gain a stream holds is measured on its first window; the tiny codec's noise is
    # loud enough that the whole utterance's gain sits at the same −3 dB limit
    assert rms_db(samples / 32767.0) > TARGET_DBFS + 1
    return samples


def streamed(client, fmt: str, stream_format: str, **extra) -> list[bytes]:
    with client.audio.speech.with_streaming_response.create(
        model="moss-tts", voice="alloy", input=TEXT, response_format=fmt,
        extra_body={**GREEDY, "stream_format": stream_format, **extra},
    ) as reply:  # fmt: skip
        assert reply.status_code == 200
        return [piece for piece in reply.iter_bytes() if piece]


def test_streamed_pcm_is_the_whole_pcm_in_chunks(client, whole_pcm):
    chunks = streamed(client, "pcm", "audio")
    assert len(chunks) > 1 and len(chunks[0]) == 2 * FRAME_SAMPLES  # the first window: 1 frame
    samples = np.frombuffer(b"".join(chunks), dtype="<i2")
    assert samples.shape == whole_pcm.shape
    assert np.max(np.abs(samples.astype(np.int32) - whole_pcm)) <= LSB


def test_streamed_wav_has_a_streaming_header_and_plays(client, whole_pcm):
    data = b"".join(streamed(client, "wav", "audio"))
    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"  # length unknown upfront
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == SAMPLE_RATE
    assert np.max(np.abs(samples.astype(np.int32) - whole_pcm)) <= LSB


def test_sse_sends_deltas_then_done(client, whole_pcm):
    events = [json.loads(line[len("data: "):])
              for line in b"".join(streamed(client, "pcm", "sse")).decode().splitlines()
              if line.startswith("data: ")]  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) > 2
    usage = events[-1]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    samples = np.frombuffer(audio, dtype="<i2")
    assert np.max(np.abs(samples.astype(np.int32) - whole_pcm)) <= LSB


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": "mp3", "stream_format": "sse"}, "response_format"),
    ({"response_format": "pcm", "stream_format": "audio", "speed": 2.0}, "speed"),
])  # fmt: skip
def test_what_cannot_stream_is_refused(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        stream_format = fields.pop("stream_format")
        client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT, **fields,
                                   extra_body={"stream_format": stream_format})  # fmt: skip
    assert caught.value.body["param"] == param


def metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


def wait_abandoned_and_idle(server) -> None:
    """Until the server counts an abandoned stream and its worker is free."""
    deadline = time.monotonic() + TIMEOUT
    while metric(server, "moss_gguf_streams_abandoned_total") < 1 or metric(
        server, "moss_gguf_busy"
    ):
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.05)


def test_a_client_that_leaves_midway_frees_the_worker(server, client, whole_pcm):
    # as many steps as n_ctx allows: the request would run on long after the first chunk
    long = {**GREEDY, "max_new_tokens": 100_000, "stream_format": "audio"}
    with client.audio.speech.with_streaming_response.create(
        model="moss-tts", voice="alloy", input=TEXT, response_format="pcm", extra_body=long,
    ) as reply:  # fmt: skip
        first = next(reply.iter_bytes())
        assert len(first) == 2 * FRAME_SAMPLES
    wait_abandoned_and_idle(server)
    assert "cancelled at a generation step" in server.text()
    # the next requests are served
    assert np.array_equal(np.frombuffer(b"".join(streamed(client, "pcm", "audio")), "<i2"),
                          whole_pcm)  # fmt: skip


def test_four_concurrent_greedy_requests_equal_each_alone(server, client):
    """Different lengths (texts and max_new_tokens): they join and leave the batch at
    different steps; each reply is the one it gets alone."""
    # hundreds of steps each (about a second): the four surely overlap
    jobs = [("One.", 300), ("Two words here.", 340), ("A third, longer sentence.", 380),
            ("Four.", 320)]  # fmt: skip

    def ask(job: tuple[str, int]) -> bytes:
        text, steps = job
        return client.audio.speech.create(
            model="moss-tts", voice="alloy", input=text, response_format="pcm",
            extra_body={**GREEDY, "max_new_tokens": steps}).content  # fmt: skip

    alone = [ask(job) for job in jobs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, jobs))
    assert together == alone
    assert metric(server, "moss_gguf_batch_size_max") == 4  # they did share steps
