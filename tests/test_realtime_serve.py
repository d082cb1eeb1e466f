"""`serve` on a MOSS-TTS-Realtime folder: 24 kHz mono WAV to the official openai client, a
registered voice cloned, the fields it does not take refused with a 400 naming them, a greedy
answer equal to `synth`'s; and the stream-input WebSocket (#64) with the `websockets` client:
text sent in pieces speaks as the same text sent whole, a silent client is timed out and its
slot freed, what it does not take is a close with a reason, the key is asked and other sites'
pages are refused."""

from __future__ import annotations

import io
import time

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
    # random weights: the speech ends at 12 frames or at a frame holding a special code
    assert rate == 24_000 and served.ndim == 1 and 0 < len(served) <= 12 * 1920
    assert len(served) % 1920 == 0
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
    assert 0 < sf.info(io.BytesIO(cloned)).frames <= 12 * 1920
    assert cloned != speak(client)


@pytest.mark.parametrize("field, value", [("language", "en"), ("instructions", "calm"),
                                          ("voices", ["a"]), ("lora", {"a": 1.0}),
                                          ("min_new_tokens", 99999)])  # above the default max
def test_what_realtime_does_not_take_is_a_400_naming_it(http, field, value):
    reply = http.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, field: value})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field, reply.text


# --------------------------------------------------------------------------- stream-input (#64)

GREEDY = {"audio_temperature": 0, "audio_repetition_penalty": 1.0, **FRAMES}


def socket_url(server, voice: str = "alloy", **query: str) -> str:
    tail = "&".join(f"{k}={v}" for k, v in query.items())
    return f"ws://{server.url.split('://', 1)[1]}/v1/text-to-speech/{voice}/stream-input" + (
        f"?{tail}" if tail else "")  # fmt: skip


def converse(url: str, opening: dict, pieces: list, *, end: bool = True,
             headers: dict | None = None) -> tuple[bytes, list[dict], object]:  # fmt: skip
    """(the audio, every message, the close frame) of one conversation; a piece is a text or
    a whole message (a dict) or raw bytes (a binary message)."""
    import base64
    import json

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    audio, messages = b"", []
    with connect(url, additional_headers=headers or {"xi-api-key": KEY},
                 open_timeout=TIMEOUT) as ws:  # fmt: skip
        ws.send(json.dumps(opening))
        for piece in pieces:
            ws.send(piece if isinstance(piece, bytes) else
                    json.dumps(piece if isinstance(piece, dict) else {"text": piece}))
        if end:
            ws.send(json.dumps({"text": ""}))
        try:
            while True:
                message = json.loads(ws.recv(timeout=TIMEOUT))
                messages.append(message)
                if message.get("audio"):
                    audio += base64.b64decode(message["audio"])
        except ConnectionClosed as closed:
            return audio, messages, closed.rcvd


def test_pieces_over_the_websocket_speak_as_the_whole_text(server, http):
    whole = http.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT, "voice": "alloy",
                                                "response_format": "pcm", **GREEDY})  # fmt: skip
    assert whole.status_code == 200, whole.text
    pieces = ["Hello ", "from the ", "Realtime", " server."]
    audio, messages, closed = converse(socket_url(server), {"text": " ", **GREEDY}, pieces)
    assert closed.code == 1000 and messages[-1] == {"isFinal": True}, (closed, messages[-1:])
    assert all(m["isFinal"] is None for m in messages[:-1]) and len(messages) > 2
    assert audio == whole.content and len(audio) % (1920 * 2) == 0 and audio


