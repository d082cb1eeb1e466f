"""A screenshot of the page `moss-gguf serve` answers at / (docs/web-page.md shows it).

Starts `moss-gguf serve --config CONFIG` on a free port of 127.0.0.1 (or uses a running server:
--url), opens the page in headless Chromium (Debian's chromium and chromium-driver, as the
tests use), speaks a short text with the streamed WAV path so the player and the status line
show a finished run, and writes the PNG.

    python scripts/screenshot_page.py --config weights-demo/moss-tts.yaml -o docs/web-page.png
    python scripts/screenshot_page.py --config weights-demo/moss-tts.yaml --api-key demo-key \
        --voice-clip clip.wav --voice-text "What the clip says." -o docs/web-page.png
    python scripts/screenshot_page.py --url http://127.0.0.1:8000 --api-key "$KEY" -o page.png
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

TEXT = (
    "MOSS-TTS reads long texts in one voice. Type here, pick a voice, and press Speak: "
    "the sound starts while the rest is still being made."
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", type=Path, help="a synth YAML to start `serve` with")
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--api-key", help="the server's key, if it has one")
    ap.add_argument("--voice-clip", type=Path, help="a clip to register as voice 'narrator' first")
    ap.add_argument("--voice-text", default="", help="what the clip says")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--width", type=int, default=760, help="window width in CSS pixels")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for speech")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moss-gguf-shot-") as tmp:
        with _server(args, Path(tmp)) as url, _browser(Path(tmp), args.width) as driver:
            _shoot(driver, url, args)
    print(f"wrote {args.output}")
    return 0


@contextmanager
def _server(args, tmp: Path):
    if args.url:
        yield args.url.rstrip("/")
        return
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "moss_gguf_cli", "serve", "--config", str(args.config),
           "--host", "127.0.0.1", "--port", "0", "--voices", str(tmp / "voices")]  # fmt: skip
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + args.timeout
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start:\n{log.read_text()}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def _browser(tmp: Path, width: int):
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        raise SystemExit("needs Debian's chromium and chromium-driver (scripts/install.sh --test)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={width},900",
                "--autoplay-policy=no-user-gesture-required",
                f"--user-data-dir={tmp / 'profile'}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _shoot(driver, url: str, args) -> None:
    def testid(name: str):
        return driver.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')

    def wait(condition) -> None:
        WebDriverWait(driver, args.timeout, poll_frequency=0.1).until(lambda d: condition())

    driver.get(url + "/")
    if args.api_key:
        wait(lambda: testid("api-key").is_displayed())
        testid("api-key").send_keys(args.api_key)
        testid("key-save").click()
    wait(lambda: testid("status").text.startswith("Ready"))
    if args.voice_clip:
        testid("voice-file").send_keys(str(args.voice_clip.resolve()))
        testid("voice-name").send_keys("narrator")
        testid("voice-text").send_keys(args.voice_text)
        testid("voice-add").click()
        wait(lambda: testid("status").text.startswith(("Voice narrator", "Error")))
    testid("text").send_keys(TEXT)
    testid("speak").click()
    wait(lambda: testid("status").text.startswith(("Done", "Error")))
    wait(lambda: driver.execute_script("return arguments[0].readyState >= 1", testid("audio")))
    driver.execute_script("document.activeElement.blur()")
    # the whole page, below the window's fold too
    shot = driver.execute_cdp_cmd("Page.captureScreenshot",
                                  {"format": "png", "captureBeyondViewport": True})  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(f".{args.output.name}.tmp")
    tmp.write_bytes(base64.b64decode(shot["data"]))
    tmp.replace(args.output)


if __name__ == "__main__":
    raise SystemExit(main())
