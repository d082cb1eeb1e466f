"""`moss-gguf serve` against a hostile client (issue #36): a real server on 127.0.0.1, talked
to with httpx, the official `openai` client and raw sockets. No request wedges it, grows its
memory without bound or turns a client's mistake into a 500; a failing step ends only its own
rows (failures injected at the engine's failure points, since no bounded request reaches
them); a stalled engine makes /health unhealthy; a stream that cannot finish says so.
The last test fuzzes the request schema with hypothesis, bounded in count and time."""

from __future__ import annotations

import base64
import io
import json
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import GREEDY, KEY, TEXT, TIMEOUT, start_serve

from moss_gguf_cli.hold_points import ENV as HOLD_ENV
from moss_gguf_cli.serve.settings import MAX_BODY_BYTES, MAX_UPLOAD_BYTES

OK = {"model": "moss-tts", "input": TEXT, "voice": "alloy", "response_format": "wav", **GREEDY}
AUTH = {"Authorization": f"Bearer {KEY}"}
# codes of errors about the whole body, not one field (their param is null)
WHOLE_BODY = {"invalid_json", "empty_body", "body_too_large", "invalid_form", "invalid_request",
              "not_found", "method_not_allowed"}  # fmt: skip
# what no response may say: a server path, an option of the command line, an exception name
NOT_API_WORDS = re.compile(r"/tmp/|/work/|/home/|--[a-z]|Traceback|n_ctx|\bconfig\b|"
                           r"\b[A-Z]\w*(Error|Exception|Failure)\b")  # fmt: skip
RSS_GROWTH_MAX = 300 * 2**20  # the acceptance bound
NEXT_REQUEST_S = 30  # ... and the next normal request is answered within this


def rss(server) -> int:
    """The server process's resident memory, bytes."""
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def api_error(reply: httpx.Response, status: int, param: str | None) -> dict:
    """The OpenAI error object of REPLY, checked: status, param, API words only."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert not NOT_API_WORDS.search(error["message"]), error["message"]
    return error


def serves_normally(url: str) -> None:
    """A normal request is answered with audio within NEXT_REQUEST_S, and /health says ok."""
    t0 = time.monotonic()
    reply = httpx.post(f"{url}/v1/audio/speech", json=OK, headers=AUTH, timeout=NEXT_REQUEST_S)
    assert reply.status_code == 200, reply.text
    assert sf.read(io.BytesIO(reply.content))[0].size > 0
    assert time.monotonic() - t0 < NEXT_REQUEST_S
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text


def raw_answer(server, head: str) -> str:
    """The answer to a request of which only HEAD (the request line and headers) is sent."""
    host, port = server.url.removeprefix("http://").split(":")
    got = b""
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(head.encode())
        while b"}}" not in got and (part := raw.recv(65536)):
            got += part
    return got.decode(errors="replace")


def wav_bytes(seconds: float, rate: int = 24000, fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).uniform(-0.3, 0.3, int(seconds * rate)).astype(np.float32)
    sf.write(buffer, noise if fmt == "WAV" else np.zeros_like(noise), rate, format=fmt)
    return buffer.getvalue()


def stop(server) -> None:
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="module")
def server(tiny_weights: Path, tmp_path_factory):
    log, voices = tmp_path_factory.mktemp("log") / "s.log", tmp_path_factory.mktemp("voices")
    srv = start_serve(tiny_weights / "moss-tts.yaml", log, "--api-key", KEY,
                      "--voices", str(voices), "--max-batch", "2")  # fmt: skip
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=AUTH) as c:
        yield c


# ---------------------------------------------------------------- degenerate values


def test_degenerate_temperatures_are_greedy_and_do_not_wedge(server, http):
    """Finding 1: a temperature of 1e-320 overflowed the division and every later step
    failed. Below 1e-5 a temperature is greedy: the audio is temperature 0's, and the next
    request is served."""
    greedy = http.post("/v1/audio/speech", json=OK)
    assert greedy.status_code == 200, greedy.text
    tiny = {**OK, "text_temperature": 1e-320, "audio_temperature": 5e-324}
    reply = http.post("/v1/audio/speech", json=tiny)
    assert reply.status_code == 200, reply.text
    assert reply.content == greedy.content
    serves_normally(server.url)


@pytest.mark.parametrize(("field", "value"), [
    ("audio_repetition_penalty", 1e-39), ("audio_repetition_penalty", 11),
    ("audio_temperature", 10.5), ("text_temperature", -1e-320), ("text_top_k", 2**40),
    ("audio_top_p", 1e-330), ("audio_top_p", 1.5), ("max_new_tokens", 2**21),
    ("seed", 2**64), ("speed", 1e-300),
])  # fmt: skip
def test_values_outside_the_ranges_are_refused_naming_them(http, field, value):
    error = api_error(http.post("/v1/audio/speech", json={**OK, field: value}), 400, field)
    assert field in error["message"]


def test_too_few_new_tokens_is_a_400_naming_max_new_tokens(http):
    """Finding 4: it was a 500 naming the command line's flag."""
    error = api_error(http.post("/v1/audio/speech", json={**OK, "max_new_tokens": 4}), 400,
                      "max_new_tokens")  # fmt: skip
    assert "max_new_tokens" in error["message"]