def test_a_client_that_never_ends_its_input_is_timed_out_and_its_slot_freed(server, http):
    audio, _, closed = converse(socket_url(server, inactivity_timeout="1"),
                                {"text": " ", **FRAMES}, ["Hello there, "], end=False)  # fmt: skip
    assert closed.code == 1008 and "no message for 1 s" in closed.reason, closed
    deadline = time.monotonic() + 10
    while http.get("/health").json()["busy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not http.get("/health").json()["busy"]


@pytest.mark.parametrize("opening, pieces, code, said", [
    ({"text": " "}, ["x" * 3000, "y" * 3000], 1009, "would pass 4096 characters"),
    ({"text": "Hello"}, [], 1008, 'the opening message is {"text": " "}'),
    ({"text": " ", "language": "en"}, [], 1008, "language"),
    ({"text": " ", "audio_top_k": -3}, [], 1008, "audio_top_k"),
    ({"text": " ", "input": "Hi"}, [], 1008, "input is not taken in the opening message"),
    ({"text": " "}, [b"\x00\x01"], 1003, "not binary"),
])  # fmt: skip
def test_what_the_socket_does_not_take_is_closed_with_a_reason(server, opening, pieces, code,
                                                                said):  # fmt: skip
    _, _, closed = converse(socket_url(server), opening, pieces, end=False)
    assert closed.code == code and said in closed.reason, closed


def test_an_input_ended_before_any_word_says_it_is_final(server, http):
    audio, messages, closed = converse(socket_url(server), {"text": " "}, ["   "])
    assert closed.code == 1000 and messages == [{"isFinal": True}] and not audio, closed
    assert http.get("/health").json()["status"] == "ok"


def test_a_flush_ends_an_utterance_and_the_next_one_follows(server, http):
    """Each utterance is a request of its own: the audio is the two texts' answers in order
    (greedy: each as the speech endpoint says it)."""
    first, second = "Hello from the first one.", "And here is the second."
    whole = [http.post("/v1/audio/speech", json={"model": MODEL, "input": text, "voice": "alloy",
                                                 "response_format": "pcm", **GREEDY}).content
             for text in (first, second)]  # fmt: skip
    audio, messages, closed = converse(socket_url(server), {"text": " ", **GREEDY},
                                       ["Hello from ", {"text": "the first one.", "flush": True},
                                        "And here is the second."])  # fmt: skip
    assert closed.code == 1000 and messages[-1] == {"isFinal": True}, closed
    assert audio == whole[0] + whole[1] and all(whole)


def test_the_key_is_asked_of_a_socket_and_other_sites_pages_are_refused(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    _, _, closed = converse(socket_url(server), {"text": " "}, [], headers={"xi-api-key": "no"})
    assert closed.code == 1008 and "API key" in closed.reason, closed
    audio, _, closed = converse(socket_url(server), {"text": " ", "xi_api_key": KEY, **FRAMES},
                                ["Hi."], headers={})  # fmt: skip
    assert closed.code == 1000 and audio
    with pytest.raises(InvalidStatus) as refused:
        connect(socket_url(server), origin="http://evil.example", open_timeout=TIMEOUT)
    assert refused.value.response.status_code == 403


def test_synth_speaks_stdin_as_it_arrives(folder):
    """`synth --stream --text -`: audio comes out while standard input is still open (the
    first piece holds the 12-token lead and a few more), and the rest once it is closed."""
    import select
    import subprocess
    import sys

    first = "Hello there, this is the first part of a text that an agent is still writing, "
    proc = subprocess.Popen([sys.executable, "-m", "moss_gguf_cli", "synth", "--config",
                             str(folder / "moss-tts-realtime.yaml"), "--text", "-", "--stream",
                             "-o", "-", "--min-new-tokens", "30", "--max-new-tokens", "30",
                             "--seed", "2", "-q"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        proc.stdin.write(first.encode())
        proc.stdin.flush()
        # audio before stdin is closed (a synth that waited for the end would sit here)
        assert select.select([proc.stdout], [], [], TIMEOUT)[0], "no audio while stdin is open"
        early = proc.stdout.read(1920 * 2)  # a frame of 16-bit PCM
        assert len(early) == 1920 * 2
        proc.stdin.write(b"and the end of it.")
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=TIMEOUT) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
    assert len(early + rest) % 2 == 0 and len(early + rest) >= 2 * 1920 * 2


def test_a_feed_gives_out_no_token_that_more_text_may_change(folder):
    """Fewer tokens than the hold-back: nothing given out ("He" may become "Hello"); the end
    gives out the whole text's tokens; a piece past the limit is refused, nothing taken."""
    from moss_gguf_cli.errors import InputError
    from moss_gguf_cli.realtime.feed import TextFeed
    from moss_gguf_cli.realtime.prompt import text_encoder

    encode = text_encoder(folder)
    feed = TextFeed(encode, 40)
    feed.push("He")
    assert feed.ids == []
    feed.push("llo there, how are you")
    assert feed.ids == encode("Hello there, how are you")[:-3]
    with pytest.raises(InputError, match="would pass 40 characters"):
        feed.push(" and a great deal more text")
    with pytest.raises(InputError, match="cannot be tokenized"):
        feed.push("\ud800")
    assert feed.text == "Hello there, how are you"
    feed.end()
    assert feed.ids == encode("Hello there, how are you") and feed.ended


def test_a_request_past_the_context_is_refused_before_any_audio(http, folder, tmp_path):
    reply = http.post("/v1/audio/speech", json={"model": MODEL, "input": TEXT,
                                                "max_new_tokens": 99_999})  # fmt: skip
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "max_new_tokens" and error["code"] == "context_length_exceeded"
    ran = moss_gguf("synth", "--config", str(folder / "moss-tts-realtime.yaml"), "--text", TEXT,
                    "-o", str(tmp_path / "a.wav"), "--max-new-tokens", "99999")  # fmt: skip
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode != 0 and len(lines) == 1 and "raise --n-ctx" in lines[0], ran.stderr
    assert not (tmp_path / "a.wav").exists()
