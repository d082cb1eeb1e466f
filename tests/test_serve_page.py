"""The page `serve` answers at /, driven in headless Chromium (Debian's chromium and
chromium-driver, installed by scripts/install.sh --test) through Selenium, against a real
`moss-gguf serve` process on 127.0.0.1 with the tiny model and an API key.

The page plays streamed speech through Web Audio as the SSE deltas arrive and then gives the
<audio> player a WAV of what arrived; each Speak leaves its timings in `window.mossPage.runs`
(performance.now() milliseconds, and the seconds of audio the audio clock had played when the
response ended), which is what "it started playing before the server finished" is read from.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from conftest import TINY_SYNTH_YAML, nano_yaml, write_yaml
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait
from test_serve import KEY, TIMEOUT, start_serve
from test_serve_stream import metric

from moss_gguf_cli.serve.settings import MAX_INPUT_CHARS

TEXT = "The page speaks while the server is still making the rest of the sound."
# The random tiny model never ends by itself: each request runs to max_new_tokens. The server's
# default here is long enough that the stream lasts well past its first delta on any machine,
# so "it played before the response ended" is a margin of seconds, not a race.
MAX_NEW_TOKENS = 120
EVIL = "evil.example"
# the browser's own pages (its first blank tab), which never reach a network
BROWSER_OWN = ("chrome://", "chrome-untrusted://", "about:")
DATA_TESTIDS = ("text", "voice", "language", "speak", "audio", "status", "voice-file",
                "voice-name", "voice-text", "voice-add")  # fmt: skip


def browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert chromium and driver, (
        "the page's tests need Debian's chromium and chromium-driver: "
        "run `bash scripts/install.sh --test` as root (or apt-get install chromium chromium-driver)"
    )
    return chromium, driver


@pytest.fixture(scope="module")
def server(tiny_weights: Path, tmp_path_factory):
    log, voices = tmp_path_factory.mktemp("log") / "s.log", tmp_path_factory.mktemp("voices")
    config = write_yaml(tiny_weights / "page-moss-tts.yaml",
                        **{**TINY_SYNTH_YAML, "max_new_tokens": MAX_NEW_TOKENS})  # fmt: skip
    srv = start_serve(config, log, "--api-key", KEY, "--voices", str(voices))
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {KEY}"}) as c:  # fmt: skip
        yield c


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver_path = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1000,1400", "--autoplay-policy=no-user-gesture-required",
                "--no-first-run", "--disable-background-networking", "--disable-sync",
                # a rebinding site's name, resolved to the server's address (issue #45)
                f"--host-resolver-rules=MAP {EVIL} 127.0.0.1",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(TIMEOUT)
    yield driver
    driver.quit()


def wait(driver, condition, timeout: float = TIMEOUT):
    # a list the page re-renders while the condition reads it: asked again at the next poll
    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(StaleElementReferenceException,)
                         ).until(lambda d: condition(d))  # fmt: skip


def by_id(driver, testid: str):
    return driver.find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def status(driver) -> str:
    return by_id(driver, "status").text


@pytest.fixture(scope="module")
def page(browser, server):
    """The page loaded and connected: the key typed into the field the page showed."""
    # a key an earlier test stored (a wrong one) would be filled in again by the page's own
    # 401 answer after this types the right one: start from an empty store, and type only
    # once the page has settled on asking for a key
    browser.get(server.url + "/ui/config")
    browser.execute_script("localStorage.clear()")
    browser.get(server.url + "/")
    key_field = by_id(browser, "api-key")
    wait(browser, lambda d: key_field.is_displayed() and "needs an API key" in status(d))
    key_field.clear()
    key_field.send_keys(KEY)
    by_id(browser, "key-save").click()
    wait(browser, lambda d: status(d).startswith("Ready"))
    return browser


def last_run(driver) -> dict:
    wait(driver, lambda d: d.execute_script(
        "const r = window.mossPage.runs; return r.length && r[r.length - 1].done"))  # fmt: skip
    return driver.execute_script(
        "const r = window.mossPage.runs[window.mossPage.runs.length - 1];"
        "const {abort, stopAudio, ...rest} = r; return rest;"
    )


def audio_duration(driver) -> float:
    audio = by_id(driver, "audio")
    wait(driver, lambda d: d.execute_script("return arguments[0].readyState >= 1", audio))
    return driver.execute_script("return arguments[0].duration", audio)


def requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def speak_button_click(driver) -> None:
    button = by_id(driver, "speak")
    wait(driver, lambda d: button.is_enabled())
    button.click()


# ---------------------------------------------------------------- the page itself


def test_page_is_open_without_the_key_and_the_api_is_not(server):
    for path in ("/", "/ui", "/ui/page.js", "/ui/page.css", "/ui/config"):
        reply = httpx.get(server.url + path, timeout=TIMEOUT)
        assert reply.status_code == 200, path
        assert "default-src 'self'" in reply.headers["content-security-policy"]
    assert httpx.get(server.url + "/ui/config").json() == {"api_key_required": True}
    page = httpx.get(server.url + "/").text
    for testid in DATA_TESTIDS:
        assert f'data-testid="{testid}"' in page
    assert "http://" not in page and "https://" not in page  # nothing from elsewhere
    assert httpx.get(server.url + "/v1/audio/voices").status_code == 401
    assert httpx.post(server.url + "/", json={}).status_code == 401  # only GET is open


def test_a_wrong_key_shows_the_servers_401(browser, server):
    browser.get(server.url + "/")
    wait(browser, lambda d: status(d) == "This server needs an API key: enter it above.")
    by_id(browser, "api-key").send_keys("sk-wrong")
    by_id(browser, "key-save").click()
    wait(browser, lambda d: status(d).startswith("Error"))
    error = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer sk-wrong"})
    assert error.status_code == 401
    assert status(browser) == f"Error 401: {error.json()['error']['message']}"


def test_speak_plays_while_the_server_streams(page, server):
    text = by_id(page, "text")
    text.clear()
    text.send_keys(TEXT)
    assert Select(by_id(page, "format")).first_selected_option.get_attribute("value") == "wav"
    speak_button_click(page)
    run = last_run(page)
    assert run["error"] is None, run["error"]
    assert run["streamed"] and run["deltas"] > 1
    # the audio clock had passed the first buffer's start before the last byte arrived
    assert run["playedBeforeEnd"] > 0, run
    assert run["firstSoundAt"] < run["responseEndAt"], run
    duration = audio_duration(page)
    assert duration > 0 and abs(duration - run["seconds"]) < 0.01
    assert status(page).startswith("Done: first sound after")
    # every request since the browser started (the page, its files, the API calls, the
    # speech) went to the server; the audio went to blob: URLs the page made itself
    urls = [u for u in requested_urls(page) if not u.startswith(BROWSER_OWN)]
    assert any(u.startswith(server.url + "/ui/page.js") for u in urls)
    assert any(u.startswith(server.url + "/v1/audio/speech") for u in urls)
    assert [u for u in urls if not u.startswith((server.url + "/", "blob:", "data:"))] == []


def test_stop_ends_the_request_on_the_server(page, server):
    text = by_id(page, "text")
    text.clear()
    text.send_keys("Stopped before it is done.")
    speak_button_click(page)
    by_id(page, "stop").click()  # the first chunk takes several generation steps
    run = last_run(page)
    assert run["stopped"] and status(page) == "Stopped."
    deadline = time.monotonic() + TIMEOUT
    # waiting for its first chunk ("cancelled") or streaming ("stopped"), the job ended
    while "client went away" not in server.text():
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.05)
    while metric(server, "moss_gguf_busy"):
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.05)
    assert by_id(page, "speak").is_enabled() and not by_id(page, "stop").is_enabled()


def test_whole_file_formats_play_in_the_player_by_keyboard(page):
    Select(by_id(page, "format")).select_by_value("mp3")
    text = by_id(page, "text")
    text.clear()
    text.send_keys("Hello in mp3.")
    text.send_keys(Keys.CONTROL, Keys.ENTER)  # speaks from the text area
    run = last_run(page)
    Select(by_id(page, "format")).select_by_value("wav")
    assert run["error"] is None, run["error"]
    assert not run["streamed"]
    assert audio_duration(page) > 0
    assert page.execute_script("return !arguments[0].paused || arguments[0].ended",
                               by_id(page, "audio"))  # fmt: skip


def test_voice_registered_listed_then_deleted(page, reference_wav, http):
    by_id(page, "voice-file").send_keys(str(reference_wav))
    by_id(page, "voice-name").send_keys("page-voice")
    by_id(page, "voice-text").send_keys("a tone to clone")
    by_id(page, "voice-add").click()
    wait(page, lambda d: "page-voice" in [o.get_attribute("value") for o in
                                          Select(by_id(d, "voice")).options])  # fmt: skip
    assert status(page) == "Voice page-voice registered and selected."
    assert Select(by_id(page, "voice")).first_selected_option.get_attribute("value") == "page-voice"
    assert "page-voice" in by_id(page, "voice-list").text
    assert [v["name"] for v in http.get("/v1/audio/voices").json()["data"]] == ["page-voice"]

    page.find_element(By.CSS_SELECTOR, '[aria-label="Delete voice page-voice"]').click()
    wait(page, lambda d: d.switch_to.alert).accept()
    wait(page, lambda d: "page-voice" not in by_id(d, "voice-list").text)
    assert status(page) == "Voice page-voice deleted."
    assert http.get("/v1/audio/voices").json()["data"] == []


def test_an_existing_voice_is_replaced_only_after_asking(page, reference_wav, http):
    def register_from_page(text: str) -> None:
        by_id(page, "voice-file").send_keys(str(reference_wav))
        for testid, value in (("voice-name", "twice"), ("voice-text", text)):
            by_id(page, testid).clear()
            by_id(page, testid).send_keys(value)
        by_id(page, "voice-add").click()

    with open(reference_wav, "rb") as fh:
        assert http.post("/v1/audio/voices", data={"name": "twice", "text": "first"},
                         files={"file": ("v.wav", fh)}).status_code == 200  # fmt: skip
    register_from_page("second")
    alert = wait(page, expected_conditions.alert_is_present())  # after the server's 409
    assert "twice exists" in alert.text
    alert.dismiss()
    wait(page, lambda d: status(d) == "Voice twice kept as it was.")
    texts = lambda: {v["name"]: v["text"] for v in http.get("/v1/audio/voices").json()["data"]}  # noqa: E731
    assert texts()["twice"] == "first"
    register_from_page("second")
    wait(page, expected_conditions.alert_is_present()).accept()
    wait(page, lambda d: status(d) == "Voice twice registered and selected.")
    assert texts()["twice"] == "second"
    assert http.delete("/v1/audio/voices/twice").status_code == 200


def test_a_page_of_a_rebinding_site_is_refused(browser, server):
    """The page loaded as http://evil.example:PORT/ (a name resolved to 127.0.0.1): the
    server answers only its own names, so the page and its API calls get 403."""
    own = browser.current_window_handle
    browser.switch_to.new_window("tab")  # the module's page stays loaded in its own tab
    try:
        browser.get(f"http://{EVIL}:{server.port}/")
        text = browser.find_element(By.TAG_NAME, "body").text
        assert "host_not_allowed" in text and EVIL in text, text[:300]
        assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="speak"]')
        browser.get(f"http://{EVIL}:{server.port}/v1/audio/voices")
        assert "host_not_allowed" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(f"http://localhost:{server.port}/")  # the loopback name is answered
        assert browser.find_elements(By.CSS_SELECTOR, '[data-testid="speak"]')
    finally:
        browser.close()
        browser.switch_to.window(own)


def test_a_refused_voice_shows_the_servers_error(page, http):
    reply = http.post("/v1/audio/voices", data={"name": "../escape"})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"]
    by_id(page, "voice-name").clear()
    by_id(page, "voice-name").send_keys("../escape")
    by_id(page, "voice-add").click()
    wait(page, lambda d: status(d).startswith("Error"))
    assert status(page) == f"Error 400: {error['message']} (param: {error['param']})"


def test_over_long_input_shows_the_servers_error(page, http):
    too_long = "a" * (MAX_INPUT_CHARS + 1)
    reply = http.post("/v1/audio/speech", json={"model": "moss-tts", "input": too_long,
                                                "response_format": "wav",
                                                "stream_format": "sse"})  # fmt: skip
    error = reply.json()["error"]
    assert reply.status_code >= 400 and error["param"] == "input"
    page.execute_script("arguments[0].value = arguments[1];"
                        "arguments[0].dispatchEvent(new Event('input'));",
                        by_id(page, "text"), too_long)  # fmt: skip
    speak_button_click(page)
    run = last_run(page)
    expected = f"Error {reply.status_code}: {error['message']} (param: input)"
    assert run["error"] == expected
    assert status(page) == expected
    assert "error" in by_id(page, "status").get_attribute("class")


def test_language_selector_follows_the_server(page, http):
    reply = http.get("/v1/audio/languages")
    language = by_id(page, "language")
    if reply.status_code == 404:  # this server takes no language: the selector is not offered
        assert not language.is_displayed() and not language.is_enabled()
    else:
        body = reply.json()
        listed = body["languages"] if "languages" in body else body["data"]
        names = [x if isinstance(x, str) else x["name"] for x in listed]
        offered = [o.get_attribute("value") for o in Select(language).options]
        assert offered == ["auto"] + [n for n in names if n != "auto"]


def test_every_control_is_labelled_and_the_page_fits_a_phone(page):
    unlabelled = page.execute_script(
        "return [...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => !e.labels.length).map(e => e.id)"
    )
    assert unlabelled == []
    page.set_window_size(390, 844)
    try:
        wide = page.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert wide <= 0
    finally:
        page.set_window_size(1000, 1400)


def test_no_adapter_picker_on_a_server_without_adapters(page, http):
    assert http.get("/v1/models").json()["data"][0]["lora"] == []
    for testid in ("lora", "lora-scale"):
        assert not by_id(page, testid).is_displayed() and not by_id(page, testid).is_enabled()


def sent_speech_bodies(driver) -> list[dict]:
    """The JSON bodies of the speech requests the browser sent since the log was last read."""
    bodies = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        request = message.get("params", {}).get("request", {})
        if message["method"] == "Network.requestWillBeSent" and \
                request.get("url", "").endswith("/v1/audio/speech"):  # fmt: skip
            bodies.append(json.loads(request["postData"]))
    return bodies


def player_sha256(driver) -> str:
    # the player's blob read in the page (a fetch of its blob: URL is outside connect-src)
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.mossPage.state.audioBlob.arrayBuffer()"
        ".then((b) => crypto.subtle.digest('SHA-256', b))"
        ".then((d) => done([...new Uint8Array(d)]"
        ".map((x) => x.toString(16).padStart(2, '0')).join('')));"
    )


def test_the_adapter_picker_sends_the_servers_adapters(browser, tiny_weights, tiny_extracted,
                                                       tmp_path):  # fmt: skip
    """A server started with `--lora a=FILE`: the page offers `a` (and none), sends
    `"lora": {"a": scale}` with the speech request, and under greedy sampling the adapter's
    audio differs from none's, while none again repeats none's bytes."""
    from test_lora import as_moss
    from test_lora_runtime import convert_lora, peft_adapter

    adapter = as_moss(peft_adapter(tiny_extracted, tmp_path / "peft", 11), tmp_path / "moss")
    lora = tmp_path / "a.gguf"
    done = convert_lora(adapter, lora)
    assert done.returncode == 0, done.stderr[-2000:]
    # greedy: the audio is a function of the adapter set alone
    config = write_yaml(tiny_weights / "page-lora-moss-tts.yaml",
                        **{**TINY_SYNTH_YAML, "text_temperature": 0, "audio_temperature": 0})
    srv = start_serve(config, tmp_path / "s.log", "--voices", str(tmp_path / "voices"),
                      "--lora", f"a={lora}")  # fmt: skip
    try:
        browser.get(srv.url + "/")
        wait(browser, lambda d: status(d).startswith("Ready"))
        picker, scale = Select(by_id(browser, "lora")), by_id(browser, "lora-scale")
        assert by_id(browser, "lora").is_displayed() and scale.is_displayed()
        assert [o.get_attribute("value") for o in picker.options] == ["", "a"]
        assert picker.first_selected_option.text == "none" and not scale.is_enabled()
        text = by_id(browser, "text")
        text.clear()
        text.send_keys("Hei")
        browser.get_log("performance")  # what the page load sent is not read below

        def speak(name: str, value: str = "1") -> str:
            picker.select_by_value(name)
            if name:
                scale.clear()
                scale.send_keys(value)
            before = browser.execute_script("return window.mossPage.runs.length")
            speak_button_click(browser)
            # a new run, not the last one again (a value the form refuses sends nothing)
            wait(browser, lambda d: d.execute_script("return window.mossPage.runs.length")
                 > before)  # fmt: skip
            run = last_run(browser)
            assert run["error"] is None, run["error"]
            return player_sha256(browser)

        none = speak("")
        with_a = speak("a", "0.5")
        again = speak("")
        bodies = sent_speech_bodies(browser)
        assert [b.get("lora") for b in bodies] == [None, {"a": 0.5}, None]
        assert with_a != none and again == none
        assert last_run(browser)["lora"] is None
    finally:
        assert srv.stop() == 0


def test_the_key_is_remembered_by_the_browser(page, server):
    page.get(server.url + "/ui")
    wait(page, lambda d: status(d).startswith("Ready"))
    assert by_id(page, "api-key").get_attribute("value") == KEY


def test_without_a_key_the_page_asks_for_none(browser, tiny_weights, tmp_path):
    srv = start_serve(tiny_weights / "moss-tts.yaml", tmp_path / "s.log",
                      "--voices", str(tmp_path / "voices"))  # fmt: skip
    try:
        assert httpx.get(srv.url + "/ui/config").json() == {"api_key_required": False}
        browser.get(srv.url + "/")  # another port: another origin, no key stored for it
        wait(browser, lambda d: status(d).startswith("Ready"))
        assert not by_id(browser, "api-key").is_displayed()
        assert [o.get_attribute("value") for o in Select(by_id(browser, "voice")).options] == [
            "default"
        ]
    finally:
        srv.stop()


def test_the_page_speaks_nano_in_stereo(browser, tiny_nano_folder, tmp_path):
    """A Nano server: the page takes its model from /v1/models, hides the language (the
    server has none), and plays the 48 kHz stereo stream; the player's WAV is its 2.0 s."""
    config = nano_yaml(tiny_nano_folder, "page-nano.yaml", tmp_path, min_new_tokens=25,
                       max_new_tokens=25)  # fmt: skip
    srv = start_serve(config, tmp_path / "s.log", "--voices", str(tmp_path / "voices"))
    try:
        browser.get(srv.url + "/")
        wait(browser, lambda d: status(d).startswith("Ready"))
        assert browser.execute_script("return window.mossPage.state.model") == "moss-tts-nano"
        assert not by_id(browser, "language").is_displayed()
        text = by_id(browser, "text")
        text.clear()
        text.send_keys("Nano speaks on the page.")
        Select(by_id(browser, "format")).select_by_value("wav")
        speak_button_click(browser)
        run = last_run(browser)
        assert run["error"] is None, run["error"]
        assert run["streamed"] and run["deltas"] > 1
        assert abs(run["seconds"] - 2.0) < 1e-6, run  # stereo read as stereo, not 4 s of mono
        assert abs(audio_duration(browser) - 2.0) < 0.01
        assert "moss-tts-nano" in srv.text() or srv.proc.poll() is None
    finally:
        srv.stop()