# ---------------------------------------------------------------- bodies


def test_malformed_bodies_get_messages_about_the_body(http):
    """Finding 5: empty, not UTF-8, nested deeper than the parser goes, not an object."""
    post = lambda raw: http.post("/v1/audio/speech", content=raw,  # noqa: E731
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    assert api_error(post(b""), 400, None)["code"] == "empty_body"
    for raw in (b'{"model": "moss-tts", "input": "\xff\xfe"}', b"[" * 5000 + b"]" * 5000,
                b"[1, 2]", b'"text"', b"{nope"):  # fmt: skip
        assert api_error(post(raw), 400, None)["code"] == "invalid_json", raw[:20]
    huge = json.dumps({**OK, "seed": 0}).replace('"seed": 0', '"seed": ' + "9" * 5000)
    assert "seed" in api_error(post(huge.encode()), 400, "seed")["message"]


def test_text_within_the_limit_is_spoken_whole_and_a_prompt_that_cannot_fit_names_input(http):
    """4,096 Chinese characters (within the limit) were a 400 naming nothing useful: the
    prompt was longer than the context. Now the text is split into chunks and spoken whole.
    What cannot fit even split (instructions taking the whole context) is a 400 naming
    input, in the API's words."""
    long = {**OK, "input": "中" * 4096, "stream_format": "sse"}
    reply = http.post("/v1/audio/speech", json=long)
    assert reply.status_code == 200, reply.text
    events = [json.loads(line[6:]) for line in reply.text.splitlines()
              if line.startswith("data: ")]  # fmt: skip
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["chunks"] > 1, done
    assert {e["chunk"] for e in events[:-1]} == set(range(1, done["chunks"] + 1))
    crowded = {**OK, "instructions": "x " * 2000}  # 4,000 characters, about 2,000 tokens
    error = api_error(http.post("/v1/audio/speech", json=crowded), 400, "input")
    assert "instructions" in error["message"]


def test_every_string_field_is_bounded(http):
    post = lambda body: http.post("/v1/audio/speech", json=body)  # noqa: E731
    api_error(post({**OK, "instructions": "x" * 4097}), 413, "instructions")
    api_error(post({**OK, "model": "m" * 300}), 400, "model")
    api_error(post({**OK, "voice": "v" * 300}), 400, "voice")
    api_error(post({**OK, "voice": {"id": "v" * 300}}), 400, "voice")


def test_a_large_body_is_refused_before_it_is_read(server, http):
    """Finding 2: 50 MB of instructions took a minute and 4 GB. Now the Content-Length is
    refused before a byte is read: a raw request that declares 50 MB and sends none."""
    before = rss(server)
    t0 = time.monotonic()
    head = raw_answer(server, f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {50 * 2**20}\r\n\r\n")  # fmt: skip
    assert head.startswith("HTTP/1.1 413") and '"param":null' in head, head
    assert time.monotonic() - t0 < 10
    # a body over the bound that is sent (the usual client) gets the same answer
    big = json.dumps({**OK, "instructions": "x" * (MAX_BODY_BYTES + 1)})
    api_error(http.post("/v1/audio/speech", content=big), 413, None)
    assert rss(server) - before < RSS_GROWTH_MAX
    serves_normally(server.url)


def test_a_chunked_body_is_cut_off_at_the_bound(server):
    """No Content-Length to refuse it by: the bytes are counted as they arrive."""
    def chunks():
        for _ in range(64):  # 4 MB, far past the body's bound
            yield b" " * 65536

    try:
        reply = httpx.post(f"{server.url}/v1/audio/speech", content=chunks(), headers=AUTH,
                           timeout=TIMEOUT)  # fmt: skip
        api_error(reply, 413, None)
    except httpx.TransportError:
        pass  # the server answered and closed while the client was still sending
    serves_normally(server.url)


# ---------------------------------------------------------------- uploads


def add_voice(http, name: str, data: bytes, filename: str = "clip.wav"):
    return http.post("/v1/audio/voices", data={"name": name},
                     files={"file": (filename, data, "audio/wav")})  # fmt: skip


def test_the_clients_file_name_is_never_a_path(http):
    """Finding 4: `..` was a 500 IsADirectoryError, 300 characters one ENAMETOOLONG."""
    clip = wav_bytes(1.0)
    for i, filename in enumerate(("..", "a" * 300, "../../etc/passwd", "x\0y.wav", "ü.WAV")):
        reply = add_voice(http, f"named{i}", clip, filename)
        assert reply.status_code == 200, (filename, reply.text)
        assert reply.json()["frames"] > 0
    # no file name at all: multipart says the part is a field, and one that large is refused
    assert api_error(add_voice(http, "unnamed", clip, ""), 400, None)["code"] == "invalid_form"


def test_a_clips_header_is_checked_before_decoding(server, http):
    """Finding 3: 1,000,003 Hz took 2.6 GB for the resampler, 2**31-1 Hz was a 500, and a
    12 KB FLAC said 180 s."""
    before = rss(server)
    clip = bytearray(wav_bytes(1.0))
    for rate in (1_000_003, 2**31 - 1, 100):
        clip[24:28] = struct.pack("<I", rate)  # the WAV header's sample rate
        error = api_error(add_voice(http, "rated", bytes(clip)), 400, "file")
        assert str(rate) in error["message"] and "clip.wav" in error["message"]
    long = wav_bytes(180.0, rate=8000, fmt="FLAC")
    assert len(long) < 200_000  # a small file saying minutes
    assert api_error(add_voice(http, "long", long, "long.flac"), 413, "file")["code"] == \
        "clip_too_long"  # fmt: skip
    api_error(add_voice(http, "noise", b"\x00" * 1000), 400, "file")
    assert rss(server) - before < RSS_GROWTH_MAX


def test_an_upload_over_the_bound_is_refused_before_it_is_spooled(server):
    head = raw_answer(server, f"POST /v1/audio/voices HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {KEY}\r\n"
                      f"Content-Type: multipart/form-data; boundary=b\r\n"
                      f"Content-Length: {MAX_UPLOAD_BYTES * 4}\r\n\r\n")  # fmt: skip
    assert head.startswith("HTTP/1.1 413"), head
    assert '"param":"file"' in head


def test_missing_form_fields_are_named(http):
    api_error(http.post("/v1/audio/voices", data={"name": "x"}), 400, "file")
    api_error(http.post("/v1/audio/voices", files={"file": ("a.wav", wav_bytes(1.0))}), 400,
              "name")  # fmt: skip
    reply = http.post("/v1/audio/voices", content=b"--b\r\nnonsense",
                      headers={"Content-Type": "multipart/form-data; boundary=b"})  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["param"] in (None, "name")


# ---------------------------------------------------------------- auth


def test_health_and_metrics_are_open_the_api_is_not(server):
    """Orchestrators' probes and scrapers send no key (vLLM and TGI leave these open)."""
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200
    assert api_error(httpx.get(f"{server.url}/v1/models"), 401, None)["code"] == \
        "invalid_api_key"  # fmt: skip


def test_a_key_with_outer_whitespace_is_refused_at_start(tiny_weights):
    for key in ("K ", " K", "K\t"):
        done = subprocess.run([sys.executable, "-m", "moss_gguf_cli", "serve", "--config",
                               str(tiny_weights / "moss-tts.yaml"), "--port", "0",
                               "--api-key", key], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "--api-key" in lines[0] and "Traceback" not in done.stderr


# ---------------------------------------------------------------- failures and the watchdog


def injected(tiny_weights: Path, tmp_path: Path, point: str, *args: str):
    marker = tmp_path / "marker"
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path / "s.log", "--api-key", KEY,
                      "--voices", str(tmp_path / "voices"), *args,
                      env={HOLD_ENV: f"{point}={marker}"})  # fmt: skip
    return srv, marker


def test_a_failing_row_ends_alone(tiny_weights, tmp_path):
    """One utterance's failure (injected where it takes its row) ends that utterance with a
    500; the one beside it in the batch finishes, and the server goes on."""
    srv, marker = injected(tiny_weights, tmp_path, "row", "--max-batch", "2")
    try:
        replies: list[httpx.Response] = []

        def speak() -> None:
            replies.append(httpx.post(f"{srv.url}/v1/audio/speech", json=OK, headers=AUTH,
                                      timeout=TIMEOUT))  # fmt: skip

        threads = [threading.Thread(target=speak) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert marker.exists()
        assert sorted(r.status_code for r in replies) == [200, 500]
        failed = next(r for r in replies if r.status_code == 500)
        assert api_error(failed, 500, None)["code"] == "internal_error"
        serves_normally(srv.url)
    finally:
        stop(srv)


def test_a_failing_decode_ends_its_batch_and_the_engine_goes_on(tiny_weights, tmp_path):
    srv, marker = injected(tiny_weights, tmp_path, "decode")
    try:
        reply = httpx.post(f"{srv.url}/v1/audio/speech", json=OK, headers=AUTH, timeout=TIMEOUT)
        assert marker.exists()
        api_error(reply, 500, None)
        serves_normally(srv.url)
        assert "Traceback" not in srv.text()
    finally:
        stop(srv)


def test_a_stalled_engine_is_unhealthy_and_its_requests_are_answered(tiny_weights, tmp_path):
    """The worker held inside a step (the `serve` hold point) never steps again: after
    --stall-timeout the running request gets an error and /health a 503."""
    srv, marker = injected(tiny_weights, tmp_path, "serve", "--stall-timeout", "2")
    try:
        assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
        t0 = time.monotonic()
        reply = httpx.post(f"{srv.url}/v1/audio/speech", json=OK, headers=AUTH, timeout=TIMEOUT)
        assert marker.exists()
        assert api_error(reply, 500, None)["code"] == "engine_stalled"
        assert time.monotonic() - t0 < 30
        health = httpx.get(f"{srv.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "stalled"
        assert health.json()["seconds_without_progress"] > 2
    finally:
        stop(srv)


# ---------------------------------------------------------------- streams cut short


def test_a_stream_cut_by_shutdown_does_not_look_complete(tiny_weights, tmp_path):
    """Finding 6: SSE ends with an `error` event (no speech.audio.done); raw pcm loses its
    connection without the chunked terminator, so the client sees it incomplete."""
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path / "s.log", "--api-key", KEY,
                      "--voices", str(tmp_path / "voices"), "--max-batch", "2")  # fmt: skip
    long = {**OK, "max_new_tokens": 4000, "response_format": "pcm"}
    try:
        with httpx.Client(base_url=srv.url, headers=AUTH, timeout=TIMEOUT) as c, \
                c.stream("POST", "/v1/audio/speech", json={**long, "stream_format": "sse"}) as sse, \
                c.stream("POST", "/v1/audio/speech", json={**long, "stream_format": "audio"}) as pcm:  # noqa: E501  # fmt: skip
            events = sse.iter_lines()
            first = next(line for line in events if line.startswith("data: "))
            assert json.loads(first[6:])["type"] == "speech.audio.delta"
            pieces = pcm.iter_raw()
            assert next(pieces)
            srv.proc.send_signal(signal.SIGTERM)
            rest = [json.loads(line[6:]) for line in events if line.startswith("data: ")]
            assert rest and rest[-1]["type"] == "error", rest[-1:]
            error = rest[-1]["error"]
            assert error["code"] == "shutting_down" and error["param"] is None
            assert all(e["type"] != "speech.audio.done" for e in rest)
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in pieces:
                    pass
        assert srv.proc.wait(timeout=30) == 0
    finally:
        stop(srv)


def test_an_sse_delta_decodes(server, http):
    """The SSE path still carries audio (the error path above does not break it)."""
    with http.stream("POST", "/v1/audio/speech",
                     json={**OK, "response_format": "pcm", "stream_format": "sse"}) as reply:
        events = [json.loads(x[6:]) for x in reply.iter_lines() if x.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    assert base64.b64decode(events[0]["audio"])


# ---------------------------------------------------------------- the fuzz test

FUZZ_EXAMPLES = 60
FUZZ_SECONDS = 45  # the examples past this are skipped: the test stays within about a minute
ANY_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([1e-320, 5e-324, 1e-39, -0.0, 1e308, 0.5, 1.0]))  # fmt: skip
ANY_INT = st.one_of(st.integers(), st.sampled_from([0, -1, 2**31, 2**63, 10**50]))
ANY_SCALAR = st.one_of(st.none(), st.booleans(), ANY_INT, ANY_FLOAT, st.text(max_size=20))
OPTIONAL = {
    "voice": st.one_of(st.sampled_from(["alloy", "default", "nobody", "../x", ""]),
                       st.text(max_size=300), st.fixed_dictionaries({"id": st.text(max_size=8)}),
                       ANY_SCALAR),  # fmt: skip
    "instructions": st.one_of(st.text(max_size=60), st.just("x" * 5000), ANY_SCALAR),
    "response_format": st.one_of(st.sampled_from(["mp3", "opus", "aac", "flac", "wav", "pcm"]),
                                 ANY_SCALAR),  # fmt: skip
    "speed": st.one_of(st.floats(0.25, 4.0), ANY_FLOAT),
    "stream_format": st.sampled_from(["audio", "sse", "chunks", None]),
    "seed": ANY_INT,
    **{key: ANY_FLOAT for key in ("text_temperature", "audio_temperature", "text_top_p",
                                  "audio_top_p", "audio_repetition_penalty")},  # fmt: skip
    "text_top_k": ANY_INT,
    "audio_top_k": ANY_INT,
    "unknown_field": ANY_SCALAR,
}
BODIES = st.fixed_dictionaries(
    {"model": st.one_of(st.just("moss-tts"), st.text(max_size=300), ANY_SCALAR),
     "input": st.one_of(st.text(max_size=40), st.just("中" * 4096), st.just(" "), ANY_SCALAR),
     # bounded, so that the bodies that are valid speak a few steps, not a whole utterance
     "max_new_tokens": st.one_of(st.integers(-2, 12), ANY_INT)},
    optional=OPTIONAL,
)  # fmt: skip
# well-formed bodies, so that the engine itself is fuzzed too (a few steps each: fewer than
# a frame needs, so most end with a 400 naming max_new_tokens, after their steps ran)
VALID = st.fixed_dictionaries(
    {"model": st.just("moss-tts"), "input": st.text(min_size=1, max_size=30),
     "max_new_tokens": st.integers(1, 8)},
    optional={"voice": st.sampled_from(["alloy", "default"]),
              "instructions": st.text(max_size=30),
              "response_format": st.sampled_from(["mp3", "opus", "aac", "flac", "wav", "pcm"]),
              "speed": st.floats(0.25, 4.0), "seed": st.integers(0, 2**63 - 1),
              **{key: st.floats(0, 10) for key in ("text_temperature", "audio_temperature")},
              **{key: st.floats(1e-300, 1.0) for key in ("text_top_p", "audio_top_p")},
              **{key: st.integers(0, 2**20) for key in ("text_top_k", "audio_top_k")},
              "audio_repetition_penalty": st.floats(0.01, 10)},
)  # fmt: skip
RAW = st.one_of(
    VALID.map(lambda body: json.dumps(body).encode()),
    BODIES.map(lambda body: json.dumps(body).encode()),
    st.binary(max_size=300),
    st.recursive(ANY_SCALAR, lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                 max_leaves=20).map(lambda v: json.dumps(v).encode()),
)  # fmt: skip


def test_fuzzed_requests_never_get_a_5xx_nor_wedge_the_server(server):
    before = rss(server)
    deadline = time.monotonic() + FUZZ_SECONDS
    seen: list[int] = []
    params: set[str | None] = set()

    with httpx.Client(base_url=server.url, headers=AUTH, timeout=TIMEOUT) as c:

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(raw=RAW)
        def one(raw: bytes) -> None:
            if time.monotonic() > deadline:
                return
            reply = c.post("/v1/audio/speech", content=raw,
                           headers={"Content-Type": "application/json"})  # fmt: skip
            seen.append(reply.status_code)
            assert reply.status_code < 500, (raw[:200], reply.text)
            if reply.status_code >= 400:
                error = reply.json()["error"]
                assert not NOT_API_WORDS.search(error["message"]), error["message"]
                assert error["param"] is not None or error["code"] in WHOLE_BODY, error
                params.add(error["param"])

        one()
    assert len(seen) >= 20  # the bound left room for a real sample of bodies
    # and some reached the engine: too few steps for a frame (n_vq of them) is known there only
    assert "max_new_tokens" in params
    assert rss(server) - before < RSS_GROWTH_MAX
    serves_normally(server.url)
    assert "Traceback" not in server.text()
