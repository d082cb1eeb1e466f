"""`serve` is no open door for web pages (issue #45): a real server on 127.0.0.1 with no API
key (the default a user runs), talked to as a DNS-rebinding page, a cross-site form and
plain clients would. Every route but the probes refuses a foreign Host; state-changing
requests from another site's page are refused and change nothing; curl, SDKs, the page's own
origin and the names the user allowed are served."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import GREEDY, TEXT, TIMEOUT, start_serve

from moss_gguf_cli.serve.origins import HostPolicy, cross_origin

ALLOWED = "tts.lan"
MAX_VOICES = 3
SPEECH = {"model": "moss-tts", "input": TEXT, "voice": "alloy", "response_format": "wav",
          **GREEDY}  # fmt: skip
# every route and the page's files, with the method each answers to
ROUTES = [("GET", "/"), ("GET", "/ui"), ("GET", "/ui/page.js"), ("GET", "/ui/config"),
          ("GET", "/v1/models"), ("GET", "/v1/models/"), ("GET", "/v1/audio/voices"),
          ("GET", "/v1/audio/languages"), ("POST", "/v1/audio/speech"),
          ("POST", "/v1/audio/voices"), ("DELETE", "/v1/audio/voices/kept"),
          ("GET", "/no/such/route")]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_weights: Path, tmp_path_factory):
    voices = tmp_path_factory.mktemp("voices")
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path_factory.mktemp("log") / "s.log",
                      "--voices", str(voices), "--allowed-hosts", f"{ALLOWED}, other.lan",
                      "--max-voices", str(MAX_VOICES))  # fmt: skip
    srv.voices = voices
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def clip(reference_wav: Path) -> bytes:
    return reference_wav.read_bytes()


def register(http, name: str, clip: bytes, headers=None, **fields):
    return http.post("/v1/audio/voices", data={"name": name, **fields},
                     files={"file": ("clip.wav", clip, "audio/wav")},
                     headers=headers or {})  # fmt: skip


@pytest.fixture(scope="module")
def kept(http, clip) -> str:
    """A voice the hostile requests try to overwrite and delete."""
    reply = register(http, "kept", clip, text="the first transcript")
    assert reply.status_code == 200, reply.text
    return "kept"


def error(reply: httpx.Response, status: int, code: str) -> str:
    assert reply.status_code == status, (reply.status_code, reply.text)
    body = reply.json()["error"]
    assert body["code"] == code, body
    return body["message"]


def voices(http) -> dict[str, str | None]:
    return {v["name"]: v["text"] for v in http.get("/v1/audio/voices").json()["data"]}


def spoken_chunks(http) -> float:
    families = text_string_to_metric_families(http.get("/metrics").text)
    return sum(s.value for f in families if f.name == "moss_gguf_text_chunks" for s in f.samples
               if s.name.endswith("_total"))  # fmt: skip


# ---------------------------------------------------------------- Host (DNS rebinding)


def test_every_route_but_the_probes_refuses_a_foreign_host(server, http, kept):
    for method, path in ROUTES:
        reply = http.request(method, path, headers={"Host": f"evil.example:{server.port}"})
        message = error(reply, 403, "host_not_allowed")
        assert "evil.example" in message and "--allowed-hosts" in message, message
        assert "location" not in reply.headers
    for path in ("/health", "/metrics"):  # probes send the pod's address
        assert http.get(path, headers={"Host": "10.0.0.7:8000"}).status_code == 200
    assert "kept" in voices(http)  # the DELETE never ran


def test_no_host_header_is_refused(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as raw:
        raw.sendall(b"GET /v1/audio/voices HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: raw.recv(65536), b"")).decode()
    assert answer.startswith("HTTP/1.1 403") and "host_not_allowed" in answer, answer[:300]


def test_loopback_names_and_allowed_names_are_served(server, http):
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "LOCALHOST",
                 f"[::1]:{server.port}", ALLOWED, f"{ALLOWED}:443", "other.lan"):  # fmt: skip
        reply = http.get("/v1/models", headers={"Host": host})
        assert reply.status_code == 200, (host, reply.text)
    assert http.get("/", headers={"Host": f"localhost:{server.port}"}).status_code == 200
    # a trailing slash is no redirect built from Host: the route list answers it
    assert error(http.get("/v1/models/"), 404, "not_found")


def test_the_startup_line_says_which_hosts_are_answered(server):
    line = next(x for x in server.text().splitlines() if "/v1" in x)
    assert f"; hosts answered: loopback, other.lan, {ALLOWED};" in line, line


# ---------------------------------------------------------------- cross-site requests


def test_a_cross_site_form_neither_registers_nor_overwrites_a_voice(server, http, clip, kept):
    foreign = [{"Origin": "http://evil.example"}, {"Origin": "null"},
               {"Origin": f"http://127.0.0.1:{server.port + 1}"},  # another port
               {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
               {"Origin": f"http://127.0.0.1:{server.port}", "Sec-Fetch-Site": "cross-site"}]
    for headers in foreign:
        for name in ("fresh", kept):
            reply = register(http, name, clip, headers, text="replaced!", replace="true")
            error(reply, 403, "cross_origin")
        error(http.delete(f"/v1/audio/voices/{kept}", headers=headers), 403, "cross_origin")
    assert voices(http) == {kept: "the first transcript"}
    assert not list(server.voices.glob(".*tmp*"))


def test_cross_site_speech_is_never_queued(server, http):
    before = spoken_chunks(http)
    body = json.dumps(SPEECH)
    for headers, status, code in (
        ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"),
        ({}, 415, "unsupported_media_type"),
        ({"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403, "cross_origin"),
        ({"Content-Type": "application/json", "Origin": "null"}, 403, "cross_origin"),
    ):
        error(http.post("/v1/audio/speech", content=body, headers=headers), status, code)
    # an oversized body is still refused for its size, whatever it says it is
    big = "x" * (300 * 1024)
    error(http.post("/v1/audio/speech", content=big, headers={"Content-Type": "text/plain"}),
          413, "body_too_large")  # fmt: skip
    assert spoken_chunks(http) == before
    assert http.get("/health").json()["queue"] == 0


def test_clients_and_the_own_origin_are_served(server, http):
    before = spoken_chunks(http)
    own = f"http://127.0.0.1:{server.port}"
    for headers in ({}, {"Origin": own, "Sec-Fetch-Site": "same-origin"},
                    {"Origin": own.replace("http:", "https:")},  # a TLS proxy in front
                    {"Content-Type": "application/json; charset=utf-8"},
                    {"Sec-Fetch-Site": "none"},  # typed into the address bar
                    {"Host": ALLOWED, "Origin": f"https://{ALLOWED}"}):  # fmt: skip
        reply = http.post("/v1/audio/speech", json=SPEECH, headers=headers)
        assert reply.status_code == 200, (headers, reply.text)
        assert reply.content[:4] == b"RIFF"
    assert spoken_chunks(http) > before


# ---------------------------------------------------------------- the voice store


def test_a_voice_is_replaced_only_when_asked(http, clip, kept):
    message = error(register(http, kept, clip, text="second"), 409, "voice_exists")
    assert "replace=true" in message
    assert voices(http)[kept] == "the first transcript"
    reply = register(http, kept, clip, text="second", replace="true")
    assert reply.status_code == 200, reply.text
    assert voices(http)[kept] == "second"
    error(register(http, kept, clip, replace="maybe"), 400, "invalid_value")


def test_the_store_is_bounded(server, http, clip, kept):
    for i in range(MAX_VOICES - len(voices(http))):
        assert register(http, f"v{i}", clip).status_code == 200
    assert len(voices(http)) == MAX_VOICES
    message = error(register(http, "one-more", clip), 409, "too_many_voices")
    assert str(MAX_VOICES) in message
    assert "one-more" not in voices(http) and len(voices(http)) == MAX_VOICES
    # replacing a stored voice adds none: still allowed at the bound
    assert register(http, kept, clip, text="third", replace="true").status_code == 200
    assert http.delete("/v1/audio/voices/v0").status_code == 200
    assert register(http, "one-more", clip).status_code == 200


# ---------------------------------------------------------------- the rules themselves


def test_the_host_policy_follows_the_bind_address():
    assert HostPolicy.make("127.0.0.1").allows("localhost:1")
    assert not HostPolicy.make("127.0.0.1").allows("127.0.0.1.evil.example")
    assert not HostPolicy.make("127.0.0.1").allows("localhost@evil.example")
    assert not HostPolicy.make("127.0.0.1").allows("192.168.1.20:8000")
    lan = HostPolicy.make("192.168.1.20")
    assert lan.allows("192.168.1.20:8000") and not lan.allows("192.168.1.21:8000")
    every = HostPolicy.make("0.0.0.0")
    assert every.allows("192.168.1.21:8000") and every.allows("[fe80::1]:8000")
    assert not every.allows("evil.example:8000")
    assert HostPolicy.make("::", ("*",)).allows("anything.example")
    assert HostPolicy.make("127.0.0.1", ("Tts.Lan.",)).allows("tts.lan")
    assert cross_origin("GET", "127.0.0.1:1", "http://evil.example", "cross-site") is None


def serve_cli(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moss_gguf_cli", "serve", "--config",
                           str(config), "--port", "0", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip


def test_allowed_hosts_and_max_voices_are_checked_at_start(tiny_weights):
    config = tiny_weights / "moss-tts.yaml"
    for done, what in ((serve_cli(config, "--allowed-hosts", "http://x.lan"), "--allowed-hosts"),
                       (serve_cli(config, "--max-voices", "-1"), "--max-voices")):  # fmt: skip
        assert done.returncode != 0 and what in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2
